"""A finished batch workload keeps its metrics endpoint up until Prometheus scrapes it once more."""

from __future__ import annotations

import socket
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



def test_the_wait_ends_only_once_the_response_is_on_the_wire() -> None:
    """A pod exits as soon as the wait ends: the scrape's whole body must already be sent by then (a wait
    that ended when the body was generated let the eval pod exit mid-response; Prometheus recorded it as
    down and the Pass@1 per benchmark panel stayed empty)."""
    e = Exporter()
    port = e.serve(0, "127.0.0.1")
    e.metric("trex_eval_pass_at_k", benchmark="b", k="1", protocol="strict").set(0.25)
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(e.wait_for_scrape(30.0)))
    waiter.start()
    while not e._clock.cond._waiters:  # type: ignore[attr-defined]  # the wait has begun (no fixed delay)
        time.sleep(0.01)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
        waiter.join(30.0)
        assert done == [True]
        s.setblocking(False)  # read only what loopback already delivered: no waiting for more
        data = b""
        try:
            while chunk := s.recv(1 << 16):
                data += chunk
        except BlockingIOError:
            pass
    assert 'trex_eval_pass_at_k{benchmark="b",k="1",protocol="strict"} 0.25' in data.decode()
