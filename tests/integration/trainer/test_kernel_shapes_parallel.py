"""The shape classes a KernelTuneJob's shapesFrom derives for a tp2 x ep2 run (``run_kernel_shapes``, no model
built) against the calls four spawned ranks really dispatch in training steps, forward and backward, for an MLA
and a DeepSeek-V4 (csa/hca) model: local shard shapes (query heads / tp, dense and shared MLP hidden / tp, routed
experts / ep)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from trex.config_base import load_section
from trex.kernels.suite.base import shape_bucket
from trex.trainer import kernels as tk
from trex.trainer.config import TrainerConfig, resolved_model_values
from trex.trainer.loop import Trainer
from trex.trainer.model import layers

V4 = {"attention": "csa", "qLoraRank": 32, "vHeadDim": 24, "layerTypes": ["csa", "hca"]}


def _cfg(ckpt: Path, attention: str) -> TrainerConfig:
    overrides: dict[str, Any] = {"ropeInterleave": False} if attention == "mla" else dict(V4)
    return load_section(TrainerConfig, {
        "model": {"preset": "tiny", "overrides": overrides}, "maxSteps": 2,
        "parallelism": {"tp": 2, "ep": 2},
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 4},
        "checkpoint": {"dir": str(ckpt), "intervalSteps": 1000, "resume": False, "exportHf": False}})


def _recorder(seen: set[tuple[str, str]]) -> dict[str, Any]:
    """layers.TUNED entries that record the (kernel, shape class) of every call the real dispatch would take (plain
    tensors, as trex.trainer.kernels._plain) and leave the op eager."""
    def plain(*ts: torch.Tensor) -> bool:
        return all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in ts)

    def rows_cols(kernel: str) -> Any:
        def f(x: torch.Tensor, *rest: Any) -> None:
            if plain(x):
                seen.add((kernel, shape_bucket({"rows": x.numel() // x.shape[-1], "cols": x.shape[-1]})))
        return f

    def rope(x: torch.Tensor, *_: Any) -> None:
        if plain(x):
            heads = x.shape[2] if x.dim() == 4 else 1
            seen.add(("rope_fwd", shape_bucket({"tokens": x.shape[0] * x.shape[1], "heads": heads,
                                                "dim": x.shape[-1]})))

    def router(logits: torch.Tensor, _bias: torch.Tensor, k: int, scoring: str) -> None:
        if plain(logits):
            dims = {"tokens": logits.shape[0], "experts": logits.shape[1], "k": k, "score": tk.SCORE_CODES[scoring]}
            seen.add(("router_topk", shape_bucket(dims)))

    def gemm(x: torch.Tensor, w: torch.Tensor, _counts: torch.Tensor) -> None:
        if plain(x, w):
            seen.add(("grouped_gemm", shape_bucket({"tokens": x.shape[0], "experts": w.shape[0],
                                                    "hidden": w.shape[2], "out": w.shape[1]})))
    return {"rmsnorm": rows_cols("rmsnorm_fwd"), "swiglu": rows_cols("swiglu_clamp_fwd"), "rope": rope,
            "router": router, "grouped_gemm": gemm}


def _worker(rank: int, world: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
    try:
        for attention in ("mla", "csa"):
            seen: set[tuple[str, str]] = set()
            tr = Trainer(_cfg(Path(out) / f"ckpt-{attention}", attention), Path(out), group=dist.group.WORLD,
                         measure_peak=False, log=lambda _m: None)
            layers.TUNED.update(_recorder(seen))
            try:
                tr.run(2)
            finally:
                layers.TUNED.clear()
            (Path(out) / f"seen-{attention}-{rank}.json").write_text(json.dumps(sorted(seen)))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def calls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kernel-shapes")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(4, str(out)), nprocs=4, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return out


@pytest.mark.parametrize("attention", ["mla", "csa"])
def test_shapes_from_equal_the_calls_of_a_tp2_ep2_run(calls: Path, attention: str, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, attention)
    derived = {(k, shape_bucket(d)) for k, d in tk.run_kernel_shapes(cfg, "cpu")}
    for rank in range(4):
        seen = {tuple(x) for x in json.loads((calls / f"seen-{attention}-{rank}.json").read_text())}
        assert seen and seen <= derived, (rank, seen - derived)

        def classes(kernel: str, among: set[Any]) -> set[str]:
            return {b for k, b in among if k == kernel}
        # every class derived is called, but V4's compressed entries (rows = windows, one more per packed
        # document) whose classes depend on the packing: those are derived as the whole range
        for kernel in ("router_topk", "grouped_gemm", "swiglu_clamp_fwd") + (
                ("rmsnorm_fwd", "rope_fwd") if attention == "mla" else ()):
            assert classes(kernel, seen) <= classes(kernel, derived), (rank, kernel)
            if kernel in ("router_topk", "rmsnorm_fwd", "rope_fwd"):
                assert classes(kernel, seen) == classes(kernel, derived), (rank, kernel)
        if attention == "csa":  # q_a_norm (q_lora_rank 32) and kv_norm (head dim 24) on the 64 tokens
            assert {"cols32-rows64", "cols64-rows64"} <= classes("rmsnorm_fwd", seen)
        # local shards: the routed GEMMs see 4 of the 8 experts, the router half the micro-batch's tokens
        # (each tp rank takes half the sequences in MoE layers), RoPE 2 of the 4 query heads
        assert {b.split("-")[0] for b in classes("grouped_gemm", seen)} == {"experts4"}
        assert classes("router_topk", seen) == {"experts8-k2-score1-tokens32"}
        if attention == "mla":
            assert "dim8-heads2-tokens64" in classes("rope_fwd", seen)
    one = {(k, shape_bucket(d)) for k, d in tk.trainer_kernel_shapes(resolved_model_values(cfg.model), 2, [32], "cpu")}
    assert one != derived  # the single-process shapes differ: the layout is what changed them
