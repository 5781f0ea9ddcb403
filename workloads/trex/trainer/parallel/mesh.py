"""The parallel layout: degrees from the config (pure), and one world DeviceMesh unflattened into its views.

Dense view (pp, dp_replicate, dp_shard, cp, tp): attention, dense FFNs, embeddings, head and norms; cp ranks
hold different chunks of the same sequences (trex.trainer.parallel.context), so dense parameters are sharded
(FSDP2) and their gradients summed over dp_shard x cp.
Folded MoE view (pp, edp, ep, etp) over the same ranks: routed experts (MoE parallel folding, as in
Megatron-Core). A third view (pp, dp_replicate, dp_shard_tp) shards the MoE layers' non-routed parameters
(router, shared experts): inside an MoE layer every rank holds different tokens, so those parameters
see data on dp_shard x cp x tp ranks; for expert routing cp counts as data (as Megatron-Core folds it). The innermost dimension (tp, etp) is the one whose ranks are adjacent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from trex.trainer.config import TrainerConfig


@dataclass(frozen=True)
class ParallelDims:
    """Parallel degrees of one run; world = pp x dp x cp x tp = pp x edp x ep x etp."""

    world: int
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    ep: int = 1
    etp: int = 1
    pp: int = 1
    cp: int = 1

    @property
    def dp(self) -> int:
        """Data-parallel degree of the dense view (distinct batches)."""
        return self.dp_replicate * self.dp_shard

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: ranks that hold the same routed-expert shard."""
        return self.world // (self.pp * self.ep * self.etp)

    @property
    def parallel(self) -> bool:
        """More than one rank: parameters are distributed (FSDP2 and friends)."""
        return self.world > 1

    @classmethod
    def from_config(cls, cfg: TrainerConfig, world: int) -> ParallelDims:
        """Degrees for ``world`` ranks: arithmetic only (trex.trainer.rules.job_problems says whether they fold)."""
        p = cfg.parallelism
        dp = world // (p.tp * p.pp * p.cp)
        return cls(world=world, dp_replicate=p.dp_replicate, dp_shard=dp // p.dp_replicate, tp=p.tp, ep=p.ep,
                   etp=p.etp, pp=p.pp, cp=p.cp)


@dataclass(frozen=True)
class Meshes:
    """The views of one world mesh (all share its root, so FSDP2 composes with DTensor placements)."""

    world: DeviceMesh
    dense: DeviceMesh
    """(pp, dp_replicate, dp_shard, cp, tp)"""
    moe: DeviceMesh
    """(pp, edp, ep, etp)"""
    moe_dense: DeviceMesh
    """(pp, dp_replicate, dp_shard_tp): dp_shard_tp is dp_shard x cp x tp."""
    dp: DeviceMesh
    """dp_replicate x dp_shard x cp flattened: the ranks that hold different tokens (loss and token sums)."""
    dense_cp: DeviceMesh | None = None
    """(pp, dp_replicate, dp_shard_cp, tp) under cp > 1: the dense parameters' FSDP2 view (None: cp = 1)."""

    def fsdp_dense(self, dims: ParallelDims) -> DeviceMesh:
        """FSDP2 mesh of dense parameters: dp_shard (x cp), or (dp_replicate, dp_shard (x cp)) for HSDP."""
        if self.dense_cp is not None:
            view, shard = self.dense_cp, "dp_shard_cp"
        else:
            view, shard = self.dense, "dp_shard"
        return view["dp_replicate", shard] if dims.dp_replicate > 1 else view[shard]

    def fsdp_moe_dense(self, dims: ParallelDims) -> DeviceMesh:
        """FSDP2 mesh of the MoE layers' router and shared experts."""
        return (self.moe_dense["dp_replicate", "dp_shard_tp"] if dims.dp_replicate > 1
                else self.moe_dense["dp_shard_tp"])


def build_meshes(dims: ParallelDims, device_type: str) -> Meshes:
    """Unflatten one world mesh into the dense, MoE and MoE-dense views (needs an initialised process group)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = init_device_mesh(device_type, (dims.world,), mesh_dim_names=("world",))
    dense = world._unflatten(0, (dims.pp, dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp),
                             ("pp", "dp_replicate", "dp_shard", "cp", "tp"))
    moe = world._unflatten(0, (dims.pp, dims.edp, dims.ep, dims.etp), ("pp", "edp", "ep", "etp"))
    moe_dense = world._unflatten(0, (dims.pp, dims.dp_replicate, dims.dp_shard * dims.cp * dims.tp),
                                 ("pp", "dp_replicate", "dp_shard_tp"))
    dp = dense["dp_replicate", "dp_shard", "cp"]._flatten("dp")
    dense_cp = None
    if dims.cp > 1:
        dense_cp = world._unflatten(0, (dims.pp, dims.dp_replicate, dims.dp_shard * dims.cp, dims.tp),
                                    ("pp", "dp_replicate", "dp_shard_cp", "tp"))
    return Meshes(world=world, dense=dense, moe=moe, moe_dense=moe_dense, dp=dp, dense_cp=dense_cp)


def dense_coordinates(dims: ParallelDims, rank: int) -> tuple[int, int]:
    """(data-parallel rank, tp rank) of ``rank`` in the dense view: which batch slice it reads."""
    per_stage = dims.dp * dims.cp * dims.tp
    r = rank % per_stage
    return r // (dims.cp * dims.tp), r % dims.tp


def context_coordinate(dims: ParallelDims, rank: int) -> int:
    """The cp rank of ``rank`` in the dense view: which chunks of its sequences it holds."""
    return rank // dims.tp % dims.cp
