"""Distributed Muon: Newton-Schulz needs whole matrices, the parameters are sharded DTensors.

A matrix's shards live on the ranks of its DTensor mesh. Ranks that differ only on mesh dimensions that
replicate it (HSDP replicas), or that split a stack of experts along the expert dimension, need nothing
from each other, so each "shard group" (the ranks whose shards together make one whole block: a matrix,
or the experts a group holds) is handled on its own. A group of one rank (experts sharded on the expert
dimension only) orthogonalises locally with no communication.

``owner`` mode gives every other block one owner rank in its group, balancing the Newton-Schulz cost
(batch x n x m x min(n, m)) greedily over ranks; one packed all_to_all over the world sends every shard to
its block's owner, the owners run Newton-Schulz batched by shape, and one packed all_to_all sends every
shard of the result back. ``gather`` mode is the reference: every rank all-gathers every matrix and
orthogonalises all of them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from trex.trainer.optim.muon import orthogonalize_batched

Box = tuple[tuple[int, ...], tuple[int, ...]]
"""(shape, global offset) of one rank's shard."""


@dataclass(frozen=True)
class Block:
    """One shard group's block of a parameter: its members' boxes (global rank -> box) and owner."""

    param: int
    members: dict[int, Box]
    owner: int
    offset: tuple[int, ...]
    shape: tuple[int, ...]


@dataclass
class Plan:
    """Who sends which shard where, for one list of parameters (the same on every rank)."""

    blocks: list[Block] = field(default_factory=list)
    load: dict[int, float] = field(default_factory=dict)


def _mesh_boxes(shape: Sequence[int], mesh: Any, placements: Sequence[Any]) -> dict[tuple[int, ...], tuple[int, Box]]:
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    ranks = mesh.mesh
    out: dict[tuple[int, ...], tuple[int, Box]] = {}
    for coord in itertools.product(*(range(n) for n in ranks.shape)):
        local, offset = _compute_local_shape_and_global_offset(list(shape), list(ranks.shape), list(coord), placements)
        out[coord] = (int(ranks[coord]), (tuple(local), tuple(offset)))
    return out


def _independent(placement: Any, ndim: int) -> bool:
    """A mesh dimension whose ranks need nothing from each other: replicas, or experts split by expert."""
    if placement.is_replicate():
        return True
    return bool(ndim == 3 and placement.is_shard() and getattr(placement, "dim", -1) == 0)


def _cost(shape: Sequence[int]) -> float:
    n, m = shape[-2], shape[-1]
    batch = 1
    for d in shape[:-2]:
        batch *= d
    return float(batch * n * m * min(n, m))


def local_groups(params: Sequence[Any]) -> list[tuple[int, dict[int, Box]]]:
    """(parameter index, members' boxes) of every shard group this rank can see (its DTensor meshes)."""
    out: list[tuple[int, dict[int, Box]]] = []
    for i, p in enumerate(params):
        mesh, placements, shape = p.device_mesh, p.placements, tuple(p.shape)
        keep = [d for d, pl in enumerate(placements) if _independent(pl, len(shape))]
        groups: dict[tuple[int, ...], dict[int, Box]] = {}
        for coord, (rank, box) in _mesh_boxes(shape, mesh, placements).items():
            groups.setdefault(tuple(coord[d] for d in keep), {})[rank] = box
        out.extend((i, members) for members in groups.values())
    return out


Candidate = tuple[int, tuple[int, ...], float]
"""(parameter index, member ranks, Newton-Schulz cost) of one block."""


def assign_owners(candidates: Sequence[Candidate]) -> tuple[dict[tuple[int, tuple[int, ...]], int], dict[int, float]]:
    """Greedy balance (largest cost first, to the least-loaded member); deterministic in the candidate set."""
    owners: dict[tuple[int, tuple[int, ...]], int] = {}
    load: dict[int, float] = {}
    for i, members, cost in sorted(set(candidates), key=lambda c: (-c[2], c[0], c[1])):
        owner = min(members, key=lambda r: (load.get(r, 0.0), r))
        load[owner] = load.get(owner, 0.0) + cost
        owners[(i, members)] = owner
    return owners, load


