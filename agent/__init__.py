"""inferwatch node agent: collectors, state, analytics and the API beside an LLM inference runtime."""

__version__ = "0.1.0"
