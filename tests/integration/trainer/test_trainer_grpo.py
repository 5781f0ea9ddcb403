"""`trex train` in mode grpo: a resumed run equals an uninterrupted one (the step's rollouts read back from the
rollout log), data parallelism at 2 ranks equals one process (float64), and the step's metrics reach the JSONL."""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers.gloo import gloo_rank
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer
from trex.trainer.rl.reward import Reward
from trex.verify.items import Item

STEPS = 3


class HashedReward:
    """A verifier whose reward is a fixed function of the response text (0, 1/3, 2/3 or 1): varied advantages with
    no sandbox, so the runs compare the trainer's arithmetic."""

    async def score(self, completions: Sequence[str], items: Sequence[Item]) -> list[Reward]:
        out = []
        for text, item in zip(completions, items, strict=True):
            r = (zlib.crc32(f"{item.id}/{text}".encode()) % 4) / 3
            out.append(Reward(r, 0.0, 0.0, r, "correct" if r == 1 else "wrong_objective", ""))
        return out


def _prompts(root: Path) -> Path:
    """The prompts file, written whole or not at all (a rank must never read it half-written)."""
    path = root / "prompts.jsonl"
    if not path.exists():
        part = root / f"prompts.jsonl.{os.getpid()}"
        part.write_text("".join(json.dumps({"id": f"p{k}", "question": f"Maximize {k} x subject to x <= {k + 1}.",
                                            "answer": k * (k + 1)}) + "\n" for k in range(6)))
        part.replace(path)
    return path


def _cfg(root: Path, ckpt: str, layout: dict[str, Any] | None = None, kl: float = 0.05, micro: int = 3,
         group: int = 3) -> TrainerConfig:
    return load_section(TrainerConfig, {
        "mode": "grpo", "model": {"preset": "tiny", "dtype": "fp64", "overrides": {"mtpDepth": 0}},
        "maxSteps": STEPS, "parallelism": layout or {}, "deterministic": True,
        "data": {"train": str(_prompts(root)), "microBatchSize": micro, "tokenizer": {"vocabSize": 512}},
        "grpo": {"promptsPerStep": 2, "groupSize": group, "maxNewTokens": 6, "klCoef": kl, "temperature": 1.3},
        "optimizer": {"schedule": {"warmupSteps": 0, "decay": "none"}, "adamw": {"eps": 1e-8}},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(root / ckpt), "intervalSteps": 1, "exportHf": False},
    })


def _trainer(cfg: TrainerConfig, root: Path, group: Any = None) -> Trainer:
    return Trainer(cfg, root, group=group, measure_peak=False, log=lambda _m: None, verifier=HashedReward())


def test_resume_equals_uninterrupted_and_reuses_the_rollout_log(tmp_path: Path) -> None:
    whole = _trainer(_cfg(tmp_path, "whole"), tmp_path)
    res = whole.run()
    stats = [r.stats for r in res.history]
    assert all(s is not None for s in stats)
    assert len({round(s.reward_mean, 12) for s in stats if s is not None}) > 1  # the rewards vary
    assert any(abs(r.loss) > 0 for r in res.history) and res.history[-1].stats.kl > 0  # type: ignore[union-attr]

    cfg = _cfg(tmp_path, "parts")
    first = _trainer(cfg, tmp_path)
    first.run(2)
    # a worker preempted after the rollouts of step 3: the log holds them; the restarted worker decodes nothing new
    rollouts, _ = first.objective.run.rollout(first.model, 2)  # type: ignore[union-attr]
    again = _trainer(cfg, tmp_path)
    rest = again.run()
    assert again.step == STEPS and len(rest.history) == 1
    last = rest.history[0].stats
    assert last is not None and last.resumed_tokens == sum(len(r.tokens) for r in rollouts) > 0
    a, b = whole.full_state_dict(), again.full_state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rows = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert {"reward_mean", "reward_std", "kl", "clip_fraction", "response_length", "rollout_seconds",
            "verify_seconds", "rl_train_seconds", "verifier_outcomes"} <= set(rows[-1])
    assert sum(rows[-1]["verifier_outcomes"].values()) == 6  # 2 prompts x G = 3


LAYOUTS: dict[str, tuple[dict[str, Any], int, int]] = {
    "dp2": ({"dp": 2}, 3, 3), "tp2": ({"tp": 2}, 2, 3), "ep2": ({"ep": 2}, 2, 3)}
"""At two ranks, name -> (layout, micro-batch size, group size): tp splits each micro-batch's sequences over its
ranks."""
WORLD4: dict[str, tuple[dict[str, Any], int, int]] = {"dp2-tp2-ep2": ({"tp": 2, "ep": 2}, 2, 4)}
"""At four ranks: two data-parallel ranks of two tp ranks each (one prompt of 4 samples per data-parallel rank)."""


def _worker(rank: int, world: int, out: str) -> None:
    torch.set_num_threads(1)
    with gloo_rank(rank, world, f"{out}/rendezvous-{world}"):
        root = Path(out)
        for name, (layout, micro, group) in (LAYOUTS if world == 2 else WORLD4).items():
            tr = _trainer(_cfg(root, name, layout, micro=micro, group=group), root, dist.group.WORLD)
            res = tr.run()
            state = tr.full_state_dict()
            if rank == 0:
                torch.save({"state": state, "rewards": [r.stats.reward_mean for r in res.history],  # type: ignore[union-attr]
                            "replica": tr.objective.replica is not None, "logs": sorted(p.name for p in (root / name).rglob("*.wal"))},
                           root / f"{name}.pt")


@pytest.fixture(scope="module")
def parallel_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grpo-parallel")
    _prompts(root)  # before the ranks start: they all read it
    mp.spawn(_worker, args=(2, str(root)), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    mp.spawn(_worker, args=(4, str(root)), nprocs=4, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return root


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", sorted(LAYOUTS) + sorted(WORLD4))
def test_parallel_grpo_equals_one_process(layout: str, parallel_runs: Path) -> None:
    """dp2 (FSDP2 shards, gathered whole for the rollouts: each rank samples its half of the prompts), tp2 and ep2
    (rollouts decoded on a whole replica; the tp ranks split them and their verification), and all three at four
    ranks: the parameters after 3 steps equal the single-process run's to 1e-10 (float64)."""
    got = torch.load(parallel_runs / f"{layout}.pt")
    _, micro, group = {**LAYOUTS, **WORLD4}[layout]
    one = _trainer(_cfg(parallel_runs, f"one-{layout}", micro=micro, group=group), parallel_runs)
    res = one.run()
    assert got["rewards"] == pytest.approx([r.stats.reward_mean for r in res.history], abs=1e-12)  # type: ignore[union-attr]
    ref = one.full_state_dict()
    for k, v in ref.items():
        torch.testing.assert_close(got["state"][k], v, atol=1e-10, rtol=0, msg=k)
    assert got["replica"] == (layout != "dp2")
    if "tp2" in layout:  # each tp rank logs the half of the samples it decoded, for its own resume
        assert {n.split("-tp-")[-1] for n in got["logs"]} == {"000.wal", "001.wal"}
