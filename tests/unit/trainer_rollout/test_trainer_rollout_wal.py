"""The token write-ahead log: a rollout killed with SIGKILL (or preempted with SIGTERM) mid-way and rerun on its log ends exactly as an
uninterrupted run (tokens and log-probs), a torn tail is dropped, a foreign log is refused, tokens of an
older policy are marked stale, and resuming (unlike regenerating interrupted samples from scratch) leaves
the batch's length distribution unbiased."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rollout_models import KILL_PROMPTS, kill_test_job, tiny_model
from trex.trainer.rollout import Rollout, RolloutLog, SamplingParams, generate
from trex.trainer.rollout.wal import RECORD_SIZE, read_log

HELPERS = Path(__file__).resolve().parents[2] / "helpers"
WORKLOADS = Path(__file__).resolve().parents[3] / "workloads"


def _assert_same(a: list[Rollout], b: list[Rollout]) -> None:
    for x, y in zip(a, b, strict=True):
        assert (x.sample_id, x.tokens, x.finish_reason) == (y.sample_id, y.tokens, y.finish_reason)
        torch.testing.assert_close(torch.tensor(x.logprobs, dtype=torch.float64),
                                   torch.tensor(y.logprobs, dtype=torch.float64), rtol=0, atol=1e-10)


def _kill_mid_rollout(log: Path, park_after: int, sig: signal.Signals) -> None:
    """Run the fixed rollout in a worker process and send it `sig` once it has logged park_after steps."""
    marker = log.with_suffix(".parked")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WORKLOADS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(HELPERS / "rollout_models.py"), str(log), str(marker),
                             str(park_after)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, f"worker exited early with {proc.returncode}"
            assert time.monotonic() < deadline, "worker never reached the kill point"
            time.sleep(0.05)
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -sig


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_killed_worker_resumes_to_the_uninterrupted_rollout(tmp_path: Path, sig: signal.Signals) -> None:
    log = tmp_path / "rollout.wal"
    _kill_mid_rollout(log, park_after=9, sig=sig)
    reference = kill_test_job(None)
    resumed = kill_test_job(str(log), policy_version=1)
    _assert_same(resumed, reference)
    # some samples had finished before the kill, some were continued, none regenerated
    assert any(r.resumed == len(r.tokens) for r in resumed)
    assert any(0 < r.resumed < len(r.tokens) for r in resumed)
    for r in resumed:
        assert r.versions == [0] * r.resumed + [1] * (len(r.tokens) - r.resumed)
        assert r.stale == [True] * r.resumed + [False] * (len(r.tokens) - r.resumed)
    # a finished log is read back as it is, without decoding
    again = kill_test_job(str(log), policy_version=1)
    _assert_same(again, reference)
    assert all(r.resumed == len(r.tokens) for r in again)


def test_torn_tail_is_dropped_and_regenerated(tmp_path: Path) -> None:
    log = tmp_path / "rollout.wal"

    def stop(step: int) -> None:
        if step == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        kill_test_job(str(log), on_step=stop)
    size = log.stat().st_size
    with log.open("r+b") as fh:  # half of the last record never reached the disk
        fh.truncate(size - RECORD_SIZE // 2)
    resumed = kill_test_job(str(log))
    _assert_same(resumed, kill_test_job(None))
    data = log.read_bytes()
    _, records, end = read_log(data, log)  # cut at the last whole record, then continued
    assert end == len(data) and len(records) == sum(len(r.tokens) for r in resumed)


def test_log_of_another_rollout_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "rollout.wal"
    kill_test_job(str(log))
    model = tiny_model("csa-hca")
    with pytest.raises(ValueError, match="'seed' differs"):
        generate(model, KILL_PROMPTS, SamplingParams(temperature=1.0, top_p=0.95, top_k=20, max_new_tokens=40,
                                                     stop_tokens=(0, 1)),
                 seed=99, sample_ids=[10, 11, 12, 13, 14], wal=RolloutLog(log))
    log.write_bytes(b"not a log")
    with pytest.raises(ValueError, match="bad magic"):
        kill_test_job(str(log))
    with pytest.raises(ValueError, match="fsync_every"):
        RolloutLog(log, fsync_every=-1)


def _ks(a: list[int], b: list[int]) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    values = sorted(set(a) | set(b))
    return max(abs(sum(x <= v for x in a) / len(a) - sum(x <= v for x in b) / len(b)) for v in values)


def _ks_critical(n: int, m: int, c_alpha: float) -> float:
    """KS rejection threshold c(alpha) sqrt((n + m) / (n m)) (c = 1.36 at 5 %, 1.95 at 0.1 %)."""
    return float(c_alpha * ((n + m) / (n * m)) ** 0.5)


def test_resuming_does_not_bias_lengths_and_regenerating_does(tmp_path: Path) -> None:
    model = tiny_model("mla")
    prompts = [[i, i + 1, i + 2] for i in range(4, 44, 4)] * 30
    params = SamplingParams(temperature=1.0, max_new_tokens=48, stop_tokens=(0, 1, 2, 3))
    log = tmp_path / "rollout.wal"

    def preempt(step: int) -> None:
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate(model, prompts, params, seed=3, wal=RolloutLog(log), on_step=preempt)
    resumed = generate(model, prompts, params, seed=3, wal=RolloutLog(log))
    uninterrupted = generate(model, prompts, params, seed=3)
    independent = generate(model, prompts, params, seed=4)  # another draw of the same distribution
    assert [r.tokens for r in resumed] == [r.tokens for r in uninterrupted]
    # regenerate-from-scratch: keep what had finished when preempted, redraw the rest (fresh seed)
    interrupted = generate(model, prompts, SamplingParams(temperature=1.0, max_new_tokens=5, stop_tokens=(0, 1, 2, 3)),
                           seed=3)
    kept = [len(r.tokens) for r in interrupted if r.finish_reason == "stop"]
    redo = [p for p, r in zip(prompts, interrupted, strict=True) if r.finish_reason != "stop"]
    regenerated = kept + [len(r.tokens) for r in generate(model, redo, params, seed=5)]

    lengths = [len(r.tokens) for r in resumed]
    reference = [len(r.tokens) for r in independent]
    n = len(lengths)
    assert _ks(lengths, reference) < _ks_critical(n, n, 1.36)  # same distribution: not rejected at 5 %
    assert _ks(regenerated, reference) > _ks_critical(n, n, 1.95)  # biased: rejected at 0.1 %
    assert sum(regenerated) / n < 0.85 * sum(reference) / n  # towards short responses
