"""The swap optimizer at 2 ranks (spawn, gloo): dp2 (FSDP2 shards, distributed Muon's owner exchange) and ep2
(expert stacks sharded on the expert dimension), fp32 and bf16 models (ep2's bf16 dense parameters, which FSDP2
shards over 2 ranks, have their fp32 masters in host memory). After 5 steps every parameter and
every Muon/AdamW state equals the run without swap bit for bit (one bucket per optimizer), and with small
buckets on a simulated link with random per-copy delays equals the same buckets stepped in place. Activation
recompute (full on dp2, selective on ep2: the dispatch all-to-alls run again in the backward) equals the run
without it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import trex.trainer.build as build_mod
from optimizer_states import InPlaceSwap, assert_identical, full_copy
from trex.config_base import load_section
from trex.runtime.copy_engine import LatencyCopyEngine
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer
from trex.trainer.optim import swap
from trex.trainer.optim.swap import SwapOptimizers

STEPS = 5
BUCKET = 24 * 1024
LAYOUTS = {"dp2": ({}, "fp32"), "ep2": ({"ep": 2}, "bf16")}
VARIANTS = ("off", "on", "small", "in-place", "recompute")
RECOMPUTE = {"dp2": "full", "ep2": "selective"}


def _cfg(ckpt: Path, layout: dict[str, Any], dtype: str, enabled: bool, recompute: str = "none") -> TrainerConfig:
    return load_section(TrainerConfig, {"recompute": recompute,
        "model": {"preset": "tiny", "dtype": dtype}, "maxSteps": STEPS, "parallelism": layout,
        "data": {"seqLen": 16, "microBatchSize": 1, "globalBatchSize": 2},
        "optimizer": {"schedule": {"warmupSteps": 1}, "swap": {"enabled": enabled}},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(ckpt), "intervalSteps": 100, "exportHf": False},
    })


def _states(tr: Trainer) -> dict[str, torch.Tensor]:
    """Parameters and optimizer states as full tensors (a collective: the same order on every rank)."""
    names = {id(p): n for n, p in tr.model.named_parameters()}
    out = {f"param.{n}": full_copy(p) for n, p in tr.model.named_parameters()}
    for opt in tr.opts.all():
        for p in [p for g in opt.param_groups for p in g["params"]]:
            for key, val in sorted(opt.state[p].items()):
                if isinstance(val, torch.Tensor) and val.ndim > 0:
                    out[f"{names[id(p)]}.{key}"] = full_copy(val)
    return out


def _worker(rank: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    try:
        for name, (layout, dtype) in LAYOUTS.items():
            for variant in VARIANTS:
                if variant == "small":
                    build_mod.with_swap = lambda o, c, k, **kw: swap.with_swap(  # type: ignore[assignment]
                        o, c, k, engine=LatencyCopyEngine(2.0, jitter=2e-3, seed=rank), bucket_bytes=BUCKET, **kw)
                elif variant == "in-place":  # the same buckets stepped where they are (masters on the device)
                    build_mod.with_swap = lambda o, c, k, **kw: InPlaceSwap(  # type: ignore[assignment]
                        o, buffers=2, bucket_bytes=BUCKET, engine=LatencyCopyEngine(1.0), device_kind=k)
                else:
                    build_mod.with_swap = swap.with_swap
                root = Path(out) / f"{name}-{variant}"
                swapped = variant not in ("off", "recompute")
                recompute = RECOMPUTE[name] if variant == "recompute" else "none"
                tr = Trainer(_cfg(root / "ckpt", layout, dtype, swapped, recompute), root, group=dist.group.WORLD,
                             measure_peak=False, log=lambda _m: None)
                tr.run(STEPS)
                assert swapped == isinstance(tr.opts, SwapOptimizers)
                states = _states(tr)
                if rank == 0:
                    torch.save(states, Path(out) / f"{name}-{variant}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("swap")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(str(out),), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_swap_at_two_ranks_is_bit_identical(layout: str, runs: Path) -> None:
    load = {v: torch.load(runs / f"{layout}-{v}.pt") for v in VARIANTS}
    assert_identical(load["off"], load["on"])
    assert_identical(load["in-place"], load["small"])
    assert_identical(load["off"], load["recompute"])
