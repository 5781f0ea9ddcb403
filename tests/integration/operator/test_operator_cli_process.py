"""`trex operator run` as a real process (kubeconfig -> emulator): creates children, serves metrics, exits on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from operator_env import EmulatorThread
from trex_operator.api import API_VERSION
from trex_operator.kube import Connection, Kube


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_cli_process_reconciles_and_stops_cleanly(tmp_path: Path) -> None:
    server = EmulatorThread()
    server.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
        f"clusters: [{{name: emu, cluster: {{server: '{server.url}'}}}}]\n"
        "users: [{name: emu, user: {token: t0k3n}}]\n"
        "contexts: [{name: emu, context: {cluster: emu, user: emu}}]\n")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "trex", "operator", "run", "--kubeconfig", str(kubeconfig),
                             "--interval", "0.3", "--metrics-port", str(port), "--liveness", ""],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    kube = Kube(Connection(server=server.url), user_agent="trex-tests")
    try:
        await kube.create({"apiVersion": API_VERSION, "kind": "TrainJob",
                           "metadata": {"name": "cli", "namespace": "default", "uid": "u-cli", "resourceVersion": "1"},
                           "spec": {"replicas": 2, "trainer": {}}})
        for _ in range(300):
            pods = [k for k in list(server.emulator.objects.keys()) if k[0].plural == "pods"]
            if len(pods) == 2:
                break
            await asyncio.sleep(0.1)
        assert sorted(k[2] for k in pods) == ["cli-worker-0-a0", "cli-worker-1-a0"]
        requests = list(server.emulator._requests)
        assert any(r.headers.get("Authorization") == "Bearer t0k3n" for r in requests)  # credentials from kubeconfig
        wanted = 'trex_operator_reconciles_total{kind="TrainJob",result="ok"}'
        for _ in range(100):  # the pass that created the pods is counted when it ends
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            if wanted in text:
                break
            await asyncio.sleep(0.1)
        assert wanted in text
    finally:
        await kube.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        server.stop()
    assert proc.returncode == 0, out[-2000:]
