"""One trial: its configuration started and measured on the replay window (``trial``), judged
(``judge``) and scored against the SLOs (``scoring``); where its time went (``time_spent``) and
what to try when nothing met the SLOs (``next_steps``)."""
