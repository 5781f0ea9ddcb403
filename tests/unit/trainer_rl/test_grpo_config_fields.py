"""grpo.verifierWorkers, grpo.verifierTimeoutS and grpo.walFsyncEvery do what they say: the verifier a
TrainJob's config builds runs at most verifierWorkers programs at once and stops a program at
verifierTimeoutS; the rollout log fsyncs once walFsyncEvery tokens are unsynced (0: only at close)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.rl.reward import machine_workers
from trex.trainer.rl.step import default_verifier
from trex.trainer.rollout import wal as wal_module
from trex.trainer.rollout.wal import Record, RolloutLog
from trex.verify import program
from trex.verify.items import Item, parse_truth
from trex.verify.scoring import Execution


def _cfg(**grpo: Any) -> TrainerConfig:
    return load_section(TrainerConfig, {"model": {"preset": "tiny"}, "mode": "grpo", "data": {"train": "p.jsonl"},
                                        "grpo": grpo})


def test_verifier_workers_bound_the_programs_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    live, peak, limits = 0, 0, []

    async def fake_run(code: str, item: Item, **kw: Any) -> tuple[Execution, dict[str, Any], None]:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        limits.append(kw["timeout_s"])
        await asyncio.sleep(0)  # let every other scoring task reach its run (only the semaphore holds them)
        await asyncio.sleep(0)
        live -= 1
        return Execution(0, False, "", {"status": "optimal", "objective": 1.0, "values": {}}), {}, None

    monkeypatch.setattr(program, "run_program", fake_run)
    items = [Item(str(i), "q", parse_truth("1")) for i in range(6)]
    verifier = default_verifier(_cfg(verifierWorkers=2, verifierTimeoutS=7.5))
    rewards = asyncio.run(verifier.score(["```python\nx = 1\n```"] * 6, items))
    assert (peak, limits, [r.objective for r in rewards]) == (2, [7.5] * 6, [1.0] * 6)
    assert default_verifier(_cfg(verifierWorkers=0)).workers == machine_workers()  # 0: one per CPU


def test_verifier_timeout_stops_a_program_that_runs_on() -> None:
    verifier = default_verifier(_cfg(verifierWorkers=1, verifierTimeoutS=1.0))
    [reward] = asyncio.run(verifier.score(["```python\nwhile True:\n    pass\n```"], [Item("0", "q", parse_truth("1"))]))
    assert (reward.outcome, reward.execution, reward.objective) == ("timeout", 0.0, 0.0), reward.reason


@pytest.mark.parametrize(("every", "expected"), [(3, [4, 7]), (0, [])])
def test_wal_fsync_every_counts_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int,
                                       expected: list[int]) -> None:
    """7 tokens appended 2, 2, 2, 1 at a time: with walFsyncEvery 3 the log fsyncs on the appends that bring
    3 or more unsynced tokens (after tokens 4 and 7); with 0 it fsyncs only when closed."""
    log = RolloutLog(tmp_path / "wal", _cfg(walFsyncEvery=every).grpo.wal_fsync_every)
    log.open({"rollout": "test"})
    fsyncs = [0]
    real_fsync = wal_module.os.fsync

    def counting_fsync(fd: int) -> None:
        fsyncs[0] += 1
        real_fsync(fd)

    monkeypatch.setattr(wal_module.os, "fsync", counting_fsync)
    synced_after: list[int] = []
    pos = 0
    for n in (2, 2, 2, 1):
        before = fsyncs[0]
        log.append([Record(0, 0, pos + i, 5, -0.5) for i in range(n)])
        pos += n
        if fsyncs[0] > before:
            synced_after.append(pos)
    assert synced_after == expected
    log.close()
    assert fsyncs[0] == len(expected) + 1  # and once more at close
