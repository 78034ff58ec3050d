"""tuner: tune a real vLLM engine against a replayed production trace."""

__version__ = "0.1.0"