def plan_blocks(params: Sequence[Any], union: Callable[[list[Candidate]], list[Candidate]] | None = None) -> Plan:
    """Shard groups and owners of every DTensor parameter. A parameter replicated over ranks outside its mesh
    (a dense weight on a dp mesh, copied over tp) has groups this rank cannot see; ``union`` merges every
    rank's candidates (an all-gather) so that all ranks balance the same set and agree on every owner."""
    groups = local_groups(params)
    mine = [(i, tuple(sorted(m)), _cost(next(iter(m.values()))[0]) * len(m)) for i, m in groups]
    owners, load = assign_owners(union(mine) if union is not None else mine)
    plan = Plan(load=load)
    for i, members in groups:
        ndim = len(params[i].shape)
        lo = tuple(min(b[1][d] for b in members.values()) for d in range(ndim))
        hi = tuple(max(b[1][d] + b[0][d] for b in members.values()) for d in range(ndim))
        plan.blocks.append(Block(i, members, owners[(i, tuple(sorted(members)))], lo,
                                 tuple(h - o for h, o in zip(hi, lo, strict=True))))
    plan.blocks.sort(key=lambda b: (b.param, min(b.members)))
    return plan


def _slices(box: Box, origin: Sequence[int]) -> tuple[slice, ...]:
    shape, offset = box
    return tuple(slice(o - g, o - g + n) for n, o, g in zip(shape, offset, origin, strict=True))


