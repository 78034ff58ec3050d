"""tuner: tune a real vLLM engine against a replayed production trace."""

# Moves with each release; CHANGELOG.md has a section per release, and git a tag `vX.Y.Z`.
__version__ = "0.2.0"
