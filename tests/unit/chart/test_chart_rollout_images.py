"""The chart's workloads.rolloutImages reach the operator (TREX_DEFAULT_ROLLOUT_IMAGE_*) and the rollout servers it
renders; empty values keep the built-in vLLM / vllm-ascend images."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from trex_chart_helpers import by_kind, helm, helm_available, render
from trex_operator.defaults import ClusterDefaults
from trex_operator.engine import plan_job
from trex_operator.plan import Observed

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _operator_env(objs: list[dict[str, Any]]) -> dict[str, str]:
    [deploy] = by_kind(objs, "Deployment")  # the operator's
    [container] = deploy["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e and e["name"].startswith("TREX_")}


def _server_image(env: dict[str, str], device_type: str, **server: Any) -> str:
    spec: dict[str, Any] = {
        "deviceType": device_type, "volumes": {"checkpoints": {"claimName": "ck"}},
        "rollout": {"server": {"devicesPerReplica": 1, **server}},
        "trainer": {"mode": "grpo", "data": {"train": "/data/p.jsonl"}, "checkpoint": {"initFromHf": "/checkpoints/hf"}}}
    if device_type == "npu":
        spec["scheduling"] = {"gang": "volcano"}
    body = {"apiVersion": "trex.dev/v1alpha1", "kind": "TrainJob", "metadata": {"name": "tj", "namespace": "ns",
                                                                                "uid": "u"}, "spec": spec}
    plan = plan_job(body, Observed(now=NOW, defaults=ClusterDefaults.from_env(env)))
    assert plan.status["phase"] != "Failed", plan.status
    [dep] = [m for m in plan.ensure if m["kind"] == "Deployment"]
    image: str = dep["spec"]["template"]["spec"]["containers"][0]["image"]
    return image


def test_rollout_images_from_the_chart_reach_the_servers(tmp_path: Path) -> None:
    helm_available()
    mirror = "registry.example.com/mirror/vllm-ascend:v0.23.0"
    env = _operator_env(render({"workloads": {"rolloutImages": {"npu": mirror}}, "volcano": {"enabled": True}}, tmp_path))
    assert env["TREX_DEFAULT_ROLLOUT_IMAGE_NPU"] == mirror and env["TREX_DEFAULT_ROLLOUT_IMAGE_GPU"] == ""
    assert _server_image(env, "npu") == mirror
    assert _server_image(env, "gpu") == "vllm/vllm-openai:v0.32.0"  # empty value: the built-in image
    assert _server_image(env, "npu", image="my/vllm:1") == "my/vllm:1"  # the job's own image wins


def test_a_bad_rollout_image_is_refused_by_the_values_schema(tmp_path: Path) -> None:
    helm_available()
    res = helm("template", "t", str(Path(__file__).resolve().parents[3] / "charts" / "trex"),
               values={"workloads": {"rolloutImages": {"gpu": "not an image"}}}, tmp=tmp_path)
    assert res.returncode != 0 and "rolloutImages" in res.stderr
