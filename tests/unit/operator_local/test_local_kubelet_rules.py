"""The local kubelet's pure rules: path rewriting, env materialisation, command resolution and the batch
Job controller's decisions, checked against Kubernetes' documented behaviour written out by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from trex_operator.local.kubelet import (
    JOB_INDEX_ANNOTATION,
    VLLM_CLI,
    PodAddress,
    Probe,
    bind_pod_ip,
    container_argv,
    container_env,
    cpu_request,
    deployment_pod_manifest,
    dns_table,
    expand_vars,
    host_path_dir,
    is_vllm_image,
    job_pod_manifest,
    parse_cpu,
    plan_batch_job,
    plan_deployment,
    readiness_probe,
    resolve_command,
    restart_backoff,
    rewrite_hosts,
    rewrite_paths,
    run_probe,
    service_hostname,
    termination_message,
)

NOW = "2026-01-01T00:00:00Z"
MOUNTS = [("/output", "/w/out"), ("/etc/trex", "/w/cfg"), ("/refs/a", "/w/hp/a"), ("/refs/ab", "/w/hp/ab")]


@pytest.mark.parametrize(("text", "expected"), [
    ("/output", "/w/out"),
    ("/output/x/y.jsonl", "/w/out/x/y.jsonl"),
    ("--config /etc/trex/trainer.yaml", "--config /w/cfg/trainer.yaml"),
    ("train: /refs/a/q/merged/sft-*.jsonl", "train: /w/hp/a/q/merged/sft-*.jsonl"),
    ("/refs/ab/z", "/w/hp/ab/z"),            # the longer mount wins, not /refs/a + "b/z"
    ("/outputs/x", "/outputs/x"),            # not a path-component match
    ("/x/output/y", "/x/output/y"),          # not at the start of a path
    ("'/output'", "'/w/out'"),
    ("dir=/output:/etc/trex", "dir=/w/out:/w/cfg"),
    ("/output.bak", "/output.bak"),
])
def test_rewrite_paths_whole_components(text: str, expected: str) -> None:
    assert rewrite_paths(text, MOUNTS) == expected


def test_rewrite_paths_does_not_rewrite_replacements() -> None:
    # /w/out itself contains no mount path, but a mount whose folder contains another mount path must
    # not be rewritten twice.
    assert rewrite_paths("/a/b", [("/a", "/x/a"), ("/x", "/never")]) == "/x/a/b"


def test_host_path_dir_is_shared_and_confined(tmp_path: Path) -> None:
    assert host_path_dir(tmp_path, "/var/lib/trex/q") == tmp_path / "hostpath" / "var" / "lib" / "trex" / "q"
    assert host_path_dir(tmp_path, "/var/lib/../../etc").is_relative_to(tmp_path)


@pytest.mark.parametrize(("text", "expected"), [
    ("$(A)-$(B)", "1-2"), ("$$(A)", "$(A)"), ("$(MISSING)", "$(MISSING)"), ("$A", "$A"), ("x$(A)y", "x1y"),
])
def test_expand_vars_kubernetes_semantics(text: str, expected: str) -> None:
    assert expand_vars(text, {"A": "1", "B": "2"}) == expected


def test_resolve_command_maps_programs_only() -> None:
    py = "/venv/bin/python"
    assert resolve_command(["trex", "train", "--config", "trex"], py) == [py, "-m", "trex", "train", "--config", "trex"]
    assert resolve_command(["python", "-m", "trex.runtime.launch", "--", "trex", "eval"], py) == \
        [py, "-m", "trex.runtime.launch", "--", py, "-m", "trex", "eval"]
    assert resolve_command(["/bin/sh", "-c", "python x.py"], py) == ["/bin/sh", "-c", "python x.py"]


def _pod() -> dict[str, Any]:
    return {"metadata": {"name": "p0", "namespace": "ns", "uid": "u1", "labels": {"app": "x"}}, "spec": {}}


def test_container_env_order_fieldref_and_configmap() -> None:
    container = {"env": [
        {"name": "A", "value": "a"},
        {"name": "B", "value": "$(A)-$(POD_IP)"},          # POD_IP defined later: stays literal
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "C", "value": "$(POD_IP):9400"},
        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
        {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "nope", "optional": True}}},
    ]}
    env = container_env(_pod(), container, "127.9.0.3", extra={"JOB_COMPLETION_INDEX": "1"},
                        config_maps={"cm": {"k": "v"}})
    assert env == {"JOB_COMPLETION_INDEX": "1", "A": "a", "B": "a-$(POD_IP)", "POD_IP": "127.9.0.3",
                   "C": "127.9.0.3:9400", "NAME": "p0", "APP": "x", "K": "v"}


def test_container_env_errors_name_the_variable() -> None:
    with pytest.raises(ValueError, match="env K: configMapKeyRef cm/k not found"):
        container_env(_pod(), {"env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]},
                      "127.0.0.2")
    with pytest.raises(ValueError, match=r"status\.phase"):
        container_env(_pod(), {"env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "status.phase"}}}]},
                      "127.0.0.2")
    with pytest.raises(ValueError, match="env S: valueFrom"):
        container_env(_pod(), {"env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
                      "127.0.0.2")


@pytest.mark.parametrize(("addr", "expected"), [
    ("worker-0.job.default.svc", ("worker-0", "job")), ("worker-0.job", ("worker-0", "job")),
    ("127.0.0.1", None), ("localhost", None), ("::1", None),
])
def test_service_hostname(addr: str, expected: tuple[str, str] | None) -> None:
    assert service_hostname(addr) == expected


def test_termination_message_file_then_log_fallback() -> None:
    log = "\n".join(f"line {i}" for i in range(200))
    assert termination_message('{"a":1}', log, 1, "FallbackToLogsOnError") == '{"a":1}'
    fallback = termination_message(None, log, 1, "FallbackToLogsOnError")
    assert fallback is not None and fallback.splitlines() == [f"line {i}" for i in range(120, 200)]
    assert termination_message(None, log, 0, "FallbackToLogsOnError") is None
    assert termination_message(None, log, 1, "File") is None
    assert len(termination_message("x" * 5000, "", 0, "File") or "") == 4096


# ---- the batch Job controller ----------------------------------------------------------------


def _job(indexed: bool, completions: int, parallelism: int, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"completions": completions, "parallelism": parallelism,
                            "template": {"metadata": {"labels": {"trex.dev/job-name": "j"}},
                                         "spec": {"restartPolicy": "Never",
                                                  "containers": [{"name": "trex", "image": "img",
                                                                  "command": ["trex", "x", "$(JOB_COMPLETION_INDEX)"],
                                                                  "env": [{"name": "A", "value": "1"}]}]}}}
    if indexed:
        spec["completionMode"] = "Indexed"
    spec.update(extra)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "gen", "namespace": "ns", "uid": "u"},
            "spec": spec}


def _p(index: int, phase: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {JOB_INDEX_ANNOTATION: str(index)}}, "status": {"phase": phase}}


def test_indexed_job_respects_parallelism_and_completes() -> None:
    job = _job(True, 3, 2, backoffLimitPerIndex=1)
    assert plan_batch_job(job, [], NOW).create == [0, 1]
    d = plan_batch_job(job, [_p(0, "Succeeded"), _p(1, "Running")], NOW)
    assert d.create == [2] and d.status["succeeded"] == 1 and d.status["active"] == 1 and not d.terminal
    d = plan_batch_job(job, [_p(0, "Succeeded"), _p(1, "Succeeded"), _p(2, "Succeeded")], NOW)
    assert d.terminal and d.create == []
    assert d.status["completedIndexes"] == "0-2" and d.status["succeeded"] == 3
    assert [c["type"] for c in d.status["conditions"]] == ["Complete"]


def test_indexed_job_retries_an_index_then_fails_it() -> None:
    job = _job(True, 2, 2, backoffLimitPerIndex=1)
    d = plan_batch_job(job, [_p(0, "Failed"), _p(1, "Succeeded")], NOW)
    assert d.create == [0] and not d.terminal                       # one retry allowed
    d = plan_batch_job(job, [_p(0, "Failed"), _p(0, "Failed"), _p(1, "Running")], NOW)
    assert d.create == [] and not d.terminal and d.status["failedIndexes"] == "0"  # waits for index 1
    d = plan_batch_job(job, [_p(0, "Failed"), _p(0, "Failed"), _p(1, "Succeeded")], NOW)
    assert d.terminal and d.status["conditions"][0]["type"] == "Failed"
    assert d.status["failedIndexes"] == "0" and d.status["completedIndexes"] == "1"


def test_non_indexed_job_backoff_limit() -> None:
    job = _job(False, 1, 1, backoffLimit=1)
    assert plan_batch_job(job, [], NOW).create == [0]
    d = plan_batch_job(job, [_p(0, "Failed")], NOW)
    assert d.create == [1] and not d.terminal
    d = plan_batch_job(job, [_p(0, "Failed"), _p(1, "Failed")], NOW)
    assert d.terminal and d.status["conditions"][0]["reason"] == "BackoffLimitExceeded"
    d = plan_batch_job(job, [_p(0, "Failed"), _p(1, "Succeeded")], NOW)
    assert d.terminal and d.status["conditions"][0]["type"] == "Complete" and d.status["succeeded"] == 1


def test_terminal_job_is_left_alone() -> None:
    job = _job(False, 1, 1)
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}
    d = plan_batch_job(job, [], NOW)
    assert d.terminal and d.create == [] and d.status == job["status"]


def test_job_pod_manifest_is_a_valid_pod_with_the_index() -> None:
    job = _job(True, 2, 2)
    pod = job_pod_manifest(job, 1, 0)
    kubernetes_validate.validate(pod, "1.33", strict=True)
    env = pod["spec"]["containers"][0]["env"]
    assert env[0] == {"name": "JOB_COMPLETION_INDEX", "value": "1"} and env[1] == {"name": "A", "value": "1"}
    assert pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "gen"
    assert pod["metadata"]["labels"]["trex.dev/job-name"] == "j"
    assert pod["metadata"]["annotations"][JOB_INDEX_ANNOTATION] == "1"
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
    assert job_pod_manifest(job, 1, 1)["metadata"]["name"] != pod["metadata"]["name"]
    assert "JOB_COMPLETION_INDEX" not in str(job_pod_manifest(_job(False, 1, 1), 0, 0)["spec"]["containers"][0]["env"])


@pytest.mark.parametrize(("quantity", "cpus"), [("2", 2.0), ("500m", 0.5), (1.5, 1.5), ("0.25", 0.25), (3, 3.0)])
def test_parse_cpu_quantities(quantity: Any, cpus: float) -> None:
    assert parse_cpu(quantity) == cpus


def test_cpu_request_precedence_and_errors() -> None:
    assert cpu_request({}) == 1.0
    assert cpu_request({"resources": {"limits": {"cpu": "4"}}}) == 4.0
    assert cpu_request({"resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "4"}}}) == 0.25
    with pytest.raises(ValueError, match="2Gi"):
        cpu_request({"resources": {"requests": {"cpu": "2Gi"}}})


# ---- Deployments, model-server images, readiness, cluster DNS ----------------------------------------


def test_vllm_images_run_their_entrypoint_from_the_vllm_environment() -> None:
    for image in ("vllm/vllm-openai:v0.11.0", "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0",
                  "quay.io/ascend/vllm-ascend:v0.23-a3", "docker.io/vllm/vllm-openai@sha256:ab"):
        assert is_vllm_image(image), image
    for image in ("ghcr.io/trex-dev/trex:1", "vllm/trex:1", "img", ""):
        assert not is_vllm_image(image), image
    # no command: a vLLM image's ENTRYPOINT (vllm serve) runs the args; another image's entrypoint is unknown
    assert container_argv({"image": "vllm/vllm-openai:v1", "args": ["/m", "--port", "8000"]}) == \
        ["vllm", "serve", "/m", "--port", "8000"]
    assert container_argv({"image": "img", "args": ["x"]}) == []
    assert container_argv({"image": "vllm/vllm-openai", "command": ["vllm", "serve"], "args": ["/m"]}) == \
        ["vllm", "serve", "/m"]
    py, vpy = "/venv/bin/python", "/vllm/bin/python"
    assert resolve_command(["vllm", "serve", "/m", "vllm"], py, vpy) == [vpy, "-c", VLLM_CLI, "serve", "/m", "vllm"]
    assert "ServeSubcommand" in VLLM_CLI
    assert resolve_command(["python", "-m", "vllm.entrypoints.openai.api_server"], py, vpy) == \
        [vpy, "-m", "vllm.entrypoints.openai.api_server"]
    assert resolve_command(["vllm", "serve"], py) == ["vllm", "serve"]  # not a vLLM container: left alone


def test_bind_pod_ip_gives_each_server_its_own_address() -> None:
    assert bind_pod_ip(["vllm", "serve", "/m", "--host", "0.0.0.0"], "127.9.0.3", True) == \
        ["vllm", "serve", "/m", "--host", "127.9.0.3"]
    assert bind_pod_ip(["vllm", "serve", "/m", "--host=0.0.0.0"], "127.9.0.3", True)[-1] == "--host=127.9.0.3"
    assert bind_pod_ip(["vllm", "serve", "/m"], "127.9.0.3", True) == ["vllm", "serve", "/m", "--host", "127.9.0.3"]
    assert bind_pod_ip(["vllm", "serve", "--host", "127.0.0.1"], "127.9.0.3", True) == \
        ["vllm", "serve", "--host", "127.0.0.1"]
    assert bind_pod_ip(["python", "x.py", "0.0.0.0:80"], "127.9.0.3", False) == ["python", "x.py", "0.0.0.0:80"]


def test_cluster_dns_names_resolve_to_pods() -> None:
    pods = [PodAddress("srv-abc", "127.9.0.5", {"app": "eval", "role": "server"}, ready=False),
            PodAddress("srv-def", "127.9.0.6", {"app": "eval", "role": "server"}, ready=True),
            PodAddress("roll-0", "127.9.0.7", {"role": "server"}, hostname="rollout-0", subdomain="j-rollout"),
            PodAddress("other", "127.9.0.8", {"app": "x"})]
    services = [{"metadata": {"name": "eval-server"}, "spec": {"selector": {"app": "eval", "role": "server"}}},
                {"metadata": {"name": "empty"}, "spec": {"selector": {"app": "none"}}},
                {"metadata": {"name": "no-selector"}, "spec": {}}]
    table = dns_table("ns", services, pods)
    # a Service resolves to a pod it selects, a ready one first; a headless pod name to that pod
    assert table["eval-server.ns.svc"] == table["eval-server"] == "127.9.0.6"
    assert table["eval-server.ns.svc.cluster.local"] == "127.9.0.6"
    assert table["rollout-0.j-rollout.ns.svc"] == "127.9.0.7"
    assert "empty.ns.svc" not in table and "no-selector.ns.svc" not in table
    text = ("servers: [http://rollout-0.j-rollout.ns.svc:8000]\nurl: http://eval-server.ns.svc.cluster.local:80/v1\n"
            "keep: example.com/a.svcx notes.svc.txt")
    out, missing = rewrite_hosts(text, table)
    assert out == ("servers: [http://127.9.0.7:8000]\nurl: http://127.9.0.6:80/v1\n"
                   "keep: example.com/a.svcx notes.svc.txt")
    assert missing == []
    assert rewrite_hosts("http://rollout-1.j-rollout.ns.svc:8000", table) == (
        "http://rollout-1.j-rollout.ns.svc:8000", ["rollout-1.j-rollout.ns.svc"])


def test_readiness_probes() -> None:
    assert readiness_probe({}) is None
    c = {"ports": [{"name": "http", "containerPort": 8000}],
         "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 3}}
    assert readiness_probe(c) == Probe(port=8000, path="/health", period_s=3.0)
    assert readiness_probe({"readinessProbe": {"tcpSocket": {"port": 81}, "initialDelaySeconds": 5}}) == \
        Probe(port=81, path=None, initial_delay_s=5.0)
    with pytest.raises(ValueError, match="readinessProbe: only httpGet and tcpSocket"):
        readiness_probe({"readinessProbe": {"exec": {"command": ["true"]}}})
    with pytest.raises(ValueError, match="port 'web' is not a named port"):
        readiness_probe({"readinessProbe": {"httpGet": {"port": "web"}}})
    # the kubelet's restart back-off: 10 s doubling, capped at 5 minutes
    assert [restart_backoff(n) for n in (1, 2, 3, 6, 20)] == [10.0, 20.0, 40.0, 300.0, 300.0]


def test_run_probe_against_a_real_socket() -> None:
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert run_probe("127.0.0.1", Probe(port=port, path="/health"))
        assert not run_probe("127.0.0.1", Probe(port=port, path="/loading"))
        assert run_probe("127.0.0.1", Probe(port=port))
    finally:
        server.shutdown()
        server.server_close()
    assert not run_probe("127.0.0.1", Probe(port=port, path="/health"))  # refused
    assert not run_probe("127.0.0.1", Probe(port=port))


def _deployment(replicas: int = 1, image: str = "vllm/vllm-openai:v1") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "srv", "namespace": "ns", "uid": "d1", "generation": 2},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "srv"}},
                     "template": {"metadata": {"labels": {"app": "srv"}},
                                  "spec": {"containers": [{"name": "server", "image": image, "args": ["/m"]}]}}}}


def _dpod(dep: dict[str, Any], name: str, ready: bool, phase: str = "Running", created: str = NOW) -> dict[str, Any]:
    pod = deployment_pod_manifest(dep)
    pod["metadata"].update(name=name, creationTimestamp=created)
    pod["status"] = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return pod


def test_deployment_pod_manifest_is_a_valid_owned_pod() -> None:
    dep = _deployment()
    pod = deployment_pod_manifest(dep)
    kubernetes_validate.validate(pod, "1.33", strict=True)
    assert pod["metadata"]["generateName"].startswith("srv-") and pod["spec"]["restartPolicy"] == "Always"
    assert pod["metadata"]["labels"]["app"] == "srv" and pod["metadata"]["labels"]["pod-template-hash"]
    assert pod["metadata"]["ownerReferences"] == [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "srv",
                                                   "uid": "d1", "controller": True, "blockOwnerDeletion": True}]
    other = deployment_pod_manifest(_deployment(image="vllm/vllm-openai:v2"))
    assert other["metadata"]["labels"]["pod-template-hash"] != pod["metadata"]["labels"]["pod-template-hash"]


def test_deployment_controller_keeps_replicas_and_reports_readiness() -> None:
    dep = _deployment(replicas=2)
    d = plan_deployment(dep, [], NOW)
    assert (d.create, d.delete) == (2, [])
    assert {k: d.status[k] for k in ("replicas", "readyReplicas", "availableReplicas", "observedGeneration")} == {
        "replicas": 0, "readyReplicas": 0, "availableReplicas": 0, "observedGeneration": 2}
    assert d.status["conditions"][0]["status"] == "False"
    pods = [_dpod(dep, "a", True), _dpod(dep, "b", False)]
    d = plan_deployment(dep, pods, NOW)
    assert (d.create, d.delete, d.status["readyReplicas"], d.status["availableReplicas"]) == (0, [], 1, 1)
    assert d.status["conditions"][0]["status"] == "False"  # 1 of 2
    pods[1]["status"]["conditions"][0]["status"] = "True"
    d = plan_deployment(dep, pods, "2026-01-01T00:01:00Z")
    assert d.status["availableReplicas"] == 2 and d.status["conditions"][0]["status"] == "True"
    # the condition keeps its transition time while its status holds
    dep["status"] = d.status
    assert plan_deployment(dep, pods, "2026-01-01T00:09:00Z").status == d.status
    # scaled down to 1: the not-ready / newest extra pod goes first
    pods[1]["status"]["conditions"][0]["status"] = "False"
    one = _deployment(replicas=1)
    d = plan_deployment(one, pods, NOW)
    assert (d.create, d.delete, d.status["replicas"]) == (0, ["b"], 1)


def test_deployment_controller_replaces_old_template_and_ended_pods() -> None:
    dep = _deployment()
    old = _dpod(_deployment(image="vllm/vllm-openai:v0"), "old", True)
    d = plan_deployment(dep, [old], NOW)
    assert (d.create, d.delete, d.status["availableReplicas"]) == (1, ["old"], 0)
    evicted = _dpod(dep, "ev", False, phase="Failed")
    d = plan_deployment(dep, [evicted], NOW)
    assert (d.create, d.delete) == (1, ["ev"])
    going = _dpod(dep, "going", True)
    going["metadata"]["deletionTimestamp"] = NOW
    assert plan_deployment(dep, [going], NOW).create == 1
    assert plan_deployment({**dep, "spec": {**dep["spec"], "replicas": 0}}, [_dpod(dep, "x", True)], NOW).delete == ["x"]
