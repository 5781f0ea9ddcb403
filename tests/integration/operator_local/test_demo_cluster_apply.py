"""`trex demo --cluster`'s create-or-replace and watch, through the kubernetes Python client and a
kubeconfig, against the kmock API emulator standing in for a cluster (no operator: the jobs stay
Pending and the watch times out)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from trex_operator.api import API_VERSION
from trex_operator.demo import cluster_reachable, load_quickstart, run_cluster
from trex_operator.local.emulator import EmulatorThread

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatorThread]:
    server = EmulatorThread()
    server.start()
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emu",
        "clusters": [{"name": "emu", "cluster": {"server": server.url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "u", "namespace": "demo-ns"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(path))
    try:
        yield server
    finally:
        server.stop()


def test_cluster_path_creates_then_replaces(kubeconfig: EmulatorThread, capsys: pytest.CaptureFixture[str]) -> None:
    assert cluster_reachable()
    docs = load_quickstart(REPO / "examples", quick=True)
    assert run_cluster(docs, None, timeout_s=1.0) == 1          # nothing reconciles them: not Succeeded
    first = capsys.readouterr().out
    assert first.count(" created") == len(docs) == 6 and "namespace demo-ns" in first
    stored = {(res.plural, name): obj.raw for (res, ns, name), obj in kubeconfig.emulator.objects.items()
              if ns == "demo-ns" and not obj.deleted}
    assert {name for _plural, name in stored} == {d["metadata"]["name"] for d in docs}
    train = stored[("trainjobs", "quickstart-train")]
    assert train["apiVersion"] == API_VERSION and train["spec"]["trainer"]["maxSteps"] == 8  # the quick cut

    next(d for d in docs if d["metadata"]["name"] == "quickstart-train")["spec"]["trainer"]["maxSteps"] = 7
    assert run_cluster(docs, None, timeout_s=1.0) == 1
    second = capsys.readouterr().out
    assert second.count(" replaced") == 6
    obj = next(o.raw for (res, ns, name), o in kubeconfig.emulator.objects.items()
               if ns == "demo-ns" and name == "quickstart-train" and not o.deleted)
    assert obj["spec"]["trainer"]["maxSteps"] == 7


def test_unreachable_cluster_is_detected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "u"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert not cluster_reachable()
    assert os.environ["KUBECONFIG"] == str(path)
