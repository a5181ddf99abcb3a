"""offline-agent: turn a small open LLM plus a tool-using environment into a better agent (Agent Q)."""

__version__ = "0.1.0"
