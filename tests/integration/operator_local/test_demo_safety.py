"""`trex demo` never touches the cluster in KUBECONFIG unless --cluster is given, and with --cluster it
names the context and server before it applies anything. The "cluster" is a reachable local API server
that counts every request it gets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from trex_operator import demo
from trex_operator.local.emulator import EmulatorThread


@pytest.fixture
def real_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatorThread]:
    server = EmulatorThread()
    server.start()
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "prod-eu",
        "clusters": [{"name": "prod", "cluster": {"server": server.url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "prod-eu", "context": {"cluster": "prod", "user": "u", "namespace": "ml"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(path))
    try:
        yield server
    finally:
        server.stop()


def test_plain_demo_stays_local_with_a_reachable_cluster_configured(
        real_cluster: EmulatorThread, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.cluster_reachable()                      # it is reachable ...
    before = sum(real_cluster.emulator.stats.values())
    calls: list[Any] = []
    monkeypatch.setattr(demo, "run_local", lambda *a, **k: calls.append(a) or 0)
    monkeypatch.setattr(demo, "run_cluster", lambda *a, **k: pytest.fail("the demo applied to the cluster"))
    assert demo.main(["--quick", "--work-dir", str(tmp_path / "w")]) == 0
    assert len(calls) == 1                               # ... yet the local API server was used
    assert sum(real_cluster.emulator.stats.values()) == before, real_cluster.emulator.stats
    assert "to the local API server" in capsys.readouterr().out


def test_cluster_flag_names_context_and_server_first(real_cluster: EmulatorThread,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--quick", "--cluster", "--timeout", "1"]) == 1     # nothing reconciles: not Succeeded
    out = capsys.readouterr().out
    named = out.index(f"context 'prod-eu', server {real_cluster.url}, namespace ml")
    assert named < out.index(" created")
