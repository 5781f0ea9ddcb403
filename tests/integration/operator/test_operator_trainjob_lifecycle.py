"""TrainJob lifecycle against the Kubernetes emulator: the operator runs in-process, a test kubelet drives pods."""

from __future__ import annotations

from typing import Any

import pytest
from kubelet import Kubelet
from operator_env import OperatorEnv, names
from trex.telemetry.exporter import Exporter
from trex_operator.kube import ApiError


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}


async def start_all(env: OperatorEnv, kubelet: Kubelet, job: str, attempt: int, n: int, ip: str = "10.0.0.1") -> None:
    await env.wait_for(lambda: len(env.pods(job, attempt)) == n, what=f"{n} pods of attempt {attempt}")
    for name in names(env.pods(job, attempt)):
        await kubelet.run(name, pod_ip=ip)


async def test_success_with_progress_stall_results_and_events(env: OperatorEnv) -> None:
    exporter = Exporter()
    port = exporter.serve(0, addr="127.0.0.1")
    for metric, value in (("trex_train_step", 30), ("trex_train_max_steps", 120), ("trex_train_loss", 3.5),
                          ("trex_train_last_checkpoint_step", 20)):
        exporter.metric(metric, job_name="tj").set(value)
    k = Kubelet(env.kube)
    await env.apply("TrainJob", "tj", {"replicas": 2, "metricsPort": port, "runPolicy": {"stallSeconds": 1},
                                       "trainer": {"maxSteps": 120}})
    await start_all(env, k, "tj", 0, 2, ip="127.0.0.1")
    job = await env.wait_for(lambda: _progress(env, "tj", "percent", "25.0%"), what="scraped progress")
    assert job["status"]["progress"]["loss"] == 3.5 and job["status"]["progress"]["step"] == 30
    job = await env.wait_for(lambda: _condition(env, "tj", "Stalled", "True"), what="Stalled condition")
    exporter.metric("trex_train_step", job_name="tj").set(60)
    await env.wait_for(lambda: _condition(env, "tj", "Stalled", "False"), what="Stalled cleared")
    for i, name in enumerate(names(env.pods("tj"))):
        await k.terminate(name, 0, summary={"finalLoss": 1.25 + i, "steps": 120})
    job = await env.wait_phase("TrainJob", "tj", "Succeeded")
    assert job["status"]["results"] == {"finalLoss": 1.25, "steps": 120}
    # the operator writes the status, then its Events: wait for them rather than race the last one
    await env.wait_for(lambda: {"PodsCreated", "AllPodsRunning", "Completed"} <= {e["reason"] for e in env.events()},
                       what="PodsCreated, AllPodsRunning and Completed events")
    for kind in ("v1/pods", "v1/configmaps", "v1/services"):
        for obj in env.objects(kind):
            assert obj["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    # cleanPodPolicy Running: finished pods stay
    assert len(env.pods("tj")) == 2


async def _job(env: OperatorEnv, name: str) -> dict[str, Any]:
    job = await env.job("TrainJob", name)
    assert job is not None
    return job


async def _progress(env: OperatorEnv, name: str, key: str, value: Any) -> dict[str, Any] | None:
    job = await _job(env, name)
    return job if (job.get("status") or {}).get("progress", {}).get(key) == value else None


async def _condition(env: OperatorEnv, name: str, type_: str, status: str) -> dict[str, Any] | None:
    job = await _job(env, name)
    conds = (job.get("status") or {}).get("conditions") or []
    return job if any(c["type"] == type_ and c["status"] == status for c in conds) else None


async def test_gang_restart_preemption_and_backoff_limit(env: OperatorEnv) -> None:
    k = Kubelet(env.kube)
    await env.apply("TrainJob", "gang", {"replicas": 2, "runPolicy": {"backoffLimit": 1}, "trainer": {}})
    await start_all(env, k, "gang", 0, 2)
    await env.wait_phase("TrainJob", "gang", "Running")
    await k.terminate("gang-worker-1-a0", 1, summary={"lastCheckpointStep": 40})
    await start_all(env, k, "gang", 1, 2)
    assert names(env.pods("gang")) == ["gang-worker-0-a1", "gang-worker-1-a1"]  # attempt 0 fully deleted
    # no resume-step variable: the trainer resumes from the newest verified checkpoint on its volume
    assert all("TREX_RESUME_STEP" not in env_of(p) for p in env.pods("gang"))
    assert {env_of(p)["TREX_ATTEMPT"] for p in env.pods("gang")} == {"1"}
    await k.preempt("gang-worker-0-a1")
    await start_all(env, k, "gang", 2, 2)
    job = await _job(env, "gang")
    assert job["status"]["restarts"] == {"failure": 1, "preempted": 1}
    await env.wait_phase("TrainJob", "gang", "Running")
    await k.terminate("gang-worker-0-a2", 137, reason="OOMKilled")
    job = await env.wait_phase("TrainJob", "gang", "Failed")
    assert job["status"]["reason"] == "BackoffLimitExceeded" and job["status"]["attempt"] == 2
    await env.wait_for(lambda: names(env.pods("gang")) == ["gang-worker-0-a2"], what="running pod cleaned up")
    assert len(env.events("GangRestart")) == 2
    assert env.reconciler is not None
    metrics = env.reconciler.metrics
    failed_gauge = 'trex_operator_jobs{kind="TrainJob",phase="Failed"} 1.0'
    await env.wait_for(lambda: failed_gauge in metrics.exposition(), what="jobs gauge")
    text = metrics.exposition()
    assert 'trex_operator_restarts_total{cause="failure",kind="TrainJob"} 1.0' in text
    assert 'trex_operator_restarts_total{cause="preempted",kind="TrainJob"} 1.0' in text
    assert 'trex_operator_jobs{kind="TrainJob",phase="Running"} 0.0' in text
    assert 'trex_operator_reconciles_total{kind="TrainJob",result="ok"}' in text
    assert 'trex_operator_reconcile_seconds_count{kind="TrainJob"}' in text


async def test_suspend_and_resume(env: OperatorEnv) -> None:
    k = Kubelet(env.kube)
    await env.apply("TrainJob", "sus", {"replicas": 2, "trainer": {}})
    await start_all(env, k, "sus", 0, 2)
    await env.wait_phase("TrainJob", "sus", "Running")
    await env.patch_spec("TrainJob", "sus", {"runPolicy": {"suspend": True}})
    job = await env.wait_phase("TrainJob", "sus", "Suspended")
    assert env.pods("sus") == [] and len(env.objects("v1/configmaps")) == 1
    assert job["status"]["attempt"] == 0
    await env.patch_spec("TrainJob", "sus", {"runPolicy": {"suspend": False}})
    await start_all(env, k, "sus", 0, 2)
    await env.wait_phase("TrainJob", "sus", "Running")


async def test_deadline_and_ttl(env: OperatorEnv) -> None:
    k = Kubelet(env.kube)
    await env.apply("TrainJob", "late", {"replicas": 1, "runPolicy": {"activeDeadlineSeconds": 1}, "trainer": {}})
    await env.wait_for(lambda: env.pods("late"), what="pod created")
    job = await env.wait_phase("TrainJob", "late", "Failed", timeout=10)
    assert job["status"]["reason"] == "DeadlineExceeded"
    await env.wait_for(lambda: env.pods("late") == [], what="running pod deleted at deadline")
    await env.apply("TrainJob", "brief", {"replicas": 1, "runPolicy": {"ttlSecondsAfterFinished": 0}, "trainer": {}})
    await start_all(env, k, "brief", 0, 1)
    await k.terminate("brief-worker-0-a0", 0)
    await env.wait_for(lambda: _gone(env, "brief"), what="job deleted by TTL")


async def _gone(env: OperatorEnv, name: str) -> bool:
    return await env.job("TrainJob", name) is None


async def test_invalid_spec_fails_with_event_and_no_children(env: OperatorEnv) -> None:
    # the API server's schema rejects what a schema can express, naming each field ...
    with pytest.raises(ApiError) as rejected:
        await env.apply("TrainJob", "bad", {"replicas": 2, "trainer": {"maxSteps": "lots"}, "devicesPerReplica": 0})
    assert rejected.value.status == 422
    assert "spec.trainer.maxSteps" in rejected.value.message and "spec.devicesPerReplica" in rejected.value.message
    # ... and the operator fails what only the models can tell (ep must divide the 8 routed experts)
    await env.apply("TrainJob", "bad", {"replicas": 3, "devicesPerReplica": 2, "deviceType": "gpu",
                                        "trainer": {"model": {"preset": "tiny"}, "parallelism": {"ep": 6}}})
    job = await env.wait_phase("TrainJob", "bad", "Failed")
    assert job["status"]["reason"] == "InvalidSpec"
    assert "spec.trainer.parallelism" in job["status"]["message"]
    await env.wait_for(lambda: env.events("InvalidSpec"), what="InvalidSpec event")
    assert env.events("InvalidSpec")[0]["type"] == "Warning"
    assert env.pods("bad") == [] and env.objects("v1/configmaps") == []


async def test_operator_restart_adopts_children_without_duplicates(env: OperatorEnv) -> None:
    await env.apply("TrainJob", "adopt", {"replicas": 3, "trainer": {}})
    await env.wait_for(lambda: len(env.pods("adopt")) == 3, what="3 pods")
    await env.stop_operator()
    # as if the operator died mid-reconcile: one pod never got created, config map already there
    assert env.kube is not None
    await env.kube.delete("v1", "Pod", "default", "adopt-worker-2-a0")
    before = len(env.creates("v1/pods"))
    await env.start_operator()
    await env.wait_for(lambda: len(env.pods("adopt")) == 3, what="missing pod recreated")
    k = Kubelet(env.kube)
    for name in names(env.pods("adopt")):
        await k.run(name)
    await env.wait_phase("TrainJob", "adopt", "Running")
    assert len(env.creates("v1/pods")) - before == 1  # only the missing one was created
    assert sorted(names(env.pods("adopt"))) == ["adopt-worker-0-a0", "adopt-worker-1-a0", "adopt-worker-2-a0"]
    assert len(env.objects("v1/configmaps")) == 1 and len(env.objects("v1/services")) == 1
