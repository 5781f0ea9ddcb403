"""Comparing trainer states: parameters and both optimizers' states, by name."""

from __future__ import annotations

import torch
from trex.trainer.optim.swap import SwapOptimizers


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Same names, Muon and AdamW states among them, and every tensor bit for bit equal."""
    assert sorted(a) == sorted(b)
    assert any(k.endswith("momentum_buffer") for k in a) and any(k.endswith("exp_avg_sq") for k in a)
    for k, v in a.items():
        assert torch.equal(v, b[k]), k


class InPlaceSwap(SwapOptimizers):
    """The swap optimizer's buckets stepped where the states are (no copies; masters stay on the device): what the
    swapped runs must equal bucket for bucket."""

    def step(self) -> None:
        with torch.no_grad():
            for bucket in self.buckets:
                self._step_bucket(bucket)


def full_copy(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective) or a plain tensor, detached on the CPU."""
    full = getattr(t, "full_tensor", None)
    return (full() if callable(full) else t).detach().cpu().clone()
