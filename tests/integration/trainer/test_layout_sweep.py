"""One rule for validity, swept: at world 2 and 4, every combination of tp, ep, etp and dpReplicate in
{1, 2, 4} that `trex validate` accepts trains a step (float64; its first loss equals the single-process loss
to 1e-10, since the initial weights and the global batch are the same), and every one it rejects is
rejected by the trainer too, with the same field and one line."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer
from trex.trainer.rules import job_problems

DEGREES = (1, 2, 4)


def _cfg(ckpt: Path, layout: dict[str, int]) -> TrainerConfig:
    return load_section(TrainerConfig, {
        "model": {"preset": "tiny", "dtype": "fp64"}, "maxSteps": 1, "parallelism": layout,
        "data": {"seqLen": 16, "microBatchSize": 4, "globalBatchSize": 16},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(ckpt), "intervalSteps": 100, "exportHf": False}})


def _layouts(world: int) -> list[dict[str, int]]:
    return [{"tp": tp, "ep": ep, "etp": etp, "dpReplicate": dr}
            for tp, ep, etp, dr in itertools.product(DEGREES, repeat=4) if max(tp, ep, etp, dr) <= world]


def _name(layout: dict[str, int]) -> str:
    return "-".join(f"{k}{v}" for k, v in layout.items())


def _accepted(world: int) -> list[dict[str, int]]:
    return [lay for lay in _layouts(world) if not job_problems(_cfg(Path("unused"), lay), world)]


def _worker(rank: int, world: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous-{world}", rank=rank, world_size=world)
    try:
        root = Path(out)
        results: dict[str, Any] = {}
        for layout in _accepted(world):
            tr = Trainer(_cfg(root / f"w{world}-{_name(layout)}", layout), root, group=dist.group.WORLD,
                         measure_peak=False, log=lambda _m: None)
            res = tr.run(1)
            results[_name(layout)] = {"step": tr.step, "losses": [r.loss for r in res.history]}
        if rank == 0:
            (root / f"sweep-{world}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    out = tmp_path_factory.mktemp("sweep")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    got = {}
    for world in (2, 4):
        mp.spawn(_worker, args=(world, str(out)), nprocs=world, join=True)  # type: ignore[attr-defined,no-untyped-call]
        got[world] = json.loads((out / f"sweep-{world}.json").read_text())
    return got


@pytest.mark.slow
def test_every_accepted_layout_trains_a_step(swept: dict[int, dict[str, Any]], tmp_path: Path) -> None:
    tr = Trainer(_cfg(tmp_path / "single", {}), tmp_path, measure_peak=False, log=lambda _m: None)
    ref = tr.run(1).history[0].loss
    for world, results in swept.items():
        assert sorted(results) == sorted(_name(lay) for lay in _accepted(world))
        for name, r in results.items():
            assert r["step"] == 1, (world, name)
            assert r["losses"] == pytest.approx([ref], abs=1e-10, rel=0), (world, name)
    assert len(swept[4]) >= 30  # the sweep covers the folded layouts, not a handful


@pytest.mark.parametrize("world", [2, 4])
def test_every_rejected_layout_is_one_precise_line_the_trainer_agrees_with(world: int) -> None:
    rejected = 0
    for layout in _layouts(world):
        problems = job_problems(_cfg(Path("unused"), layout), world)
        if not problems:
            continue
        rejected += 1
        field, message = problems[0]
        assert field.startswith("parallelism.") and message and "\n" not in message, (layout, problems)
        # the trainer's own check: the same rule where the job trains (Trainer turns it into ConfigProblem)
        assert job_problems(_cfg(Path("unused"), layout), world, local=True)[0] == (field, message)
    assert rejected >= {2: 5, 4: 40}[world]
