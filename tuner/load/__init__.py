"""Load: replaying requests against a server over HTTP (open loop, closed loop), the prompts
they carry, and what is measured (client timings and vLLM's ``/metrics``). The only
asynchronous code in tuner."""
