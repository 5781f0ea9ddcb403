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


class EntrySet:
    """The compressed entries [B, S] the queries of a layer choose from, in sequence order (the indexer's tie rule
    and top-k depend on it): each one's window start position and document (-1: padding, never visible)."""

    def __init__(self, start: torch.Tensor, doc: torch.Tensor) -> None:
        self.start = start
        self.doc = doc

    def share(self, entries: list[torch.Tensor]) -> list[torch.Tensor]:
        """Entries [B, n, C] of the windows SequenceKeys.place was given -> [B, S, C] of these entries: here the
        same."""
        return entries

    def visible(self, position_ids: torch.Tensor, doc_ids: torch.Tensor, every: int) -> torch.Tensor:
        """[B, t, S]: entry s visible to query t (same document, query at or past the window's last position)."""
        same = self.doc[:, None, :] == doc_ids[:, :, None]
        return same & (position_ids[:, :, None] >= self.start[:, None, :] + every - 1)


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

    def extend(self, tensors: list[torch.Tensor], reaches: list[int]) -> list[torch.Tensor]:
        """Per-token tensors [B, t, ...] of the layer's tokens -> [B, u, ...] each: the layer's tokens and, before
        each run of them, the ``reach`` tokens (its entry of ``reaches``) of the sequence that other parts hold,
        in sequence order (extended_indices; gradients flow back to the tokens' owners). Here the layer's
        tokens are the whole sequences and nothing precedes them: the tensors themselves."""
        return tensors

    def extended_indices(self, t: int, reach: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(index in its whole sequence [u] of each token :meth:`extend` gives for ``reach``, whether the layer
        holds it [u])."""
        idx = torch.arange(t, device=device)
        return idx, torch.ones_like(idx, dtype=torch.bool)

    def place(self, owned: torch.Tensor, last: torch.Tensor, start: torch.Tensor, doc: torch.Tensor) -> EntrySet:
        """The compressed entries of the whole sequences, from the windows [B, n] the layer pooled: ``owned``
        the windows it forms for everyone (the others are another part's or never visible), ``last`` the index
        of each window's last token, ``start`` its first position, ``doc`` its document (-1: padding). Here the
        layer pooled every window: they are the entries, in sequence order."""
        return EntrySet(start, doc)

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
    """The model's SequenceKeys (V4 attention reads its window's halo and the whole sequences' compressed entries
    through it)."""
    memo: dict[tuple[object, ...], object] = field(default_factory=dict)
    """Per-forward results the layers share (extended tokens per reach, compressed-entry layouts per window)."""

    def extended(self, reach: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(index in the whole sequence [u], held here [u], positions [B, u], documents [B, u]) of the tokens
        SequenceKeys.extend gives for ``reach`` (document 0 everywhere without doc_ids), once per forward."""
        key = ("extended", reach)
        if key not in self.memo:
            doc = self.doc_ids if self.doc_ids is not None else torch.zeros_like(self.position_ids)
            pos, doc = self.keys.extend([self.position_ids, doc], [reach, reach])
            idx, held = self.keys.extended_indices(self.position_ids.shape[1], reach, self.position_ids.device)
            self.memo[key] = (idx, held, pos, doc)
        out = self.memo[key]
        assert isinstance(out, tuple)
        return out

    def rope(self, theta: float, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [B, T, dim/2] at position_ids for base `theta`, computed once per forward."""
        key = (theta, dim)
        if key not in self.ropes:
            self.ropes[key] = rope_cos_sin(self.position_ids, dim, theta, dtype=self.cos.dtype)
        return self.ropes[key]
