"""The model the in-process rollout engine decodes with, for every parallel layout.

Decoding runs one token per forward and each data-parallel rank decodes its own prompts, so it must not
hold collectives per token:
- one process: the model itself;
- FSDP2 only (dp): every FSDP2 unit gathered once and kept gathered for the whole rollout (:func:`unsharded`);
- tensor / expert parallelism: a whole, plain copy of the model (:class:`DecodeReplica`), refreshed from the
  distributed parameters (DCP's full state dict: one gather per parameter) before each rollout. The tp ranks
  of one data-parallel rank hold the same batch: they split its samples, decode their share on the replica
  and exchange the results (:func:`shared_over`), so every tp rank trains on the same rollouts and none
  decodes them twice.
A replica costs one whole model in the model dtype per process: beyond small models, rollouts go to an
external engine (vLLM / SGLang, trex.trainer.rollout.external).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from trex.trainer.model.model import DeepSeekModel
from trex.trainer.parallel.mesh import ParallelDims

T = TypeVar("T")


def needs_replica(dims: ParallelDims) -> bool:
    """Whether decoding needs a whole copy of the model (tensor or expert parallelism), not just FSDP2 gathers."""
    return dims.parallel and dims.tp * dims.ep * dims.etp > 1


class DecodeReplica:
    """A plain (undistributed) model with the args of ``model``, holding its current weights after :meth:`refresh`."""

    def __init__(self, args: Any, device: torch.device, dtype: torch.dtype) -> None:
        from trex.trainer.model.model import build_model_from_args

        self.model = build_model_from_args(args, device=device, dtype=dtype)
        self.model.requires_grad_(False).eval()

    @torch.no_grad()
    def refresh(self, distributed: nn.Module) -> DeepSeekModel:
        """Copy the distributed model's weights and buffers in (a collective on every rank of the layout; fp32
        masters the swap optimizer holds in host memory are gathered from device copies)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from trex.trainer.optim.masters import held_masters, stored_on_device

        with stored_on_device(held_masters(distributed)):
            full = get_model_state_dict(distributed, options=StateDictOptions(full_state_dict=True))
        mine = self.model.state_dict()
        missing = sorted(set(mine) - set(full))
        if missing:
            raise RuntimeError(f"the distributed model has no {missing[:3]} (replica and model differ)")
        for name, t in mine.items():
            t.copy_(full[name])
        return self.model


@contextlib.contextmanager
def unsharded(model: nn.Module) -> Iterator[None]:
    """Every FSDP2 unit of ``model`` gathered, and kept gathered across forwards, inside the block (rollouts decode
    one token per forward: no all-gathers per token, and ranks need not decode in step); nothing in one process."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        yield
        return
    before = [reshards_after_forward(u) for u in units]
    for u in units:
        u.set_reshard_after_forward(False, recurse=False)
        u.unshard()
    try:
        yield
    finally:
        for u, b in zip(units, before, strict=True):
            u.reshard()
            u.set_reshard_after_forward(b, recurse=False)


def reshards_after_forward(unit: Any) -> bool:
    """Whether an FSDP2 unit frees its gathered parameters after each forward (FSDP2 keeps this per parameter group
    and has no public getter)."""
    groups = unit._get_fsdp_state()._fsdp_param_groups
    return any(g.post_forward_mesh_info is not None for g in groups)


@contextlib.contextmanager
def decoding(model: nn.Module, replica: DecodeReplica | None) -> Iterator[Any]:
    """The model to decode with inside the block: the replica refreshed from ``model`` when there is one, else
    ``model`` with its FSDP2 units gathered (or as it is, in one process)."""
    if replica is not None:
        yield replica.refresh(model)
        return
    with unsharded(model):
        yield model


def shared_over(group: Any, items: Sequence[T], work: Callable[[list[T]], list[Any]]) -> list[Any]:
    """``work(items)`` with the items split round-robin over ``group``'s ranks and the results exchanged, in the
    items' order, on every rank (None or a group of one: ``work(items)`` here)."""
    if group is None:
        return work(list(items))
    import torch.distributed as dist

    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if size == 1:
        return work(list(items))
    mine = work([it for i, it in enumerate(items) if i % size == rank])
    parts: list[Any] = [None] * size
    dist.all_gather_object(parts, mine, group=group)
    out: list[Any] = [None] * len(items)
    for r, part in enumerate(parts):
        for k, value in enumerate(part):
            out[r + k * size] = value
    return out
