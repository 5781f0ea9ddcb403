"""Child manifests: strict validation against the Kubernetes schemas, the env contract, rendered configs."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from trex.config_base import load_section
from trex.evaluation.config import EvalConfig
from trex.runtime.env import ENV_VARS, read_env
from trex.trainer.config import TrainerConfig
from trex_operator.defaults import ClusterDefaults
from trex_operator.engine import plan_job
from trex_operator.kinds import bounded_name
from trex_operator.plan import Manifest, Observed
from trex_operator.reconciler import referenced

REPO = Path(__file__).resolve().parents[3]
K8S = "1.33"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
EXAMPLES = sorted([*REPO.glob("examples/*.yaml"), *REPO.glob("examples/quickstart/*.yaml")])


def _succeeded(kind: str, name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "trex.dev/v1alpha1", "kind": kind, "metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": spec or {}, "status": {"phase": "Succeeded"}}


def _body(kind: str, spec: dict[str, Any], name: str = "job") -> dict[str, Any]:
    return {"apiVersion": "trex.dev/v1alpha1", "kind": kind,
            "metadata": {"name": name, "namespace": "ns", "uid": "uid-1", "labels": {"team": "or"}}, "spec": spec}


def all_children(body: dict[str, Any], defaults: ClusterDefaults | None = None) -> list[Manifest]:
    """Every child the planner creates over a job's life (dependencies met, servers ready, shards done)."""
    obs = Observed(now=NOW) if defaults is None else Observed(now=NOW, defaults=defaults)
    examples = {(b["kind"], b["metadata"]["name"]): b for b in example_bodies()}
    for kind, name in referenced(body):  # a referenced example (a KernelTuneJob's shapesFrom) with its own spec
        obs.refs[(kind, name)] = _succeeded(kind, name, (examples.get((kind, name)) or {}).get("spec"))
    out = list(plan_job(body, obs).ensure)
    for m in out:
        if m["kind"] == "Deployment":
            obs.deployments[m["metadata"]["name"]] = {**m, "status": {"availableReplicas": 1}}
        if m["kind"] == "Job":
            obs.batch_jobs[m["metadata"]["name"]] = {**m, "status": {"conditions": [{"type": "Complete",
                                                                                     "status": "True"}]}}
    status = plan_job(body, obs)
    out += [m for m in status.ensure if m["metadata"]["name"] not in {o["metadata"]["name"] for o in out}]
    return out


def example_bodies() -> list[dict[str, Any]]:
    """Every document of the example manifests, with a namespace and uid as the API server would add."""
    bodies = []
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                doc["metadata"].update(namespace="ns", uid="uid-1")
                bodies.append(doc)
    return bodies


TRAIN = {"replicas": 2, "trainer": {"maxSteps": 10}}
BUILT = [
    _body("TrainJob", TRAIN),
    _body("TrainJob", {"replicas": 2, "devicesPerReplica": 8, "deviceType": "npu",
                       "scheduling": {"gang": "volcano", "queue": "q"}, "volumes": {"checkpoints": {"claimName": "ck"}},
                       "dataFrom": {"name": "corpus"}, "kernelsFrom": {"name": "kern"},
                       "trainer": {"parallelism": {"ep": 2}}}),
    _body("TrainJob", {"replicas": 1, "deviceType": "gpu", "devicesPerReplica": 4,
                       "scheduling": {"gang": "kueue", "queue": "lq"}, "trainer": {}}),
    _body("KernelTuneJob", {"kernels": {"backend": "cpu-c"}}),
    _body("ORDataJob", {"ordata": {"shards": {"numShards": 3}}, "volumes": {"output": {"hostPath": "/tmp/x"}}}),
    _body("EvalJob", {"evaluation": {"benchmarks": [{"name": "nl4opt", "path": "/data/a"},
                                                    {"name": "mamo_easy", "path": "/data/b"}],
                                     "model": {"kind": "openai", "name": "m"}},
                      "server": {"image": "vllm/vllm-openai:v0.6.0", "args": ["--served-model-name", "m"]},
                      "modelFrom": {"name": "tj"}, "podPerBenchmark": True}),
]


@pytest.mark.parametrize("body", example_bodies() + BUILT,
                         ids=lambda b: f"{b['kind']}-{b['metadata']['name']}-{len(str(b['spec']))}")
