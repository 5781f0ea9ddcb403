"""Gradient norm and clipping over distributed parameters: the global norm over every shard."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trex.trainer.model.layers import local_tensor


def global_grad_norm(params: Sequence[torch.Tensor]) -> float:
    """L2 norm of all gradients as one vector: DTensor gradients are grouped by (mesh, placements) so each
    group's norm is one reduction over the ranks that shard it (replicated dimensions count once)."""
    from torch.distributed.tensor import DTensor

    plain: list[torch.Tensor] = []
    groups: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            groups.setdefault((g.device_mesh, tuple(g.placements)), []).append(g)
        else:
            plain.append(g)
    total = torch.zeros((), dtype=torch.float64)
    if plain:
        total += torch.nn.utils.get_total_norm(plain).double().cpu() ** 2
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads)
        full = norm.full_tensor() if isinstance(norm, DTensor) else norm
        total += full.double().cpu() ** 2
    return float(total.sqrt())


def clip_grads(params: Sequence[torch.Tensor], max_norm: float) -> float:
    """Global norm before clipping; scales every gradient (shard) in place when max_norm > 0 and it exceeds it."""
    norm = global_grad_norm(params)
    if max_norm > 0 and norm > max_norm:
        coef = max_norm / (norm + 1e-6)
        grads = [local_tensor(p.grad) for p in params if p.grad is not None]
        torch._foreach_mul_(grads, coef)
    return norm
