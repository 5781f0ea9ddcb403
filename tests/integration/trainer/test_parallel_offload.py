"""trainer.activationOffload at 2 ranks (spawn, gloo): on dp2 (FSDP2 wraps the checkpointed blocks before the
offload wraps them), on ep2 (the dispatch all-to-alls run again in the recomputed backward) and on tp2, three steps with
recompute full and offload equal the same run without offload bit for bit: losses and every parameter."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from optimizer_states import full_copy
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer

STEPS = 3
LAYOUTS: dict[str, dict[str, Any]] = {"dp2": {}, "ep2": {"ep": 2}, "tp2": {"tp": 2}}


def _cfg(ckpt: Path, layout: dict[str, Any], offload: bool) -> TrainerConfig:
    return load_section(TrainerConfig, {
        "model": {"preset": "tiny", "dtype": "fp64", "overrides": {"mtpDepth": 1}}, "maxSteps": STEPS,
        "recompute": "full", "activationOffload": offload, "parallelism": layout,
        "data": {"seqLen": 16, "microBatchSize": 2, "globalBatchSize": 4},
        "optimizer": {"schedule": {"warmupSteps": 1}}, "stability": {"enabled": False},
        "checkpoint": {"dir": str(ckpt), "intervalSteps": 100, "exportHf": False},
    })


def _worker(rank: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    try:
        for name, layout in LAYOUTS.items():
            for offload in (False, True):
                root = Path(out) / f"{name}-{offload}"
                tr = Trainer(_cfg(root / "ckpt", layout, offload), root, group=dist.group.WORLD,
                             measure_peak=False, log=lambda _m: None)
                losses = [tr.train_step().loss for _ in range(STEPS)]
                params = {n: full_copy(p) for n, p in tr.model.named_parameters()}
                if rank == 0:
                    torch.save({"losses": losses, "params": params}, Path(out) / f"{name}-{offload}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("offload")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(str(out),), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_offload_at_two_ranks_is_bit_identical(layout: str, runs: Path) -> None:
    off, on = (torch.load(runs / f"{layout}-{o}.pt") for o in (False, True))
    assert on["losses"] == off["losses"]
    assert sorted(on["params"]) == sorted(off["params"])
    for name, p in off["params"].items():
        assert p.dtype == torch.float64
        assert torch.equal(on["params"][name], p), name
