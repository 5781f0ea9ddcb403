"""KernelTuneJob, ORDataJob and EvalJob against the emulator, plus cross-job references."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from kubelet import Kubelet
from operator_env import OperatorEnv, names


async def wait_pods(env: OperatorEnv, job: str, n: int) -> list[str]:
    await env.wait_for(lambda: len(env.pods(job)) == n, what=f"{n} pods of {job}")
    return names(env.pods(job))


def batch(env: OperatorEnv, name: str) -> dict[str, Any] | None:
    return next((j for j in env.objects("batch/v1/jobs") if j["metadata"]["name"] == name), None)


async def test_kernels_then_train_with_reference(env: OperatorEnv) -> None:
    k = Kubelet(env.kube)
    await env.apply("TrainJob", "tj", {"replicas": 1, "kernelsFrom": {"name": "kt"}, "trainer": {}})
    job = await env.wait_phase("TrainJob", "tj", "Pending")
    await env.wait_for(lambda: _reason(env, "TrainJob", "tj", "WaitingForDependency"), what="waiting")
    assert env.pods("tj") == []
    await env.apply("KernelTuneJob", "kt", {"kernels": {"backend": "cpu-c"}})
    (pod,) = await wait_pods(env, "kt", 1)
    await k.run(pod)
    await k.terminate(pod, 0, summary={"device": "cpu:x", "kernels": {
        "rmsnorm_fwd/fp32/cols256-rows2048": {"speedup": 2.0, "speedupCompile": 1.5, "params": {"VEC": 16}},
        "swiglu_clamp_fwd/fp32/cols128-rows4096": {"speedup": 8.0, "params": {"VEC": 8}},
        # a shape class tj's run calls (the default trainer's hidden size on 4 x 128 tokens): kernelsFrom covers it
        "rmsnorm_fwd/fp32/cols64-rows512": {"params": {"VEC": 16}}}})
    kt = await env.wait_phase("KernelTuneJob", "kt", "Succeeded")
    assert kt["status"]["results"]["geomeanSpeedup"] == pytest.approx(4.0)  # sqrt(2 x 8)
    await env.wait_for(lambda: [c for c in env.objects("v1/configmaps") if c["metadata"]["name"] == "kt-kernels"],
                       what="kernels config map")
    cm = next(c for c in env.objects("v1/configmaps") if c["metadata"]["name"] == "kt-kernels")
    doc = json.loads(cm["data"]["kernels.json"])  # the registry the TrainJob's trainer loads
    assert doc["backend"] == "cpu-c" and doc["device"] == "cpu:x"
    assert doc["kernels"]["rmsnorm_fwd"]["cols256-rows2048"]["fp32"]["params"] == {"VEC": 16}
    assert kt["status"]["results"]["speedup"] == "4.00x eager, 1.50x compile"
    await wait_pods(env, "tj", 1)
    job = await env.wait_phase("TrainJob", "tj", "Starting")
    assert [(e["kind"], e["name"]) for e in job["status"]["lineage"]] == [("KernelTuneJob", "kt")]
    vols = {v["name"]: v for v in env.pods("tj")[0]["spec"]["volumes"]}
    assert vols["trex-kernels"]["configMap"]["name"] == "kt-kernels"
    mounts = {m["name"]: m["mountPath"] for m in env.pods("tj")[0]["spec"]["containers"][0]["volumeMounts"]}
    rendered = next(c for c in env.objects("v1/configmaps") if c["metadata"]["name"] == "tj-config")
    # the trainer loads the kernels.json key of kt-kernels through its rendered config
    assert yaml.safe_load(rendered["data"]["trainer.yaml"])["trainer"]["kernels"]["registry"] == (
        f"{mounts['trex-kernels']}/kernels.json")


async def _reason(env: OperatorEnv, kind: str, name: str, reason: str) -> bool:
    job = await env.job(kind, name)
    return bool(job and (job.get("status") or {}).get("reason") == reason)


async def test_dependency_failure_fails_the_dependent(env: OperatorEnv) -> None:
    k = Kubelet(env.kube)
    await env.apply("KernelTuneJob", "kt", {"kernels": {"backend": "cpu-c"}, "runPolicy": {"backoffLimit": 0}})
    await env.apply("TrainJob", "tj", {"replicas": 1, "kernelsFrom": {"name": "kt"}, "trainer": {}})
    (pod,) = await wait_pods(env, "kt", 1)
    await k.terminate(pod, 3)
    await env.wait_phase("KernelTuneJob", "kt", "Failed")
    job = await env.wait_phase("TrainJob", "tj", "Failed")
    assert job["status"]["reason"] == "DependencyFailed" and "kt" in job["status"]["message"]


async def test_ordata_generate_then_merge(env: OperatorEnv) -> None:
    k = Kubelet(env.kube)
    await env.apply("ORDataJob", "od", {"ordata": {"shards": {"numShards": 4}}, "parallelism": 2})
    gen = await env.wait_for(lambda: batch(env, "od-generate"), what="generate Job")
    assert gen["spec"]["completions"] == 4 and gen["spec"]["parallelism"] == 2
    await k.job_progress("od-generate", succeeded=2, active=2)
    await env.wait_for(lambda: _progress_is(env, "od", "45.0%"), what="shard progress")
    await k.job_finish("od-generate", ok=True, succeeded=4)
    merge = await env.wait_for(lambda: batch(env, "od-merge"), what="merge Job")
    summary = {"counts": {"generated": 100, "solved": 95, "verified": 90, "accepted": 80, "duplicates": 6,
                          "rejected": {"infeasible": 5, "nlMismatch": 4}}}
    await k.job_pod(merge, "od-merge-x1", 0, summary=summary)
    await k.job_finish("od-merge", ok=True)
    job = await env.wait_phase("ORDataJob", "od", "Succeeded")
    res = job["status"]["results"]
    assert (res["generated"], res["accepted"], res["duplicates"]) == (100, 80, 6)
    assert res["rejected"] == {"infeasible": 5, "nlMismatch": 4}


async def _progress_is(env: OperatorEnv, name: str, pct: str) -> bool:
    job = await env.job("ORDataJob", name)
    return bool(job and (job.get("status") or {}).get("progress", {}).get("percent") == pct)


async def test_ordata_shard_failure(env: OperatorEnv) -> None:
    k = Kubelet(env.kube)
    await env.apply("ORDataJob", "odf", {"ordata": {"shards": {"numShards": 2}}})
    await env.wait_for(lambda: batch(env, "odf-generate"), what="generate Job")
    await k.job_finish("odf-generate", ok=False)
    job = await env.wait_phase("ORDataJob", "odf", "Failed")
    assert job["status"]["reason"] == "ShardsFailed"


async def test_eval_with_server_per_benchmark(env: OperatorEnv) -> None:
    k = Kubelet(env.kube)
    await env.apply("EvalJob", "ev", {
        "evaluation": {"benchmarks": [{"name": "nl4opt", "path": "/data/nl4opt"},
                                      {"name": "mamo_easy", "path": "/data/mamo"}],
                       "model": {"kind": "openai", "name": "m"}},
        "server": {"image": "vllm/vllm-openai:v0.6.0"}, "podPerBenchmark": True})
    await env.wait_for(lambda: env.objects("apps/v1/deployments"), what="server Deployment")
    await env.wait_for(lambda: _reason(env, "EvalJob", "ev", "WaitingForServer"), what="waiting for server")
    assert env.pods("ev") == []
    await k.deployment_available("ev-server")
    pods = await wait_pods(env, "ev", 2)
    for i, (pod, bench, score) in enumerate(zip(pods, ("nl4opt", "mamo_easy"), (0.5, 0.75), strict=True)):
        await k.run(pod, pod_ip=f"10.0.0.{i + 2}")
        await k.terminate(pod, 0, summary={"benchmarks": {bench: {"passAt1": score, "n": 100}}})
    job = await env.wait_phase("EvalJob", "ev", "Succeeded")
    assert job["status"]["results"]["passAt1"] == pytest.approx(0.625)
    assert job["status"]["results"]["benchmarks"]["nl4opt"]["passAt1"] == 0.5
    await env.wait_for(lambda: not env.objects("apps/v1/deployments") and not [
        s for s in env.objects("v1/services") if s["metadata"]["name"] == "ev-server"], what="server released")
