"""Any OpenAI-compatible endpoint (vLLM, SGLang, TGI, OpenAI) through :class:`trex.llm.ChatClient`."""

from __future__ import annotations

from trex.llm.client import ChatClient, ChatResult
from trex.verify.items import Item


class OpenAIModel:
    """Pinned sampling; sample i of an item uses seed + i so k > 1 samples differ but rerun identically."""

    splits_reasoning = True
    """Servers with a reasoning parser return only the answer as content (see trex.reasoning.answer_of)."""

    def __init__(self, client: ChatClient) -> None:
        self.client = client
        self.name = f"openai:{client.model}"

    async def generate(self, messages: list[dict[str, str]], *, item: Item, sample_index: int) -> ChatResult:
        """One completion."""
        seed = None if self.client.seed is None else self.client.seed + sample_index
        return await self.client.complete(messages, seed=seed)

    async def aclose(self) -> None:
        """Close the HTTP session."""
        await self.client.aclose()
