"""Load: replaying a window's requests against a server over HTTP, in one session whichever way
they are sent (open loop, closed loop, spread over client processes), the prompts they carry, and
what is measured (client timings and vLLM's ``/metrics``). The only asynchronous code in tuner."""