def test_every_child_validates_strictly(body: dict[str, Any]) -> None:
    children = all_children(body)
    kinds = {m["kind"] for m in children}
    assert "ConfigMap" in kinds and ({"Pod", "Job"} & kinds), kinds
    for m in children:
        ref = m["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (body["kind"], body["metadata"]["name"],
                                                                             "uid-1", True)
        if m["kind"] == "PodGroup":  # Volcano CRD: not part of the core schemas
            # the gang: every worker pod of the job (1 where the workers are batch Jobs)
            assert m["spec"]["minMember"] == (len([c for c in children if c["kind"] == "Pod"]) or 1)
            continue
        kubernetes_validate.validate(m, K8S, strict=True)


def _pods(body: dict[str, Any]) -> list[Manifest]:
    return [m for m in all_children(body) if m["kind"] == "Pod"]


def _env(pod: Manifest) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}


def test_train_env_contract_golden() -> None:
    body = copy.deepcopy(BUILT[1])
    pods = sorted(_pods(body), key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["name"] for p in pods] == ["job-worker-0-a0", "job-worker-1-a0"]
    env1 = _env(pods[1])
    assert set(ENV_VARS) <= set(env1)
    assert {k: env1[k] for k in ENV_VARS} == {
        "TREX_JOB_KIND": "TrainJob", "TREX_JOB_NAME": "job", "TREX_ATTEMPT": "0",
        "TREX_CONFIG": "/etc/trex/trainer.yaml", "MASTER_ADDR": "worker-0.job.ns.svc", "MASTER_PORT": "29500",
        "WORLD_SIZE": "16", "RANK": "8", "NNODES": "2", "NODE_RANK": "1", "NPROC_PER_NODE": "8",
        "TREX_METRICS_PORT": "9400",
    }
    assert env1["RANK_TABLE_FILE"] == "/etc/trex/hccl.json"
    parsed = read_env(env1)  # the workloads' reader accepts what the operator writes
    assert (parsed.world_size, parsed.rank, parsed.nproc_per_node, parsed.rank_table_file) == (16, 8, 8,
                                                                                             "/etc/trex/hccl.json")
    c = pods[1]["spec"]["containers"][0]
    assert c["resources"]["limits"]["huawei.com/Ascend910"] == "8" == c["resources"]["requests"]["huawei.com/Ascend910"]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # npu: the image's entrypoint (CANN's set_env.sh) runs the launcher, so the pod gives args, not command
    assert "command" not in c and c["args"][:4] == ["python", "-m", "trex.runtime.launch", "--"]
    assert env1["HCCL_CONNECT_TIMEOUT"] == "1200" and env1["HCCL_LOGIC_SUPERPOD_ID"] == "0"
    assert pods[1]["metadata"]["annotations"]["hccl/rankIndex"] == "1"
    assert pods[1]["spec"]["schedulerName"] == "volcano"
    assert pods[1]["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "job"
    assert pods[1]["spec"]["hostname"] == "worker-1" and pods[1]["spec"]["subdomain"] == "job"
    assert pods[1]["metadata"]["labels"]["team"] == "or"
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/etc/trex", "/etc/trex-kernels", "/checkpoints", "/dev/shm"} <= mounts


def test_kueue_gpu_pod() -> None:
    (pod,) = _pods(copy.deepcopy(BUILT[2]))
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "lq"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert "schedulerName" not in pod["spec"]


def test_trainer_config_round_trips_and_takes_data_from_reference() -> None:
    body = copy.deepcopy(BUILT[1])
    obs = Observed(now=NOW)
    obs.refs[("ORDataJob", "corpus")] = _succeeded("ORDataJob", "corpus", {"ordata": {"output": "or-out"},
                                                                          "volumes": {"output": {"claimName": "p"}}})
    obs.refs[("KernelTuneJob", "kern")] = _succeeded("KernelTuneJob", "kern")
    plan = plan_job(body, obs)
    cm = next(m for m in plan.ensure if m["kind"] == "ConfigMap")
    cfg = load_section(TrainerConfig, yaml.safe_load(cm["data"]["trainer.yaml"])["trainer"])
    expected = load_section(TrainerConfig, body["spec"]["trainer"])
    # The ORDataJob's output volume is mounted read-only at /refs/<job>; training reads its merged text
    # documents (mode pretrain) and never the held-out split.
    assert cfg.data.train == "/refs/corpus/or-out/merged/cpt-*.jsonl"
    assert cfg.checkpoint.dir == "/checkpoints/checkpoints"
    worker = next(m for m in plan.ensure if m["kind"] == "Pod")
    vols = {v["name"]: v for v in worker["spec"]["volumes"]}
    mounts = {m["name"]: m for m in worker["spec"]["containers"][0]["volumeMounts"]}
    assert vols["ref-0"]["persistentVolumeClaim"] == {"claimName": "p", "readOnly": True}
    assert mounts["ref-0"] == {"name": "ref-0", "mountPath": "/refs/corpus", "readOnly": True}
    # kernelsFrom: the registry the KernelTuneJob's ConfigMap (key kernels.json) mounts, named in the config
    assert vols["trex-kernels"]["configMap"]["name"] == "kern-kernels"
    assert cfg.kernels.registry == f"{mounts['trex-kernels']['mountPath']}/kernels.json"
    assert not [e for e in worker["spec"]["containers"][0]["env"] if "KERNELS" in e["name"]]
    excluded = {"data", "checkpoint", "kernels"}
    assert cfg.model_dump(exclude=excluded) == expected.model_dump(exclude=excluded)
    lineage = {(e["kind"], e["name"]) for e in plan.status["lineage"]}
    assert lineage == {("ORDataJob", "corpus"), ("KernelTuneJob", "kern")}


def test_grpo_trainjob_takes_prompts_and_the_sft_trainjobs_export() -> None:
    """mode grpo with dataFrom + modelFrom: the ORDataJob's prompts rendering, the SFT TrainJob's Hugging Face
    export as initial weights and its tokenizer, both volumes mounted read-only, both in the lineage."""
    body = _body("TrainJob", {"dataFrom": {"name": "corpus"}, "modelFrom": {"name": "sft"},
                              "trainer": {"mode": "grpo", "grpo": {"promptsPerStep": 2}}})
    obs = Observed(now=NOW)
    obs.refs[("ORDataJob", "corpus")] = _succeeded("ORDataJob", "corpus", {"ordata": {"output": "or-out"},
                                                                          "volumes": {"output": {"claimName": "p"}}})
    obs.refs[("TrainJob", "sft")] = _succeeded("TrainJob", "sft", {"volumes": {"checkpoints": {"claimName": "ck"}},
                                                                   "trainer": {"checkpoint": {"dir": "run"}}})
    plan = plan_job(body, obs)
    cm = next(m for m in plan.ensure if m["kind"] == "ConfigMap")
    cfg = load_section(TrainerConfig, yaml.safe_load(cm["data"]["trainer.yaml"])["trainer"])
    assert cfg.data.train == "/refs/corpus/or-out/prompts/prompts-*.jsonl"
    assert cfg.checkpoint.init_from_hf == "/refs/sft/run/hf"
    assert cfg.data.tokenizer.path == "/refs/sft/run/hf/tokenizer.json"
    worker = next(m for m in plan.ensure if m["kind"] == "Pod")
    mounts = {m["mountPath"]: m for m in worker["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/refs/corpus"]["readOnly"] and mounts["/refs/sft"]["readOnly"]
    lineage = {(e["kind"], e["name"]): e.get("detail") for e in plan.status["lineage"]}
    assert lineage[("TrainJob", "sft")] == "checkpoint /refs/sft/run/hf"
    # a step the SFT job never exports fails the GRPO job with the reason, before any pod
    body["spec"]["modelFrom"]["step"] = 7
    plan = plan_job(body, obs)
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "DependencyIncompatible")
    assert "exportHfEvery: true" in plan.status["message"]


def test_trainjob_model_from_and_init_from_hf_conflict() -> None:
    from trex_operator.api import TrainJobSpec

    with pytest.raises(ValueError, match=r"trainer\.checkpoint\.initFromHf: modelFrom sets it"):
        TrainJobSpec.model_validate({"modelFrom": {"name": "sft"}, "trainer": {"checkpoint": {"initFromHf": "/w"}}})


def test_trainjob_kernels_from_and_registry_conflict() -> None:
    from trex_operator.api import TrainJobSpec

    with pytest.raises(ValueError, match=r"trainer\.kernels\.registry: kernelsFrom sets it"):
        TrainJobSpec.model_validate({"kernelsFrom": {"name": "kt"}, "trainer": {"kernels": {"registry": "/k.json"}}})


def test_ordata_jobs() -> None:
    jobs = {m["metadata"]["name"]: m for m in all_children(copy.deepcopy(BUILT[4])) if m["kind"] == "Job"}
    gen, merge = jobs["job-generate"], jobs["job-merge"]
    assert gen["spec"]["completionMode"] == "Indexed" and gen["spec"]["completions"] == 3
    assert gen["spec"]["parallelism"] == 3 and gen["spec"]["backoffLimitPerIndex"] == 2
    cmd = gen["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[-4:] == ["--shard-index", "$(JOB_COMPLETION_INDEX)", "--num-shards", "3"]
    assert merge["spec"]["template"]["spec"]["containers"][0]["command"] == ["trex", "ordata", "merge", "/output/ordata-out"]


def test_eval_server_and_pod_per_benchmark() -> None:
    body = copy.deepcopy(BUILT[5])
    body["spec"]["modelFrom"]["step"] = 500
    body["spec"]["volumes"] = {"checkpoints": {"claimName": "ck"}}
    obs = Observed(now=NOW)
    obs.refs[("TrainJob", "tj")] = _succeeded("TrainJob", "tj", {"volumes": {"checkpoints": {"claimName": "ck"}},
                                                                 "trainer": {"checkpoint": {"dir": "run1",
                                                                                            "exportHfEvery": True}}})
    children = plan_job(body, obs).ensure
    dep = next(m for m in children if m["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"] == ["--served-model-name", "m",
                                                                        "/refs/tj/run1/step-00000500/hf"]
    assert dep["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "ref-0", "mountPath": "/refs/tj", "readOnly": True}]
    obs.deployments[dep["metadata"]["name"]] = {**dep, "status": {"availableReplicas": 1}}
    children = plan_job(body, obs).ensure
    pods = sorted((m for m in children if m["kind"] == "Pod"), key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["name"] for p in pods] == ["job-eval-0-a0", "job-eval-1-a0"]
    cm = next(m for m in children if m["kind"] == "ConfigMap")
    cfg = load_section(EvalConfig, yaml.safe_load(cm["data"]["eval-1.yaml"])["evaluation"])
    assert [b.name for b in cfg.benchmarks] == ["mamo_easy"]
    assert cfg.model.url == "http://job-server.ns.svc:8000/v1"


def test_bounded_names() -> None:
    long = "a" * 63
    names = {bounded_name(long, "generate"), bounded_name(long[:-1] + "b", "generate")}
    assert len(names) == 2 and all(len(n) <= 63 and n.endswith("-generate") for n in names)
    assert bounded_name("short", "merge") == "short-merge"


def test_references_without_shareable_storage_keep_the_path() -> None:
    """An emptyDir (or no) output volume cannot be mounted elsewhere: the path stays as the job wrote it."""
    from trex_operator.kinds import ordata_output_ref, train_checkpoint_ref, training_files

    ref, path = ordata_output_ref({"metadata": {"name": "d"}, "spec": {"ordata": {"output": "o"},
                                                                     "volumes": {"output": {"emptyDir": True}}}})
    assert ref is None and path == "/output/o"
    ref, path = ordata_output_ref({"metadata": {"name": "d"}, "spec": {"ordata": {"output": "/elsewhere/o"},
                                                                     "volumes": {"output": {"hostPath": "/h"}}}})
    assert ref is None and path == "/elsewhere/o"
    ref, path = train_checkpoint_ref({"metadata": {"name": "t"}, "spec": {
        "trainer": {"checkpoint": {"dir": "/checkpoints/run"}}, "volumes": {"checkpoints": {"hostPath": "/h"}}}}, 7)
    assert ref is not None and ref.source == {"hostPath": {"path": "/h", "type": "Directory"}}
    assert path == "/refs/t/run/step-00000007"
    assert training_files("/refs/d/o", "sft") == "/refs/d/o/merged/sft-*.jsonl"
    assert training_files("/refs/d/o", "cpt") == "/refs/d/o/merged/cpt-*.jsonl"
    assert training_files("/refs/d/o", "grpo") == "/refs/d/o/prompts/prompts-*.jsonl"
    assert training_files("/refs/d/o", "opd") == "/refs/d/o/prompts/prompts-*.jsonl"


@pytest.mark.parametrize(("step", "checkpoint", "why"), [
    (500, {"dir": "run1"}, "exportHfEvery: true"),
    (250, {"dir": "run1", "exportHfEvery": True, "intervalSteps": 100}, "step 250 is never saved"),
])
def test_eval_model_step_the_trainjob_cannot_serve_fails(step: int, checkpoint: dict[str, Any], why: str) -> None:
    """modelFrom.step needs a per-checkpoint export of a step that was saved: otherwise Failed with the reason."""
    body = copy.deepcopy(BUILT[5])
    body["spec"]["modelFrom"]["step"] = step
    obs = Observed(now=NOW)
    obs.refs[("TrainJob", "tj")] = _succeeded("TrainJob", "tj", {"trainer": {"maxSteps": 1000, "checkpoint": checkpoint}})
    plan = plan_job(body, obs)
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "DependencyIncompatible")
    assert why in plan.status["message"] and not any(m["kind"] in ("Pod", "Deployment") for m in plan.ensure)


def test_eval_model_final_and_last_step() -> None:
    """Without step the final export (<dir>/hf) is served; maxSteps itself is a saved step even off the interval."""
    body = copy.deepcopy(BUILT[5])
    obs = Observed(now=NOW)
    obs.refs[("TrainJob", "tj")] = _succeeded("TrainJob", "tj", {
        "volumes": {"checkpoints": {"claimName": "ck"}},
        "trainer": {"maxSteps": 1050, "checkpoint": {"dir": "run1", "exportHfEvery": True}}})
    for step, path in ((None, "/refs/tj/run1/hf"), (1050, "/refs/tj/run1/step-00001050/hf")):
        body["spec"]["modelFrom"]["step"] = step
        dep = next(m for m in plan_job(body, obs).ensure if m["kind"] == "Deployment")
        assert dep["spec"]["template"]["spec"]["containers"][0]["args"][-1] == path


def test_distillation_teachers_from_train_jobs_are_awaited_mounted_and_recorded() -> None:
    """mode opd with teachers naming TrainJobs: the job waits for them, then each teacher's checkpoint volume is
    mounted read-only at /refs/<teacher> and its path points there; a teacher given by path is left alone."""
    trainer = {"mode": "opd", "model": {"preset": "tiny"},
               "data": {"train": "/data/prompts.jsonl"},
               "opd": {"teachers": [{"name": "math-sft", "weight": 2.0}, {"path": "/models/code"}]}}
    body = _body("TrainJob", {"replicas": 1, "devicesPerReplica": 1, "deviceType": "cpu", "trainer": trainer})
    assert referenced(body) == [("TrainJob", "math-sft")]
    waiting = plan_job(copy.deepcopy(body), Observed(now=NOW, refs={("TrainJob", "math-sft"): None}))
    assert (waiting.status["phase"], waiting.status["reason"]) == ("Pending", "WaitingForDependency")
    obs = Observed(now=NOW)
    obs.refs[("TrainJob", "math-sft")] = _succeeded("TrainJob", "math-sft", {
        "volumes": {"checkpoints": {"claimName": "sft-ck"}}, "trainer": {"checkpoint": {"dir": "run"}}})
    plan = plan_job(copy.deepcopy(body), obs)
    cm = next(m for m in plan.ensure if m["kind"] == "ConfigMap")
    cfg = load_section(TrainerConfig, yaml.safe_load(cm["data"]["trainer.yaml"])["trainer"])
    assert [(t.name, t.path, t.weight) for t in cfg.opd.teachers] == [
        ("math-sft", "/refs/math-sft/run", 2.0), (None, "/models/code", 1.0)]
    assert cfg.opd.teachers[0].label == "math-sft"  # prompts name the teacher as the spec does
    worker = next(m for m in plan.ensure if m["kind"] == "Pod")
    vols = {v["name"]: v for v in worker["spec"]["volumes"]}
    mounts = {m["name"]: m for m in worker["spec"]["containers"][0]["volumeMounts"]}
    assert vols["ref-0"]["persistentVolumeClaim"] == {"claimName": "sft-ck", "readOnly": True}
    assert mounts["ref-0"] == {"name": "ref-0", "mountPath": "/refs/math-sft", "readOnly": True}
    [entry] = plan.status["lineage"]
    assert (entry["kind"], entry["name"], entry["uid"]) == ("TrainJob", "math-sft", "uid-math-sft")
    assert entry["detail"] == "distillation teacher /refs/math-sft/run"
