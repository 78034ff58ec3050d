"""The engine: one vLLM server per trial (launchers, zygote, ``vllm serve`` as a module), its
start-up timing, the machine it runs on, and the dummy models tuner writes."""