class ShardedOrthogonalize:
    """Muon's ``orthogonalize`` for DTensor parameters (``mode`` owner or gather); plain tensors stay local."""

    def __init__(self, mode: str = "owner", group: Any = None) -> None:
        if mode not in ("owner", "gather"):
            raise ValueError(f"optimizer.muon.distributed must be 'owner' or 'gather', got {mode!r}")
        self.mode = mode
        self.group = group
        self._plans: dict[tuple[int, ...], Plan] = {}
        self.bytes_sent = 0
        """Bytes this rank sent to other ranks for Newton-Schulz (both exchanges, all steps)."""

    def __call__(self, params: Sequence[Tensor], updates: list[Tensor], ns: Callable[[Tensor], Tensor]) -> list[Tensor]:
        from torch.distributed.tensor import DTensor

        out: list[Tensor | None] = [None] * len(params)
        local = [i for i, p in enumerate(params) if not isinstance(p, DTensor)]
        for i, o in zip(local, orthogonalize_batched([updates[i] for i in local], ns) if local else [], strict=True):
            out[i] = o
        dist_idx = [i for i, p in enumerate(params) if isinstance(p, DTensor)]
        if dist_idx:
            sub_p = [params[i] for i in dist_idx]
            sub_u = [updates[i] for i in dist_idx]
            res = self._gather(sub_p, sub_u, ns) if self.mode == "gather" else self._owner(sub_p, sub_u, ns)
            for i, o in zip(dist_idx, res, strict=True):
                out[i] = o
        return [o for o in out if o is not None]

    # --- reference: every rank gathers every matrix -------------------------------------------------
    def _gather(self, params: Sequence[Any], updates: list[Tensor], ns: Callable[[Tensor], Tensor]) -> list[Tensor]:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        full = [DTensor.from_local(u, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                   stride=p.stride()).full_tensor() for p, u in zip(params, updates, strict=True)]
        ortho = orthogonalize_batched(full, ns)
        out = []
        for p, o in zip(params, ortho, strict=True):
            box = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
            out.append(o[_slices((tuple(box[0]), tuple(box[1])), [0] * o.ndim)].contiguous())
        return out

    # --- owner mode: one packed all_to_all there, one back -------------------------------------------
    def _owner(self, params: Sequence[Any], updates: list[Tensor], ns: Callable[[Tensor], Tensor]) -> list[Tensor]:
        import torch.distributed as dist

        key = tuple(id(p) for p in params)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = plan_blocks(params, self._union)
        me, world = dist.get_rank(), dist.get_world_size()
        dtype = updates[0].dtype
        for u in updates[1:]:
            dtype = torch.promote_types(dtype, u.dtype)
        dev = updates[0].device
        # Every rank's shard of every block goes to the block's owner, in plan order.
        send: list[list[Tensor]] = [[] for _ in range(world)]
        recv_sizes = [0] * world
        for b in plan.blocks:
            if me in b.members:
                u = updates[b.param]
                if tuple(u.shape) != b.members[me][0]:
                    raise RuntimeError(f"distributed Muon: parameter {b.param} has a local shard of shape "
                                       f"{tuple(u.shape)}, its placements say {b.members[me][0]}")
                send[b.owner].append(u.reshape(-1).to(dtype))
            if b.owner == me:
                for r, box in b.members.items():
                    recv_sizes[r] += _numel(box[0])
        received = self._exchange(send, recv_sizes, dtype, dev)
        # Owners assemble their blocks and orthogonalise them batched by shape.
        cursor = [0] * world
        owned: list[tuple[Block, Tensor]] = []
        for b in plan.blocks:
            if b.owner != me:
                continue
            block = torch.zeros(b.shape, dtype=dtype, device=dev)
            for r in sorted(b.members):
                box = b.members[r]
                n = _numel(box[0])
                block[_slices(box, b.offset)] = received[r][cursor[r]:cursor[r] + n].view(box[0])
                cursor[r] += n
            owned.append((b, block))
        ortho = orthogonalize_batched([blk for _, blk in owned], ns) if owned else []
        # Every member gets its shard of the result back.
        back: list[list[Tensor]] = [[] for _ in range(world)]
        for (b, _), o in zip(owned, ortho, strict=True):
            for r in sorted(b.members):
                back[r].append(o[_slices(b.members[r], b.offset)].reshape(-1))
        sizes_back = [0] * world
        for b in plan.blocks:
            if me in b.members:
                sizes_back[b.owner] += _numel(b.members[me][0])
        returned = self._exchange(back, sizes_back, dtype, dev)
        out: list[Tensor | None] = [None] * len(params)
        cursor = [0] * world
        for b in plan.blocks:
            if me in b.members:
                shape = b.members[me][0]
                n = _numel(shape)
                out[b.param] = returned[b.owner][cursor[b.owner]:cursor[b.owner] + n].view(shape).to(updates[b.param].dtype)
                cursor[b.owner] += n
        return [o if o is not None else torch.zeros_like(u) for o, u in zip(out, updates, strict=True)]

    def _union(self, mine: list[Candidate]) -> list[Candidate]:
        import torch.distributed as dist

        every: list[list[Candidate] | None] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(every, mine, group=self.group)
        return [c for cands in every if cands for c in cands]

    def _exchange(self, send: list[list[Tensor]], recv_sizes: list[int], dtype: torch.dtype,
                  dev: torch.device) -> list[Tensor]:
        """One all_to_all_single of per-destination flat buffers; returns the per-source received buffers."""
        import torch.distributed as dist

        me = dist.get_rank()
        flat = [torch.cat(parts) if parts else torch.zeros(0, dtype=dtype, device=dev) for parts in send]
        in_splits = [int(f.numel()) for f in flat]
        out = torch.empty(sum(recv_sizes), dtype=dtype, device=dev)
        dist.all_to_all_single(out, torch.cat(flat), output_split_sizes=recv_sizes, input_split_sizes=in_splits,
                               group=self.group)
        self.bytes_sent += (sum(in_splits) - in_splits[me]) * out.element_size()
        return list(torch.split(out, recv_sizes))


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
