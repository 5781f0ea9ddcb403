"""Meta-device initialisation: a model built on "meta" and distributed there is materialised shard by shard.

No rank ever holds a full parameter: each rank allocates its local shards (``to_empty``) and writes into
each the part of the layout-free initial value (trex.trainer.model.init) it holds, found from the DTensor's
placements. The result equals the single-process model's initial weights exactly, for every layout.
"""

from __future__ import annotations

from typing import Any

import torch

from trex.trainer.model.init import values
from trex.trainer.model.model import DeepSeekModel


def _on_dim(placement: Any, dim: int) -> Any:
    """``placement`` moved to dim 0 when it shards tensor dim ``dim``, else Replicate."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if isinstance(placement, _StridedShard):
        return _StridedShard(0, split_factor=placement.split_factor) if placement.dim == dim else Replicate()
    if isinstance(placement, Shard):
        return Shard(0) if placement.dim == dim else Replicate()
    if isinstance(placement, Replicate):
        return placement
    raise ValueError(f"cannot initialise a DTensor placed as {placement!r}")


def local_indices(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], list[torch.Tensor | None]]:
    """(the tensor this rank holds, the global shape, per dim the global indices held or None for all).

    The indices come from DTensor itself: a 1-D arange of each sharded dim, distributed with that dim's
    placements (no communication), yields exactly the positions of the local shard, strided ones included."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    if not isinstance(t, DTensor):
        return t, tuple(t.shape), [None] * t.dim()
    mesh = t.device_mesh
    index: list[torch.Tensor | None] = []
    for d, n in enumerate(t.shape):
        placements = [_on_dim(p, d) for p in t.placements]
        if all(isinstance(p, Replicate) for p in placements):
            index.append(None)
            continue
        positions = torch.arange(n, device=mesh.device_type)
        index.append(distribute_tensor(positions, mesh, placements, src_data_rank=None).to_local().cpu())
    return t.to_local(), tuple(t.shape), index


@torch.no_grad()
def materialize(model: DeepSeekModel, device: torch.device | str, seed: int) -> None:
    """Allocate ``model``'s (meta, possibly distributed) tensors on ``device`` and write their initial values."""
    model.to_empty(device=device)
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters()) | dict(model.named_buffers())
    for name, init in model.init_spec().items():
        local, shape, index = local_indices(tensors[name])
        local.copy_(values(init, name, seed, shape, local.dtype, index).to(local.device))

