"""Lifecycle decisions of the pure planner: failure classes, gang restarts, backoff, suspend, deadline, TTL, refs."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from trex_operator.engine import plan_job
from trex_operator.lifecycle import classify_pod
from trex_operator.plan import ChildRef, Observed, Plan

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def ts(seconds_ago: float) -> str:
    return (NOW - dt.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def train(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "trex.dev/v1alpha1", "kind": "TrainJob",
                            "metadata": {"name": "tj", "namespace": "ns", "uid": "u1"},
                            "spec": {"replicas": 2, "trainer": {"maxSteps": 100}, **spec}}
    if status is not None:
        body["status"] = status
    return body


def pod(rank: int, phase: str, attempt: int = 0, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": f"tj-worker-{rank}-a{attempt}",
                         "labels": {"trex.dev/job-kind": "TrainJob", "trex.dev/job-name": "tj",
                                    "trex.dev/attempt": str(attempt), "trex.dev/replica-index": str(rank)}},
            "spec": {}, "status": {"phase": phase, **status}}


def exited(code: int, reason: str = "Error", summary: dict[str, Any] | None = None) -> dict[str, Any]:
    term: dict[str, Any] = {"exitCode": code, "reason": reason}
    if summary is not None:
        term["message"] = json.dumps(summary)
    return {"containerStatuses": [{"name": "trex", "state": {"terminated": term}}]}


def run(body: dict[str, Any], pods: list[dict[str, Any]] | None = None, **obs: Any) -> Plan:
    o = Observed(now=NOW, pods=pods or [], **obs)
    return plan_job(body, o)


def deleted_pods(plan: Plan) -> set[str]:
    return {r.name for r in plan.delete if r.kind == "Pod"}


@pytest.mark.parametrize(("status", "cause", "genuine"), [
    ({"phase": "Failed", **exited(1)}, "failure", True),
    ({"phase": "Failed", **exited(137, "OOMKilled")}, "oomKilled", True),
    ({"phase": "Failed", "reason": "Evicted", "message": "low on memory"}, "evicted", False),
    ({"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True",
                                         "reason": "PreemptionByScheduler"}], **exited(137)}, "preempted", False),
    ({"phase": "Unknown"}, "nodeLost", False),
    ({"phase": "Failed", "reason": "NodeLost"}, "nodeLost", False),
    ({"phase": "Pending", "containerStatuses": [{"name": "trex", "state": {"waiting": {"reason": "ErrImagePull"}}}]},
     "imagePull", False),
    ({"phase": "Failed", **exited(2)}, "configError", False),
])
def test_failure_classification(status: dict[str, Any], cause: str, genuine: bool) -> None:
    state = classify_pod({"metadata": {"name": "p"}, "status": status})
    assert (state.phase, state.cause, state.genuine) == ("Failed", cause, genuine)


def test_running_and_succeeded_are_not_failures() -> None:
    assert classify_pod({"status": {"phase": "Running"}}).cause is None
    s = classify_pod({"status": {"phase": "Succeeded", **exited(0, "Completed", {"loss": 1.0})}})
    assert (s.phase, s.summary) == ("Succeeded", {"loss": 1.0})


def test_new_job_creates_all_pods_and_starts() -> None:
    plan = run(train())
    assert sorted(m["metadata"]["name"] for m in plan.ensure if m["kind"] == "Pod") == ["tj-worker-0-a0",
                                                                                         "tj-worker-1-a0"]
    assert plan.status["phase"] == "Starting" and plan.status["startTime"] == ts(0)
    assert [c["type"] for c in plan.status["conditions"] if c["status"] == "True"] == ["Starting"]


def test_all_running_then_all_succeeded() -> None:
    st = {"phase": "Starting", "attempt": 0, "startTime": ts(10)}
    plan = run(train(st), [pod(0, "Running"), pod(1, "Running")])
    assert plan.status["phase"] == "Running" and not plan.ensure[3:]
    done = [pod(0, "Succeeded", **exited(0, "Completed", {"finalLoss": 2.5, "steps": 100})),
            pod(1, "Succeeded", **exited(0, "Completed", {"finalLoss": 9.9}))]
    plan = run(train({**st, "phase": "Running"}), done)
    assert plan.status["phase"] == "Succeeded"
    assert plan.status["results"] == {"finalLoss": 2.5, "steps": 100}  # rank 0's summary wins
    assert plan.status["completionTime"] == ts(0)


def test_genuine_failure_restarts_the_whole_gang_with_resume_step() -> None:
    st = {"phase": "Running", "attempt": 0, "startTime": ts(100), "progress": {"lastCheckpointStep": 40}}
    pods = [pod(0, "Running"), pod(1, "Failed", **exited(1, summary={"lastCheckpointStep": 50}))]
    plan = run(train(st), pods)
    assert deleted_pods(plan) == {"tj-worker-0-a0", "tj-worker-1-a0"}
    assert plan.status["attempt"] == 1 and plan.status["restarts"] == {"failure": 1}
    assert plan.status["progress"]["resumeStep"] == 50
    assert plan.status["phase"] == "Restarting" and plan.restart_causes == ["failure"]
    assert any(e.reason == "GangRestart" and e.type == "Warning" for e in plan.events)
    # next pass: old pods still visible -> deleted again, nothing created yet
    nxt = run(train(plan.status), pods)
    assert not [m for m in nxt.ensure if m["kind"] == "Pod"] and deleted_pods(nxt) == deleted_pods(plan)
    # old pods gone -> attempt 1 pods carry the attempt
    new = run(train(plan.status), [])
    created = [m for m in new.ensure if m["kind"] == "Pod"]
    assert sorted(m["metadata"]["name"] for m in created) == ["tj-worker-0-a1", "tj-worker-1-a1"]
    env = {e["name"]: e.get("value") for e in created[0]["spec"]["containers"][0]["env"]}
    assert env["TREX_ATTEMPT"] == "1" and "TREX_RESUME_STEP" not in env  # resume: the newest verified checkpoint


def test_preemption_does_not_spend_backoff_limit() -> None:
    st = {"phase": "Running", "attempt": 3, "restarts": {"preempted": 3}, "startTime": ts(100)}
    pods = [pod(0, "Running", 3), pod(1, "Failed", 3, reason="Evicted")]
    plan = run(train(st, runPolicy={"backoffLimit": 0}), pods)
    assert plan.status["attempt"] == 4 and plan.status["restarts"] == {"preempted": 3, "evicted": 1}
    assert plan.status["phase"] == "Restarting"


def test_backoff_limit_exhausted_fails_and_cleans_running_pods() -> None:
    st = {"phase": "Running", "attempt": 2, "restarts": {"failure": 1, "oomKilled": 1, "preempted": 5},
          "startTime": ts(100)}
    pods = [pod(0, "Running", 2), pod(1, "Failed", 2, **exited(137, "OOMKilled"))]
    plan = run(train(st, runPolicy={"backoffLimit": 2}), pods)
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "BackoffLimitExceeded"
    assert deleted_pods(plan) == {"tj-worker-0-a2"}  # cleanPodPolicy Running keeps the failed pod
    assert plan.status["attempt"] == 2


def test_clean_pod_policy_all_and_none() -> None:
    st = {"phase": "Failed", "reason": "X", "completionTime": ts(1)}
    pods = [pod(0, "Running"), pod(1, "Failed")]
    assert deleted_pods(run(train(st, runPolicy={"cleanPodPolicy": "All"}), pods)) == {"tj-worker-0-a0",
                                                                                       "tj-worker-1-a0"}
    assert deleted_pods(run(train(st, runPolicy={"cleanPodPolicy": "None"}), pods)) == set()


def test_fatal_image_pull_fails_without_restart() -> None:
    pods = [pod(0, "Pending", containerStatuses=[{"name": "trex", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]),
            pod(1, "Pending")]
    plan = run(train({"phase": "Starting", "attempt": 0, "startTime": ts(5)}), pods)
    assert (plan.status["phase"], plan.status["reason"], plan.status["attempt"]) == ("Failed", "ImagePullError", 0)


def test_suspend_deletes_pods_and_reports_suspended_only_when_gone() -> None:
    st = {"phase": "Running", "attempt": 0, "startTime": ts(100)}
    plan = run(train(st, runPolicy={"suspend": True}), [pod(0, "Running"), pod(1, "Running")])
    assert deleted_pods(plan) == {"tj-worker-0-a0", "tj-worker-1-a0"} and plan.status["phase"] == "Running"
    assert any(m["kind"] == "ConfigMap" for m in plan.ensure)  # config kept
    plan = run(train(plan.status, runPolicy={"suspend": True}), [])
    assert plan.status["phase"] == "Suspended"
    resumed = run(train(plan.status), [])
    assert resumed.status["phase"] == "Starting" and len([m for m in resumed.ensure if m["kind"] == "Pod"]) == 2


def test_active_deadline() -> None:
    st = {"phase": "Running", "attempt": 0, "startTime": ts(61)}
    plan = run(train(st, runPolicy={"activeDeadlineSeconds": 60}), [pod(0, "Running"), pod(1, "Running")])
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "DeadlineExceeded")
    assert deleted_pods(plan) == {"tj-worker-0-a0", "tj-worker-1-a0"}
    ok = run(train({**st, "startTime": ts(59)}, runPolicy={"activeDeadlineSeconds": 60}),
             [pod(0, "Running"), pod(1, "Running")])
    assert ok.status["phase"] == "Running"


def test_ttl_after_finished() -> None:
    done = {"phase": "Succeeded", "completionTime": ts(30)}
    assert run(train(done, runPolicy={"ttlSecondsAfterFinished": 30})).delete_job
    assert not run(train(done, runPolicy={"ttlSecondsAfterFinished": 31})).delete_job
    assert not run(train(done)).delete_job


def test_dependency_wait_timeout_and_failure() -> None:
    body = train(dataFrom={"name": "corpus"}, runPolicy={"dependencyTimeoutSeconds": 60})
    plan = run(body, refs={("ORDataJob", "corpus"): None})
    assert (plan.status["phase"], plan.status["reason"]) == ("Pending", "WaitingForDependency")
    assert not [m for m in plan.ensure if m["kind"] == "Pod"]
    waiting = plan.status
    cond = next(c for c in waiting["conditions"] if c["type"] == "WaitingForDependency")
    assert cond["status"] == "True"
    cond["lastTransitionTime"] = ts(61)
    timed_out = run(train(waiting, dataFrom={"name": "corpus"}, runPolicy={"dependencyTimeoutSeconds": 60}),
                    refs={("ORDataJob", "corpus"): None})
    assert (timed_out.status["phase"], timed_out.status["reason"]) == ("Failed", "DependencyTimeout")
    failed_ref = {"kind": "ORDataJob", "metadata": {"name": "corpus"}, "status": {"phase": "Failed", "reason": "X"}}
    failed = run(body, refs={("ORDataJob", "corpus"): failed_ref})
    assert (failed.status["phase"], failed.status["reason"]) == ("Failed", "DependencyFailed")
    ok_ref = {"kind": "ORDataJob", "metadata": {"name": "corpus", "uid": "c1"}, "spec": {},
              "status": {"phase": "Succeeded"}}
    ok = run(body, refs={("ORDataJob", "corpus"): ok_ref})
    assert ok.status["phase"] == "Starting"
    assert ok.status["lineage"][0]["uid"] == "c1"


def test_invalid_spec_fails_with_reason_field_and_event() -> None:
    plan = run(train(replicas=-3))
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "InvalidSpec")
    assert "spec.replicas" in plan.status["message"]
    assert [e.type for e in plan.events if e.reason == "InvalidSpec"] == ["Warning"]
    assert not plan.ensure


def test_invalid_spec_stays_failed_without_new_events() -> None:
    first = run(train(replicas="two"))
    again = run(train(first.status, replicas="two"))
    assert again.status["phase"] == "Failed" and not again.events and not again.ensure


def test_stale_attempt_pods_are_removed_before_creating() -> None:
    plan = run(train({"phase": "Restarting", "attempt": 1}), [pod(0, "Running", 0)])
    assert deleted_pods(plan) == {"tj-worker-0-a0"} and not [m for m in plan.ensure if m["kind"] == "Pod"]
    assert ChildRef("v1", "Pod", "tj-worker-0-a0") in plan.delete


def test_spec_change_restarts_the_gang_on_the_new_spec() -> None:
    created = [m for m in run(train()).ensure if m["kind"] == "Pod"]
    running = [{**m, "status": {"phase": "Running"}} for m in created]
    st = {"phase": "Running", "attempt": 0, "startTime": ts(10)}
    assert not deleted_pods(run(train(st), running))  # unchanged spec: nothing to do
    plan = run(train(st, image="registry.example/trex:2"), running)
    assert deleted_pods(plan) == {"tj-worker-0-a0", "tj-worker-1-a0"}
    assert (plan.status["attempt"], plan.status["restarts"], plan.status["reason"]) == (1, {"specChanged": 1},
                                                                                      "SpecChanged")
    # not a failure: backoffLimit 0 still allows it
    assert run(train(st, image="registry.example/trex:2", runPolicy={"backoffLimit": 0}), running).status["attempt"] == 1


def test_trainer_config_change_restarts_but_rank_table_progress_does_not() -> None:
    created = [m for m in run(train()).ensure if m["kind"] == "Pod"]
    running = [{**m, "status": {"phase": "Running"}} for m in created]
    st = {"phase": "Running", "attempt": 0, "startTime": ts(10)}
    plan = run(train(st, trainer={"maxSteps": 200}), running)
    assert (plan.status["attempt"], plan.status["reason"]) == (1, "SpecChanged")
    assert not deleted_pods(run(train({**st, "progress": {"step": 5}}), running))
