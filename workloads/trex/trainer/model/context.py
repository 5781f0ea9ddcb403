"""The per-forward inputs every attention layer shares (AttnContext) and the decoding cache's interface.

They sit below both attention modules (`attention` for mla, `v4attention` for sliding / csa / hca),
so that `attention.build_attention` can construct either kind without the two importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from trex.trainer.model.layers import causal_doc_mask, rope_cos_sin


class AttentionCache(Protocol):
    """Incremental-decoding state an attention layer hands its work to (trex.trainer.rollout.cache)."""

    def attend(self, module: nn.Module, x: torch.Tensor, ctx: AttnContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's (output [B, T, D], auxiliary loss) for the new tokens x, updating the layer's state."""
        ...

    def positions(self, t: int) -> torch.Tensor:
        """Positions [B, t] of the next t tokens of every row (each row continues its own length)."""
        ...

    def advance(self, t: int) -> None:
        """Every layer has taken the t new tokens: the rows' lengths grow by t."""
        ...


class SequenceKeys:
    """Which keys an attention layer's queries see: the layer's own tokens (one process, every layout without
    context parallelism). trex.trainer.parallel.context replaces it on the model to gather the keys of the
    sequences' other chunks over the ranks that hold them."""

    gather: Callable[[torch.Tensor], torch.Tensor] | None = None
    """Per-token key tensors [B, T, C] -> [B, S, C] of every key (None: the layer's own tokens)."""

    def mask(self, doc_ids: torch.Tensor | None, b: int, t: int, device: torch.device) -> torch.Tensor | None:
        """Boolean [B, 1, t, S] causal per-document mask of the queries over the keys (None: plain causal)."""
        return causal_doc_mask(doc_ids, b, t, device) if doc_ids is not None else None

    def shift(self, ids: torch.Tensor, s: int) -> torch.Tensor:
        """The token ``s`` places later in each sequence at every position [B, t] (0 past the end): an MTP
        module's input."""
        out = torch.zeros_like(ids)
        out[:, : ids.shape[1] - s] = ids[:, s:]
        return out

    def whole(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per-token tensors [B, t, ...] of the layer's tokens -> [B, T, ...] of the whole sequences, in sequence
        order (gradients flow back to the tokens' owners): here the layer's tokens are the whole sequences."""
        return tensors

    def indices(self, t: int, device: torch.device) -> torch.Tensor:
        """The index [t] of each of the layer's tokens in its whole sequence."""
        return torch.arange(t, device=device)

    def total(self, x: torch.Tensor) -> torch.Tensor:
        """A count (no gradient) of the layer's tokens summed over every part of the sequences."""
        return x


@dataclass
class AttnContext:
    """Per-forward inputs shared by every attention layer."""

    position_ids: torch.Tensor  # [B, T] long, restarting per document
    doc_ids: torch.Tensor | None  # [B, T] or None (one document per row)
    cos: torch.Tensor  # [B, T, rope/2]
    sin: torch.Tensor
    mask: torch.Tensor | None = None
    """causal_doc_mask(doc_ids) [B, 1, T, T], built once per forward and shared by every mla layer
    (None: each layer builds it from doc_ids)."""
    ropes: dict[tuple[float, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None
    """SequenceKeys.gather of the model (None: keys are the layer's own tokens)."""
    cache: AttentionCache | None = None
    """Decoding only: the KV cache every attention layer delegates to (None: a plain full forward)."""
    keys: SequenceKeys = field(default_factory=SequenceKeys)
    """The model's SequenceKeys (V4 attention reads the whole sequences' per-token entries through it)."""
    ids: tuple[torch.Tensor, torch.Tensor] | None = None
    """sequence_ids' cache."""

    def sequence_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(position ids, document ids) [B, S] of the whole sequences the keys come from (document 0 everywhere
        without doc_ids), computed once per forward."""
        if self.ids is None:
            doc = self.doc_ids if self.doc_ids is not None else torch.zeros_like(self.position_ids)
            pos_all, doc_all = self.keys.whole([self.position_ids, doc])
            self.ids = (pos_all, doc_all)
        return self.ids

    def rope(self, theta: float, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [B, T, dim/2] at position_ids for base `theta`, computed once per forward."""
        key = (theta, dim)
        if key not in self.ropes:
            self.ropes[key] = rope_cos_sin(self.position_ids, dim, theta, dtype=self.cos.dtype)
        return self.ropes[key]
