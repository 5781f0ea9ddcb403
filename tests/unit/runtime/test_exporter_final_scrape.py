"""A finished batch workload keeps its metrics endpoint up until Prometheus scrapes it once more."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request

from trex.telemetry.exporter import Exporter


def test_waits_for_the_next_scrape_and_returns_when_it_comes() -> None:
    e = Exporter()
    port = e.serve(0, "127.0.0.1")
    e.metric("trex_eval_pass_at_k", benchmark="b", k="1", protocol="strict").set(0.5)
    bodies: list[str] = []

    def scrape() -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
            bodies.append(r.read().decode())

    timer = threading.Timer(0.3, scrape)
    timer.start()
    t0 = time.monotonic()
    assert e.wait_for_scrape(10.0) is True
    assert time.monotonic() - t0 < 5.0  # returned on the scrape, not on the timeout
    timer.join()
    assert 'trex_eval_pass_at_k{benchmark="b",k="1",protocol="strict"} 0.5' in bodies[0]


def test_gives_up_after_the_timeout_and_does_not_wait_when_not_serving() -> None:
    e = Exporter()
    e.serve(0, "127.0.0.1")
    assert e.wait_for_scrape(0.2) is False
    assert Exporter().wait_for_scrape(60.0) is False  # not serving: at once


POD = """
import sys
from trex.telemetry.exporter import Exporter
e = Exporter()
print(e.serve(0, "127.0.0.1"), flush=True)
e.metric("trex_eval_pass_at_k", benchmark="b", k="1", protocol="strict").set(0.25)
sys.exit(0 if e.wait_for_scrape(30.0) else 3)
"""


def test_a_pod_that_exits_right_after_the_wait_has_sent_the_whole_scrape() -> None:
    """The wait ends once the response is on the wire, not when it is generated: a process exiting then
    must not cut the scrape (Prometheus saw such a pod as down and the eval Pass@1 panel stayed empty)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", POD], stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            body = r.read().decode()
        assert proc.wait(30) == 0
        assert 'trex_eval_pass_at_k{benchmark="b",k="1",protocol="strict"} 0.25' in body
