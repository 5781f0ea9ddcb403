"""The parallel layout: degrees from the config (pure), and one world DeviceMesh unflattened into its views.

Dense view (pp, dp_replicate, dp_shard, tp): attention, dense FFNs, embeddings, head and norms.
Folded MoE view (pp, edp, ep, etp) over the same ranks: routed experts (MoE parallel folding, as in
Megatron-Core). A third view (pp, dp_replicate, dp_shard_tp) shards the MoE layers' non-routed parameters
(router, shared experts): inside an MoE layer every rank holds different tokens, so those parameters
see data on dp_shard x tp ranks. The innermost dimension (tp, etp) is the one whose ranks are adjacent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from trex.trainer.config import TrainerConfig


@dataclass(frozen=True)
class ParallelDims:
    """Parallel degrees of one run; world = pp x dp x tp = pp x edp x ep x etp."""

    world: int
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    ep: int = 1
    etp: int = 1
    pp: int = 1

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
        dp = world // (p.tp * p.pp)
        return cls(world=world, dp_replicate=p.dp_replicate, dp_shard=dp // p.dp_replicate, tp=p.tp, ep=p.ep,
                   etp=p.etp, pp=p.pp)


@dataclass(frozen=True)
class Meshes:
    """The views of one world mesh (all share its root, so FSDP2 composes with DTensor placements)."""

    world: DeviceMesh
    dense: DeviceMesh
    """(pp, dp_replicate, dp_shard, tp)"""
    moe: DeviceMesh
    """(pp, edp, ep, etp)"""
    moe_dense: DeviceMesh
    """(pp, dp_replicate, dp_shard_tp)"""
    dp: DeviceMesh
    """dp_replicate x dp_shard flattened: the ranks that read different batches (loss and token sums)."""

    def fsdp_dense(self, dims: ParallelDims) -> DeviceMesh:
        """FSDP2 mesh of dense parameters: dp_shard, or (dp_replicate, dp_shard) for HSDP."""
        return self.dense["dp_replicate", "dp_shard"] if dims.dp_replicate > 1 else self.dense["dp_shard"]

    def fsdp_moe_dense(self, dims: ParallelDims) -> DeviceMesh:
        """FSDP2 mesh of the MoE layers' router and shared experts."""
        return (self.moe_dense["dp_replicate", "dp_shard_tp"] if dims.dp_replicate > 1
                else self.moe_dense["dp_shard_tp"])


def build_meshes(dims: ParallelDims, device_type: str) -> Meshes:
    """Unflatten one world mesh into the dense, MoE and MoE-dense views (needs an initialised process group)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = init_device_mesh(device_type, (dims.world,), mesh_dim_names=("world",))
    dense = world._unflatten(0, (dims.pp, dims.dp_replicate, dims.dp_shard, dims.tp),
                             ("pp", "dp_replicate", "dp_shard", "tp"))
    moe = world._unflatten(0, (dims.pp, dims.edp, dims.ep, dims.etp), ("pp", "edp", "ep", "etp"))
    moe_dense = world._unflatten(0, (dims.pp, dims.dp_replicate, dims.dp_shard * dims.tp),
                                 ("pp", "dp_replicate", "dp_shard_tp"))
    dp = dense["dp_replicate", "dp_shard"]._flatten("dp")
    return Meshes(world=world, dense=dense, moe=moe, moe_dense=moe_dense, dp=dp)


def dense_coordinates(dims: ParallelDims, rank: int) -> tuple[int, int]:
    """(data-parallel rank, tp rank) of ``rank`` in the dense view: which batch slice it reads."""
    per_stage = dims.dp * dims.tp
    r = rank % per_stage
    return r // dims.tp, r % dims.tp
