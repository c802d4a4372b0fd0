"""extproc: an LLM gateway as an Envoy external processor."""

__version__ = "0.1.0"
