"""`trex train` in mode opd under the parallel layouts (spawn, gloo, world 2): data parallelism (FSDP2 shards
gathered for the rollouts), tensor parallelism (a decoding replica whose samples the tp ranks split; the
vocabulary-parallel KL) and expert parallelism (the same replica) each equal one process in float64 — the
same rollouts, step losses, KL per teacher and parameters — with the teacher distributed by the student's
layout (no rank holds its whole trunk, nor its whole head: the KL is vocabulary-parallel over dp x tp)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers.gloo import gloo_rank
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.hf import save_hf
from trex.trainer.loop import ConfigProblem, Trainer
from trex.trainer.model import build_model
from trex.trainer.rules import job_problems

MODEL = {"preset": "tiny", "dtype": "fp64", "overrides": {"numLayers": 1, "mtpDepth": 0, "maxSeqLen": 256}}
LAYOUTS: dict[str, dict[str, Any]] = {"dp2": {"dp": 2}, "tp2": {"tp": 2}, "ep2": {"ep": 2}}
WORLD4: dict[str, dict[str, Any]] = {"dp2-tp2-ep2": {"tp": 2, "ep": 2}}
"""At four ranks: two data-parallel ranks of two tp ranks each, experts over ep pairs across them."""
STEPS = 3


def _files(root: Path) -> tuple[Path, Path]:
    prompts, teacher = root / "prompts.jsonl", root / "teacher"
    if not prompts.exists():
        prompts.write_text("".join(json.dumps({"id": f"p{i}", "question": f"maximise {i} x with x <= {i + 2}",
                                               "answer": float(i)}) + "\n" for i in range(6)))
        save_hf(build_model(load_section(TrainerConfig, {"model": MODEL}).model, seed=7), teacher)
    return prompts, teacher


def _cfg(root: Path, name: str, layout: dict[str, Any]) -> TrainerConfig:
    prompts, teacher = _files(root)
    return load_section(TrainerConfig, {
        "mode": "opd", "model": MODEL, "maxSteps": STEPS, "deterministic": True, "parallelism": layout,
        "optimizer": {"schedule": {"warmupSteps": 0, "decay": "none"}, "adamw": {"lr": 0.01, "eps": 1e-8}},
        "data": {"train": str(prompts), "microBatchSize": 2},
        "opd": {"teachers": [{"path": str(teacher)}], "promptsPerStep": 2, "samplesPerPrompt": 2,
                "sampling": {"maxNewTokens": 6, "temperature": 1.3}, "chunkSize": 5},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(root / name), "intervalSteps": 100, "exportHf": False},
    })


def _summary(tr: Trainer, history: list[Any]) -> dict[str, Any]:
    return {"losses": [r.loss for r in history], "kl": [r.stats.kl for r in history],
            "entropy": [r.stats.entropy for r in history], "state": tr.full_state_dict()}


def _worker(rank: int, world: int, out: str) -> None:
    torch.set_num_threads(1)
    with gloo_rank(rank, world, f"{out}/rendezvous-{world}"):
        root = Path(out)
        for name, layout in (LAYOUTS if world == 2 else WORLD4).items():
            tr = Trainer(_cfg(root, name, layout), root, group=dist.group.WORLD, measure_peak=False,
                         log=lambda _m: None)
            res = tr.run()
            summary = _summary(tr, res.history)
            assert tr.objective.run is not None
            ranks = tr.objective.run.ranks
            summary["vocab_parallel"] = ranks.vocab is not None
            summary["replica"] = ranks.replica is not None
            summary["head_rows"] = next(iter(tr.objective.run.pool.teachers.values())).head.shape[0]  # type: ignore[union-attr]
            if name != "dp2":  # the teacher's trunk is distributed: this rank holds part of its experts / heads
                teacher = next(iter(tr.objective.run.pool.teachers.values())).model  # type: ignore[union-attr]
                local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                            for p in teacher.parameters())  # type: ignore[union-attr]
                summary["teacher_local"] = local
            if rank == 0:
                torch.save(summary, root / f"{name}.pt")
        if world == 4:
            return
        # A teacher the student's layout cannot distribute is refused at start, naming the field.
        odd = root / f"odd-teacher-{rank}"
        shape = {**MODEL, "overrides": {**MODEL["overrides"], "nRoutedExperts": 3}}  # type: ignore[dict-item]
        save_hf(build_model(load_section(TrainerConfig, {"model": shape}).model, seed=3), odd)
        cfg = _cfg(root, "odd", {"ep": 2})
        cfg = cfg.model_copy(update={"opd": cfg.opd.model_copy(update={"teachers": [
            cfg.opd.teachers[0].model_copy(update={"path": str(odd)})]})})
        try:
            Trainer(cfg, root, group=dist.group.WORLD, measure_peak=False, log=lambda _m: None)
        except ConfigProblem as e:
            (root / f"odd-{rank}.txt").write_text(str(e))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("opd-parallel")
    _files(root)
    mp.spawn(_worker, args=(2, str(root)), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    mp.spawn(_worker, args=(4, str(root)), nprocs=4, join=True)  # type: ignore[attr-defined,no-untyped-call]
    one = Trainer(_cfg(root, "one", {}), root, measure_peak=False, log=lambda _m: None)
    return root, _summary(one, one.run().history)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", sorted(LAYOUTS) + sorted(WORLD4))
def test_layout_equals_one_process(layout: str, runs: tuple[Path, dict[str, Any]]) -> None:
    root, ref = runs
    got = torch.load(root / f"{layout}.pt")
    assert ref["losses"][0] > 0 and len(set(ref["losses"])) == STEPS  # something is learned, step by step
    assert got["losses"] == pytest.approx(ref["losses"], rel=1e-9, abs=1e-12)
    for a, b in zip(got["kl"], ref["kl"], strict=True):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-9) for k in a)
    assert got["entropy"] == pytest.approx(ref["entropy"], rel=1e-9)
    for k, v in ref["state"].items():
        torch.testing.assert_close(got["state"][k], v, atol=1e-10, rtol=0, msg=k)
    world = 2 if layout in LAYOUTS else 4
    assert got["vocab_parallel"] and got["replica"] == (layout != "dp2")
    assert got["head_rows"] == 512 // world  # this rank's vocabulary shard of the teacher's head (dp x tp ranks)
    if layout != "dp2":
        whole = sum(p.numel() for p in build_model(load_section(TrainerConfig, {"model": MODEL}).model).parameters())
        assert got["teacher_local"] < whole


def test_a_teacher_the_layout_cannot_distribute_is_refused_by_field(runs: tuple[Path, dict[str, Any]]) -> None:
    root, _ = runs
    for rank in (0, 1):
        assert (root / f"odd-{rank}.txt").read_text() == (
            "opd.teachers.0.path: the teacher is distributed like the student, but ep=2 does not divide the "
            "teacher's routed expert count 3")


def test_validate_accepts_the_layouts_and_names_what_cannot_split(tmp_path: Path) -> None:
    for layout in LAYOUTS.values():
        assert job_problems(_cfg(tmp_path, "v", layout), 2) == []
    cfg = _cfg(tmp_path, "v", {"tp": 2})
    odd = cfg.model_copy(update={"opd": cfg.opd.model_copy(update={"samples_per_prompt": 1, "prompts_per_step": 1})})
    [(field, message)] = job_problems(odd, 2)
    assert field == "opd.samplesPerPrompt" and "samplesPerPrompt = 1 responses, not a multiple of tp=2" in message
    three = cfg.model_copy(update={"opd": cfg.opd.model_copy(update={"prompts_per_step": 3}),
                                   "parallelism": cfg.parallelism.model_copy(update={"tp": 1})})
    [(field, message)] = job_problems(three, 2)
    assert field == "opd.promptsPerStep" and message.startswith("3 is not a multiple of the 2 data-parallel")
