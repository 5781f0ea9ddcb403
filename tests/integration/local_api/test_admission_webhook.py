"""Admission-time validation through the real kubectl: the chart's ValidatingWebhookConfiguration (here
with webhook.url pointing at the in-process operator, as `trex demo` installs it) makes the API server
call the operator's kopf webhook, which refuses a job the models reject with the line `trex validate`
prints, on create and on update, while valid jobs pass."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_kubectl_helm import HELM, KUBECTL, REPO, Cluster
from trex_operator.local.emulator import OperatorThread
from trex_operator.local.prometheus import free_port

pytestmark = pytest.mark.skipif(not (KUBECTL and HELM), reason="kubectl/helm not installed (make test installs them)")
INVALID = REPO / "examples" / "invalid"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("webhook"))
    port = free_port()
    operator = OperatorThread(c.server.url, interval_s=1.0, metrics_addr=None, webhook_port=port)
    try:
        c.run("helm", "install", "trex", "charts/trex", "--set", f"webhook.url=http://127.0.0.1:{port}")
        operator.start()
        yield c
    finally:
        operator.stop()
        c.server.stop()


def _validate_line(path: Path) -> str:
    res = subprocess.run([sys.executable, "-m", "trex", "validate", str(path)], capture_output=True, text=True,
                         cwd=REPO, check=False)
    assert res.returncode == 1, res.stdout + res.stderr
    line = res.stdout.strip().splitlines()[0]
    return line.split(": ", 1)[1]          # drop the file name: "Kind/name: spec.path: message"


@pytest.mark.parametrize("name", ["04-ep-not-dividing-experts.yaml", "09-npu-devices-per-replica.yaml"])
def test_model_rules_refused_at_apply_with_the_validate_line(guarded: Cluster, name: str) -> None:
    res = guarded.run("kubectl", "apply", "-f", str(INVALID / name), ok=False)
    assert res.returncode != 0
    assert "denied the request" in res.stderr and _validate_line(INVALID / name) in res.stderr, res.stderr


def test_valid_jobs_pass_and_an_invalid_update_is_refused(guarded: Cluster) -> None:
    guarded.run("kubectl", "apply", "-f", "examples/quickstart/trainjob.yaml")
    res = guarded.run("kubectl", "patch", "tj", "quickstart-train", "--type=merge", "-p",
                      json.dumps({"spec": {"replicas": 3, "devicesPerReplica": 2, "deviceType": "gpu",
                                           "trainer": {"model": {"preset": "tiny"}, "parallelism": {"ep": 6}}}}), ok=False)
    assert res.returncode != 0 and "spec.trainer.parallelism" in res.stderr, res.stderr
    spec = json.loads(guarded.run("kubectl", "get", "tj", "quickstart-train", "-o", "json").stdout)["spec"]
    assert "parallelism" not in spec["trainer"]
