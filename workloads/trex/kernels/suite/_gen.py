"""Deterministic input generation shared by the suite modules."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def gen(seed: int) -> torch.Generator:
    """A CPU generator seeded for one input set."""
    import torch

    g = torch.Generator()
    g.manual_seed(seed)
    return g


def randn(shape: tuple[int, ...], dtype: str, seed_gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Normal samples in the activation dtype (bf16 values are exactly representable in float64)."""
    import torch

    t = torch.randn(shape, generator=seed_gen, dtype=torch.float32) * scale
    return t.to(torch.bfloat16) if dtype == "bf16" else t
