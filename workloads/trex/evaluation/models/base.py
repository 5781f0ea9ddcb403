"""The interface every model under evaluation implements."""

from __future__ import annotations

from typing import Protocol

from trex.llm.client import ChatResult
from trex.verify.items import Item


class Model(Protocol):
    """Answers chat messages; ``item`` and ``sample_index`` let models pin per-sample seeds."""

    name: str
    """Identifier recorded in every sample and the summary."""

    async def generate(self, messages: list[dict[str, str]], *, item: Item, sample_index: int) -> ChatResult:
        """One response for ``messages``."""
        ...

    async def aclose(self) -> None:
        """Release connections or device memory."""
        ...
