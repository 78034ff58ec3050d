"""One trial: its configuration started, measured on the replay window (``trial``) or by a search
of rates (``capacity``, ``rates``), scored against the SLOs (``scoring``), as its study's
objective asks (``objective``); the record it keeps on the study (``record``) and what its
figures say (``next_steps``, ``capacity_text``)."""
