"""A parallel TrainJob end to end under the operator and the local kubelet (real processes): 2 pods x 2 CPU
processes with dp2 x ep2 rendezvous, train and checkpoint; deleting one worker pod mid-run makes the operator
restart the whole gang, which resumes from the sharded checkpoint and ends with the losses of an
uninterrupted run of the same job."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from operator_env import OperatorEnv
from trex_operator.local.kubelet import LocalKubelet, host_path_dir

STEPS = 6


def _spec(name: str) -> dict[str, Any]:
    return {"replicas": 2, "devicesPerReplica": 2, "deviceType": "cpu",
            "volumes": {"checkpoints": {"hostPath": f"/var/lib/trex/{name}"}},
            "runPolicy": {"backoffLimit": 2},
            "trainer": {"mode": "pretrain", "maxSteps": STEPS, "model": {"preset": "tiny"},
                        "parallelism": {"ep": 2},
                        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 8},
                        "optimizer": {"schedule": {"warmupSteps": 1}, "muon": {"nsDtype": "fp32"}},
                        "stability": {"enabled": False},
                        "checkpoint": {"dir": f"/checkpoints/{name}", "intervalSteps": 2, "exportHf": False}}}


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[OperatorEnv, Path]]:
    async with OperatorEnv(interval_s=0.5) as env:
        assert env.kube is not None
        kubelet = LocalKubelet(env.kube, tmp_path, poll_s=0.2)
        task = asyncio.create_task(kubelet.run())
        try:
            yield env, tmp_path
        finally:
            kubelet.stop()
            await task


def _losses(ckpt: Path) -> dict[int, float]:
    """Per-step losses from rank 0's JSONL log (a resumed step's line replaces the first attempt's)."""
    out: dict[int, float] = {}
    for line in (ckpt / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[int(rec["step"])] = float(rec["loss"])
    return out


@pytest.mark.slow
async def test_gang_restart_resumes_the_sharded_checkpoint_with_the_same_losses(
        cluster: tuple[OperatorEnv, Path]) -> None:
    env, work = cluster
    ckpt = {n: host_path_dir(work, f"/var/lib/trex/{n}") / n for n in ("ref", "kill")}
    await env.apply("TrainJob", "ref", _spec("ref"))
    ref = await env.wait_phase("TrainJob", "ref", "Succeeded", timeout=600)
    assert ref["status"]["attempt"] == 0

    await env.apply("TrainJob", "kill", _spec("kill"))
    await env.wait_for(lambda: (ckpt["kill"] / "step-00000002" / "manifest.json").is_file(), timeout=600,
                       what="the first sharded checkpoint")
    assert env.kube is not None
    await env.kube.delete("v1", "Pod", env.namespace, "kill-worker-1-a0")
    job = await env.wait_phase("TrainJob", "kill", "Succeeded", timeout=600)
    assert job["status"]["attempt"] >= 1 and sum(job["status"]["restarts"].values()) >= 1
    assert len(env.events("GangRestart")) >= 1
    assert sorted(p.name for p in (ckpt["kill"] / f"step-{STEPS:08d}").glob("*.distcp")) == [
        f"__{r}_0.distcp" for r in range(4)]
    want, got = _losses(ckpt["ref"]), _losses(ckpt["kill"])
    assert sorted(want) == sorted(got) == list(range(1, STEPS + 1))
    assert [got[s] for s in sorted(got)] == pytest.approx([want[s] for s in sorted(want)], rel=1e-5)
