"""The local kubelet's pure rules: path rewriting, env materialisation, command resolution and the batch
Job controller's decisions, checked against Kubernetes' documented behaviour written out by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from trex_operator.local.kubelet import (
    JOB_INDEX_ANNOTATION,
    container_env,
    cpu_request,
    expand_vars,
    host_path_dir,
    job_pod_manifest,
    parse_cpu,
    plan_batch_job,
    resolve_command,
    rewrite_paths,
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
