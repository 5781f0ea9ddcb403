"""Batched token sampling: temperature, top-k, top-p, with one uniform draw per (seed, sample, position).

The draw is a counter-based hash, not a generator's stream, so a token depends only on its logits and
(seed, sample id, position in the response): a rollout resumed from its log, or a sample decoded in
another batch, draws exactly the numbers an uninterrupted run draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trex.trainer.model.layers import upcast

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. temperature 0 is greedy (argmax); top_k 0 and top_p 1 are off. A response
    ends at a stop token (kept as its last token) or after max_new_tokens."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(t < 0 for t in self.stop_tokens):
            raise ValueError(f"stop_tokens must be token ids >= 0, got {list(self.stop_tokens)}")


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def uniform(seed: int, sample_id: int, position: int) -> float:
    """A uniform draw in [0, 1) that depends only on (seed, sample id, position)."""
    h = _splitmix64(_splitmix64(_splitmix64(seed & _MASK64) ^ (sample_id & _MASK64)) ^ (position & _MASK64))
    return (h >> 11) * 2.0**-53


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [B, V] with everything outside the top_k and the top_p nucleus set to -inf (the most
    likely token always stays; ties keep the lower token id)."""
    order = logits.sort(dim=-1, descending=True, stable=True)
    keep = torch.ones_like(logits, dtype=torch.bool)
    if top_k > 0:
        keep &= torch.arange(logits.shape[-1], device=logits.device) < top_k
    if top_p < 1:
        probs = torch.softmax(order.values, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the more likely tokens
        keep &= before < top_p
    keep[:, 0] = True
    mask = torch.zeros_like(keep).scatter(1, order.indices, keep)
    return logits.masked_fill(~mask, float("-inf"))


def sample(logits: torch.Tensor, params: SamplingParams, draws: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from logits [B, V] and the rows' uniform draws: (tokens [B] long, behaviour
    log-probs [B] float64). The log-prob is the token's under the temperature-scaled policy,
    log_softmax(logits / temperature) (plain log_softmax when greedy), before top-k / top-p: the value a
    trainer recomputes from the same logits."""
    x = upcast(logits).double()
    if params.temperature == 0:
        tokens = x.argmax(dim=-1)
        return tokens, torch.log_softmax(x, dim=-1).gather(1, tokens[:, None])[:, 0]
    scaled = x / params.temperature
    probs = torch.softmax(filter_logits(scaled, params.top_k, params.top_p), dim=-1)
    cdf = probs.cumsum(dim=-1)
    u = torch.tensor(list(draws), dtype=cdf.dtype, device=cdf.device)[:, None] * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True)[:, 0].clamp(max=x.shape[-1] - 1)
    return tokens, torch.log_softmax(scaled, dim=-1).gather(1, tokens[:, None])[:, 0]
