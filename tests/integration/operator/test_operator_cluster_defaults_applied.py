"""An operator started with the chart's TREX_* env (through Settings.from_env) applies them to the jobs it runs."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import operator_env
import pytest
from operator_env import OperatorEnv
from trex_operator.reconciler import Settings

ENV = {
    "TREX_DEFAULT_IMAGE_CPU": "registry.example.com/trex/cpu:7", "TREX_SCRAPE_ANNOTATIONS": "true",
    "TREX_DEFAULT_GANG": "volcano", "TREX_VOLCANO_ENABLED": "true", "TREX_VOLCANO_DEFAULT_QUEUE": "training",
    "TREX_KUEUE_ENABLED": "false", "TREX_KUEUE_DEFAULT_QUEUE": "",
}


@pytest.fixture
async def env(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[OperatorEnv]:
    def settings(**overrides: Any) -> Settings:
        # the operator's start-up path: everything from the environment, test tunables on top
        return dataclasses.replace(Settings.from_env(ENV), **overrides)

    monkeypatch.setattr(operator_env, "Settings", settings)
    async with OperatorEnv(interval_s=0.2) as e:
        yield e


async def test_operator_applies_cluster_defaults(env: OperatorEnv) -> None:
    await env.apply("TrainJob", "dflt", {"replicas": 2, "metricsPort": 9411, "trainer": {}})
    await env.apply("TrainJob", "kq", {"replicas": 1, "scheduling": {"gang": "kueue", "queue": "lq"}, "trainer": {}})
    await env.wait_for(lambda: len(env.pods("dflt")) == 2, what="2 pods of dflt")
    (pg,) = [o for o in env.objects("scheduling.volcano.sh/v1beta1/podgroups") if o["metadata"]["name"] == "dflt"]
    assert pg["spec"] == {"minMember": 2, "queue": "training"}
    for p in env.pods("dflt"):
        assert p["spec"]["containers"][0]["image"] == "registry.example.com/trex/cpu:7"
        assert p["spec"]["schedulerName"] == "volcano"
        ann = p["metadata"]["annotations"]
        assert ann["scheduling.k8s.io/group-name"] == "dflt"
        assert (ann["prometheus.io/scrape"], ann["prometheus.io/port"], ann["prometheus.io/path"]) == ("true", "9411",
                                                                                                      "/metrics")
    job = await env.wait_phase("TrainJob", "kq", "Failed")
    assert job["status"]["reason"] == "InvalidSpec" and "Kueue disabled" in job["status"]["message"]
    assert env.pods("kq") == []
