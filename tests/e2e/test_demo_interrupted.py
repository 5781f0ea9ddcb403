"""`trex demo` interrupted mid-run (SIGTERM as a closed terminal or a CI timeout sends, SIGINT as Ctrl-C) stops
everything it started: no process it spawned is left (Prometheus, pod processes and theirs), and the ports of
its API server, operator metrics, webhook and Prometheus are free again."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TAG_VAR = "DEMO_INTERRUPT_TEST_TAG"
"""Carried by every process the demo starts (pods inherit the environment but its TREX_ variables)."""


def _tagged(tag: str) -> dict[int, tuple[str, int]]:
    """Every live (non-zombie) process whose environment carries ``tag``: its command name and parent."""
    marker = f"{TAG_VAR}={tag}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes():
                stat = (entry / "stat").read_text()
                state, ppid = stat.rsplit(")", 1)[1].split()[:2]
                if state != "Z":
                    found[int(entry.name)] = (stat[stat.index("(") + 1:stat.rindex(")")], int(ppid))
        except OSError:
            pass
    return found


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_interrupted_demo_leaves_nothing_running(tmp_path: Path, sig: signal.Signals) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (make test installs it): the demo would not start one")
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **{TAG_VAR: tag})
    proc = subprocess.Popen([sys.executable, "-m", "trex", "demo", "--quick", "--work-dir", str(tmp_path / "demo"),
                             "--timeout", "600"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout or ()], daemon=True).start()
    out: list[str] = []
    try:
        # Mid-run: Prometheus is up, the jobs are applied and a pod process of the demo's runs.
        deadline = time.monotonic() + 300
        pods: dict[int, tuple[str, int]] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                out.append(lines.get(timeout=0.5))
                while not lines.empty():
                    out.append(lines.get_nowait())
            except queue.Empty:
                pass
            text = "".join(out)
            if "Prometheus on http" in text and "created" in text:  # a pod: a child of the demo's but Prometheus
                pods = {p: v for p, v in _tagged(tag).items() if v[1] == proc.pid and v[0] not in ("prometheus", "helm")}
                if pods:
                    break
        text = "".join(out)
        assert pods, f"the demo never reached a running pod:\n{text[-3000:]}"
        running = _tagged(tag)
        assert "prometheus" in [name for name, _ in running.values()], running
        ports = [int(p) for p in re.findall(r"(?:API server on http://127\.0\.0\.1:|metrics on 127\.0\.0\.1:|"
                                            r"webhook on http://127\.0\.0\.1:|Prometheus on http://127\.0\.0\.1:)"
                                            r"(\d+)", text)]
        assert len(ports) == 4 and not any(_port_free(p) for p in ports), (ports, text[-2000:])

        proc.send_signal(sig)
        assert proc.wait(timeout=240) == 130
        while True:  # the rest of its output, up to its end
            try:
                out.append(lines.get(timeout=5))
            except queue.Empty:
                break
        text = "".join(out)
        assert f"trex demo: interrupted ({sig.name})" in text, text[-2000:]
        assert _tagged(tag) == {}, f"left running after {sig.name}: {_tagged(tag)} (before: {running})"
        assert [p for p in ports if not _port_free(p)] == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in _tagged(tag):  # never leave a stray process behind for the next test, even on failure
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
