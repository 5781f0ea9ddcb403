"""Every API request the operator makes is covered by trex_operator.rbac.RULES, and every rule is used."""

from __future__ import annotations

import json

import kubernetes_validate
from kubelet import Kubelet
from operator_env import OperatorEnv
from trex_operator import rbac

ANN = "ascend.kubectl.kubernetes.io/ascend-910-configuration"


def _verb(method: str, action: str, has_name: bool) -> str:
    if method == "GET":
        return "watch" if action == "watch" else ("get" if has_name else "list")
    if method == "DELETE":
        return "delete" if has_name else "deletecollection"
    return {"POST": "create", "PATCH": "patch", "PUT": "update"}[method]


async def test_requests_match_rbac_rules() -> None:
    async with OperatorEnv(interval_s=0.2) as env:
        assert env.kube is not None
        k = Kubelet(env.kube)
        ttl = {"ttlSecondsAfterFinished": 0}
        await env.kube.create({"apiVersion": "v1", "kind": "Node",
                               "metadata": {"name": "n0", "labels": {"accelerator-type": "module-910b-8"}}})
        await env.apply("KernelTuneJob", "kt", {"kernels": {"backend": "cpu-c"}})
        await env.wait_for(lambda: len(env.pods("kt")) == 1, what="kt pod")
        await k.terminate("kt-cpu-c-a0", 0, summary={"kernels": {"matmul": {"speedup": 1.5}}})
        await env.wait_phase("KernelTuneJob", "kt", "Succeeded")
        # stray children with the deterministic names and the job labels, not (yet) managed: adopted (409 -> get)
        stray = {"trex.dev/job-kind": "TrainJob", "trex.dev/job-name": "tj"}
        await env.kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "tj-worker-0-a0", "namespace": "default", "labels": stray}, "spec": {}})
        await env.kube.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": "od-generate", "namespace": "default",
            "labels": {"trex.dev/job-kind": "ORDataJob", "trex.dev/job-name": "od"}}, "spec": {}})
        await env.apply("TrainJob", "tj", {
            "replicas": 1, "devicesPerReplica": 2, "deviceType": "npu", "kernelsFrom": {"name": "kt"},
            "scheduling": {"gang": "volcano"}, "runPolicy": {**ttl, "cleanPodPolicy": "All"}, "trainer": {}})
        await env.apply("EvalJob", "ev", {"evaluation": {"benchmarks": [{"name": "nl4opt", "path": "/d"}],
                                                         "model": {"kind": "openai", "name": "m"}},
                                          "server": {"image": "vllm/vllm-openai:v0.6.0"}, "runPolicy": ttl})
        await env.apply("ORDataJob", "od", {"ordata": {"shards": {"numShards": 1}}, "runPolicy": ttl})
        await env.wait_for(lambda: env.objects("scheduling.volcano.sh/v1beta1/podgroups"), what="PodGroup")
        await env.wait_for(lambda: env.objects("apps/v1/deployments"), what="server")
        await env.wait_phase("ORDataJob", "od", "Starting")
        managed = {"app.kubernetes.io/managed-by": "trex-operator"}
        await env.kube.patch("v1", "Pod", "default", "tj-worker-0-a0", {"metadata": {"labels": {
            **managed, "trex.dev/attempt": "0", "trex.dev/replica-index": "0"}}})
        await env.kube.patch("batch/v1", "Job", "default", "od-generate", {"metadata": {"labels": managed}})
        # a restarted operator re-ensures every child: creates answer 409 and are adopted
        await env.restart_operator()
        instance = {"server_id": "10.0.0.9", "devices": [{"device_id": "0", "device_ip": "1.1.1.1"},
                                                          {"device_id": "1", "device_ip": "1.1.1.2"}]}
        await k.schedule("tj-worker-0-a0", "n0", {ANN: json.dumps(instance)})
        await env.wait_for(lambda: _table_done(env), what="rank table completed")
        await k.run("tj-worker-0-a0")
        await k.terminate("tj-worker-0-a0", 0)
        await env.wait_for(lambda: _gone(env, "TrainJob", "tj"), what="TTL deletion")
        # suspend deletes the generate Job; resuming recreates it; then generation and merge finish
        await env.patch_spec("ORDataJob", "od", {"runPolicy": {"suspend": True}})
        await env.wait_phase("ORDataJob", "od", "Suspended")
        await env.patch_spec("ORDataJob", "od", {"runPolicy": {"suspend": False}})
        await env.wait_for(lambda: [j for j in env.objects("batch/v1/jobs") if j["metadata"]["name"] == "od-generate"],
                           what="generate Job recreated")
        await k.job_finish("od-generate", ok=True)
        await env.wait_for(lambda: [j for j in env.objects("batch/v1/jobs") if j["metadata"]["name"] == "od-merge"],
                           what="merge Job")
        await k.job_finish("od-merge", ok=True)
        await env.wait_for(lambda: _gone(env, "ORDataJob", "od"), what="ORDataJob TTL deletion")
        await env.apply("KernelTuneJob", "kt2", {"kernels": {"backend": "cpu-c"}, "runPolicy": ttl})
        await env.wait_for(lambda: len(env.pods("kt2")) == 1, what="kt2 pod")
        await k.terminate("kt2-cpu-c-a0", 0, summary={"kernels": {}})
        await env.wait_for(lambda: _gone(env, "KernelTuneJob", "kt2"), what="KernelTuneJob TTL deletion")
        await k.deployment_available("ev-server")
        await env.wait_for(lambda: len(env.pods("ev")) == 1, what="eval pod")
        await k.terminate("ev-eval-a0", 0, summary={"benchmarks": {"nl4opt": {"passAt1": 1.0}}})
        await env.wait_for(lambda: _gone(env, "EvalJob", "ev"), what="EvalJob TTL deletion")
        await env.wait_for(lambda: not env.objects("apps/v1/deployments"), what="server released")
        await env.stop_operator()
        used: set[tuple[str, str, str]] = set()
        for r in list(env.emulator._requests):
            if r.resource is None or r.resource.plural is None:
                continue  # discovery (non-resource URLs)
            if not str(r.headers.get("User-Agent", "")).startswith(("trex-operator", "kopf/")):
                continue  # the test's own requests (users, kubelet)
            res = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
            method = str(getattr(r.method, "value", r.method)).upper()
            watch = r.params.get("watch") in ("true", "1", "True")
            used.add((r.resource.group or "", res, _verb(method, "watch" if watch else "", r.name is not None)))
    uncovered = sorted(u for u in used if not rbac.covers(*u))
    assert not uncovered, f"requests not covered by rbac.RULES: {uncovered}"
    unused = sorted((r.api_group, r.resource, v) for r in rbac.RULES for v in r.verbs
                    if (r.api_group, r.resource, v) not in used)
    assert not unused, f"rules never used: {unused}"
    kubernetes_validate.validate(rbac.cluster_role(), "1.33", strict=True)


async def _table_done(env: OperatorEnv) -> bool:
    cms = [c for c in env.objects("v1/configmaps") if c["metadata"]["name"] == "tj-config"]
    return bool(cms) and json.loads(cms[0]["data"]["hccl.json"])["status"] == "completed"


async def _gone(env: OperatorEnv, kind: str, name: str) -> bool:
    return await env.job(kind, name) is None
