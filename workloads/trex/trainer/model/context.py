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

    def rope(self, theta: float, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [B, T, dim/2] at position_ids for base `theta`, computed once per forward."""
        key = (theta, dim)
        if key not in self.ropes:
            self.ropes[key] = rope_cos_sin(self.position_ids, dim, theta, dtype=self.cos.dtype)
        return self.ropes[key]
