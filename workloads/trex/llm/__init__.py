"""Shared client for OpenAI-compatible chat endpoints (used by evaluation and the ORData reconstructor)."""

from trex.llm.client import ChatClient, ChatError, ChatResult, ChatTimeout, Usage

__all__ = ["ChatClient", "ChatError", "ChatResult", "ChatTimeout", "Usage"]
