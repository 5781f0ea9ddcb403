"""Comparing trainer states: parameters and both optimizers' states, by name."""

from __future__ import annotations

import torch


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Same names, Muon and AdamW states among them, and every tensor bit for bit equal."""
    assert sorted(a) == sorted(b)
    assert any(k.endswith("momentum_buffer") for k in a) and any(k.endswith("exp_avg_sq") for k in a)
    for k, v in a.items():
        assert torch.equal(v, b[k]), k
