"""The engine: one vLLM server process per trial (launchers, zygote), its start-up timing, the
machine it runs on, and the dummy models tuner writes."""
