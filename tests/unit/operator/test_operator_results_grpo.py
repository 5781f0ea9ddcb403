"""status.results.grpo: a GRPO TrainJob's rank-0 termination summary (written by `trex train` through the real
encoder) becomes the job's status.results.grpo, which `trex demo`'s summary reads back."""

from __future__ import annotations

import datetime as dt
from typing import Any

from trex.telemetry.summary import encode_summary
from trex.trainer.rl.step import GRPOStats
from trex.trainer.rl.step import summary as grpo_summary
from trex_operator.demo import summarise
from trex_operator.engine import plan_job
from trex_operator.plan import Observed

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def _pod(rank: int, message: str) -> dict[str, Any]:
    return {"metadata": {"name": f"tj-worker-{rank}-a0",
                         "labels": {"trex.dev/job-kind": "TrainJob", "trex.dev/job-name": "tj",
                                    "trex.dev/attempt": "0", "trex.dev/replica-index": str(rank)}},
            "spec": {}, "status": {"phase": "Succeeded", "containerStatuses": [
                {"name": "trex", "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": message}}}]}}


def test_grpo_summary_lands_in_status_results() -> None:
    steps = [GRPOStats(reward_mean=0.25, responses=4, outcomes={"no_code": 3, "correct": 1}, rollout_seconds=1.5,
                       verify_seconds=0.25, train_seconds=2.0),
             GRPOStats(reward_mean=0.75, responses=4, outcomes={"correct": 3, "wrong_objective": 1},
                       rollout_seconds=1.25, verify_seconds=0.5, train_seconds=2.5)]
    rank0 = {"kind": "TrainJob", "result": "Succeeded", "step": 2, "maxSteps": 2, "grpo": grpo_summary(steps)}
    body = {"apiVersion": "trex.dev/v1alpha1", "kind": "TrainJob", "metadata": {"name": "tj", "namespace": "ns", "uid": "u"},
            "spec": {"replicas": 2, "trainer": {"mode": "grpo", "maxSteps": 2, "data": {"train": "p.jsonl"}}},
            "status": {"phase": "Running", "attempt": 0, "startTime": "2026-01-01T11:59:00Z"}}
    plan = plan_job(body, Observed(now=NOW, pods=[_pod(0, encode_summary(rank0)),
                                                  _pod(1, encode_summary({"kind": "TrainJob", "step": 2}))]))
    assert plan.status["phase"] == "Succeeded"
    assert plan.status["results"]["grpo"] == {
        "steps": 2, "rewardMeanFirst": 0.25, "rewardMeanLast": 0.75, "responses": 8,
        "outcomes": {"correct": 4, "no_code": 3, "wrong_objective": 1},
        "rolloutSeconds": 2.75, "verifySeconds": 0.75, "trainSeconds": 4.5}
    ok, lines = summarise([{**body, "status": plan.status}], [("TrainJob", "tj")])
    assert ok and lines[-1] == ('  GRPO reward 0.25 -> 0.75 over 8 responses, verifier outcomes {"correct": 4, '
                                '"no_code": 3, "wrong_objective": 1}; time: rollouts 2.75 s, verification 0.75 s, '
                                'loss 4.5 s')
