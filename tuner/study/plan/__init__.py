"""The study's plan: its spec file, read and checked (``spec``), the search space tuner offers
when a spec names none (``space``), and which engine arguments change vLLM's compile key."""
