"""Construction of one run from its config and world: layout (meshes) -> model -> parallelize -> optimizers,
and the checkpointer. The loop (trex.trainer.loop) only runs steps on what this builds.

A distributed model is built on the meta device, distributed there and then materialised shard by shard
(trex.trainer.parallel.init), so no rank ever holds the whole model; its initial weights equal the
single-process model's for the same seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trex.runtime.device import DeviceInfo, fast_bf16, torch_dtype
from trex.trainer.checkpoint import CheckpointManager, config_hash
from trex.trainer.config import TrainerConfig
from trex.trainer.model.model import DeepSeekModel
from trex.trainer.model_args import ModelArgs
from trex.trainer.optim.build import Optimizers, build_optimizers, resolve_ns_dtype
from trex.trainer.optim.swap import with_swap
from trex.trainer.parallel.mesh import Meshes, ParallelDims


@dataclass
class Layout:
    """The parallel layout of one run: degrees, meshes and the groups the loop uses (None in one process)."""

    dims: ParallelDims
    meshes: Meshes | None
    dp_group: Any
    """The ranks holding different tokens, dp x cp (the loss and token counts are summed over it)."""
    muon_group: Any
    """Distributed Muon's own group (FSDP2 may still have reductions in flight on groups over the same ranks)."""


@dataclass
class Built:
    """The model and its optimizers, distributed by ``layout``."""

    model: DeepSeekModel
    opts: Optimizers
    parallel: Any
    """trex.trainer.parallel.parallelize.Parallelized (the token dispatchers) or None in one process."""


def build_layout(dims: ParallelDims, world: int, device_kind: str) -> Layout:
    """The meshes and groups for ``dims`` (a collective on every rank of the world; nothing in one process)."""
    if not dims.parallel:
        return Layout(dims, None, None, None)
    import torch.distributed as dist

    from trex.trainer.parallel.mesh import build_meshes

    meshes = build_meshes(dims, device_kind)
    return Layout(dims, meshes, meshes.dp.get_group(), dist.new_group(list(range(world))))


def ns_dtype(cfg: TrainerConfig, device_kind: str) -> torch.dtype:
    """Newton-Schulz dtype of Muon's leading stages (fp64 for fp64 reference models)."""
    if cfg.model.dtype == "fp64":
        return torch.float64
    return resolve_ns_dtype(cfg.optimizer.muon.ns_dtype, fast_bf16(device_kind))


def build_model_and_optimizers(cfg: TrainerConfig, device: DeviceInfo, layout: Layout) -> Built:
    """A freshly initialised model (seeded by cfg.seed) distributed by ``layout`` with trainer.recompute applied,
    and Muon + AdamW for it (inside the swap optimizer when optimizer.swap is on)."""
    from trex.trainer.model import build_model
    from trex.trainer.parallel.recompute import apply_recompute

    dtype = torch_dtype(cfg.model.dtype)
    if layout.meshes is None:
        model = build_model(cfg.model, device=device.torch_device(), dtype=dtype, seed=cfg.seed)
        apply_recompute(model, cfg.recompute)
        offload_activations(model, cfg)
        opts = build_optimizers(model, dict(model.param_roles()), cfg.optimizer, ns_dtype=ns_dtype(cfg, device.kind))
        return Built(model, with_swap(opts, cfg.optimizer.swap, device.kind, model=model), None)
    from trex.trainer.parallel.muon import ShardedOrthogonalize

    model, parallel = distributed_model(cfg.model.args, layout.dims, layout.meshes, dtype,
                                        device.torch_device(), cfg.seed,
                                        reshard_after_forward=cfg.parallelism.reshard_after_forward,
                                        recompute=cfg.recompute)
    offload_activations(model, cfg)
    opts = build_optimizers(model, dict(model.param_roles()), cfg.optimizer, ns_dtype=ns_dtype(cfg, device.kind))
    if opts.muon is not None:
        opts.muon.orthogonalize = ShardedOrthogonalize(cfg.optimizer.muon.distributed, layout.muon_group)
    return Built(model, with_swap(opts, cfg.optimizer.swap, device.kind, model=model), parallel)


def offload_activations(model: DeepSeekModel, cfg: TrainerConfig) -> None:
    """trainer.activationOffload: the block inputs full recompute keeps go to host memory (after recompute and,
    when distributed, after FSDP2 wrapped the blocks: the offload wraps the checkpointed forward)."""
    if cfg.activation_offload:
        from trex.trainer.parallel.offload import apply_activation_offload

        apply_activation_offload(model, cfg.recompute)


def distributed_model(args: ModelArgs, dims: ParallelDims, meshes: Meshes, dtype: torch.dtype, device: torch.device,
                      seed: int, *, reshard_after_forward: bool = True, recompute: str = "none",
                      frozen: bool = False) -> tuple[DeepSeekModel, Any]:
    """A model of shape ``args`` built on the meta device, distributed by ``layout`` (trex.trainer.parallel) and
    materialised shard by shard with the seed's initial values. Sharded bf16 parameters of a trained model are fp32
    masters; FSDP2 gathers them in ``dtype`` for compute. A ``frozen`` model (opd's teachers) is stored in ``dtype``
    itself: nothing updates it, so it needs no masters. Returns the model and its Parallelized."""
    from trex.trainer.model.model import build_model_from_args
    from trex.trainer.parallel.init import materialize
    from trex.trainer.parallel.parallelize import parallelize

    master = torch.float32 if dtype == torch.bfloat16 and not frozen else dtype
    model = build_model_from_args(args, device="meta", dtype=master, seed=seed)
    parallel = parallelize(model, dims, meshes, param_dtype=dtype, reshard_after_forward=reshard_after_forward,
                           recompute=recompute)
    materialize(model, device, seed)
    return model, parallel


def build_checkpointer(cfg: TrainerConfig, directory: Path, group: Any,
                       log: Callable[[str], None]) -> CheckpointManager:
    """The run's checkpointer; its config hash covers what a bit-identical resume depends on."""
    hashed = cfg.model_dump(mode="json", include={"mode", "model", "optimizer", "routing", "data", "seed"})
    return CheckpointManager(directory, cfg.checkpoint.keep_last, config_hash(hashed), group, log)
