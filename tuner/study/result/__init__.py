"""What a study answers, and a run that gets it: the configuration it writes (``choice``), the
YAML file for ``vllm serve --config`` (``emit``) written whole (``written``), and the ``Run``
that calibrates, adds trials, confirms and writes it (``run``)."""
