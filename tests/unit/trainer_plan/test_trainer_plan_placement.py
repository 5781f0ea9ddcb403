"""The memory plan's tensor-parallel classes against the placements torch actually gives each parameter when
the parallel layer splits an MLA and a DeepSeek-V4 model over tp (a one-rank gloo mesh: the DTensor placements
are those of any tp degree)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
import torch.multiprocessing as mp
from trex.trainer.parallel.placement import TP_TABLE, tp_style

MLA = {"numLayers": 2, "nDenseLayers": 1, "qLoraRank": 16}
MLA_NO_Q_LATENT = {"numLayers": 2, "nDenseLayers": 1, "qLoraRank": 0}
V4 = {"attention": "csa", "hcMult": 2, "nHashLayers": 1, "qLoraRank": 16, "vHeadDim": 24, "nDenseLayers": 1,
      "numLayers": 3, "mtpDepth": 1, "layerTypes": ["csa", "hca", "csa"]}


def _tp_class(p: Any) -> str:
    """tp_col / tp_row for a parameter torch split on dim 0 / dim 1, else 'whole' (replicated or not a DTensor)."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(p, DTensor):
        return "whole"
    (placement,) = p.placements
    if isinstance(placement, Shard):
        return {0: "tp_col", 1: "tp_row"}[placement.dim]
    return "whole"


def _worker(rank: int, init_file: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=1)
    try:
        from types import SimpleNamespace

        from torch.distributed.device_mesh import init_device_mesh
        from trex.config_base import load_section
        from trex.trainer.config import TrainerConfig, resolved_model_values
        from trex.trainer.model import ModelArgs, build_model_from_args
        from trex.trainer.parallel.mesh import ParallelDims
        from trex.trainer.parallel.parallelize import Parallelized, apply_tensor_parallel
        from trex.trainer.plan import census

        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
        for overrides in (MLA, MLA_NO_Q_LATENT, V4):
            values = resolved_model_values(load_section(TrainerConfig, {
                "model": {"preset": "tiny", "overrides": overrides}}).model)
            model = build_model_from_args(ModelArgs.from_values(values), device="meta")
            apply_tensor_parallel(model, ParallelDims(world=1), SimpleNamespace(dense={"tp": mesh}),  # type: ignore[arg-type]
                                  Parallelized())
            actual = {n: _tp_class(p) for n, p in model.named_parameters()}
            planned = {p.name: p.placement if p.placement in ("tp_col", "tp_row") else "whole"
                       for p in census(values).params}
            assert planned == actual, {n: (planned.get(n), a) for n, a in actual.items() if planned.get(n) != a}
            assert {"tp_col", "tp_row", "whole"} == set(actual.values())
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_plan_tp_classes_are_the_placements_the_parallel_layer_applies() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(os.path.join(tmp, "init"),), nprocs=1, join=True)  # type: ignore[attr-defined,no-untyped-call]


def test_table_lookup_names_a_parameter_or_its_child_module() -> None:
    assert tp_style("MLAttention", "o_proj.weight") == "rowwise"
    assert tp_style("V4Attention", "o_a_proj.weight") == "shard0"
    assert tp_style("V4Attention", "sinks") == "shard0"
    assert tp_style("V4Attention", "kv_proj.weight") is None  # the shared key/value head stays whole
    assert tp_style("Block", "self_attn.sinks") is None
    assert tp_style("MLP", "gate_proj") == "colwise"
    assert set(TP_TABLE) == {"MLAttention", "V4Attention", "MLP"}
