"""The local API server (`trex_operator.local.apiserver`) on loopback in its own thread, and the
operator (kopf) in another.

Both run on their own event loops, like separate processes would: kopf cancels every task in its loop
when it stops, so keeping the emulator's watch streams elsewhere makes stopping the operator immediate.
Used by `trex demo` and by the operator's integration tests.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import kmock

from trex_operator.api import GROUP, KIND_INFO


class EmulatorThread:
    """The local API server on loopback from its own thread and event loop, with the trex CRDs installed.

    ``indexed``: keep only the latest object versions and request (long runs: the demo, scale
    benchmarks); otherwise every version and request stays for the tests to assert on. ``crds``: install
    the trex CRDs at start (the demo installs them with the chart instead).
    """

    def __init__(self, indexed: bool = False, crds: bool = True) -> None:
        self.indexed = indexed
        self.crds = crds
        self.emulator: Any = None
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="trex-apiserver", daemon=True)

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        from trex_operator.local.apiserver import ApiServer

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with ApiServer() as emulator, kmock.Server(emulator) as server:
            emulator.keep_history = not self.indexed
            self.emulator = emulator
            if self.crds:
                self._install_crds()
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()
            for w in list(emulator.watchers):
                w.queue.put_nowait(None)

    def start(self) -> None:
        """Start serving; returns once the URL is known."""
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("the Kubernetes API server did not start")

    def _install_crds(self) -> None:
        from trex_operator.crdgen import build_crd
        from trex_operator.local.apiserver import Target

        crds = self.emulator.types["apiextensions.k8s.io/v1/customresourcedefinitions"]
        for kind in KIND_INFO:
            if self.emulator.fetch(crds, None, f"{KIND_INFO[kind].plural}.{GROUP}") is None:
                self.emulator.create_obj(Target(crds, None, None, None), build_crd(kind), {})

    def install_crds(self) -> None:
        """Create the trex CRDs (those not there yet) from the server's own thread."""
        if self._loop is None:
            raise RuntimeError("the API server is not running")
        done = threading.Event()

        def run() -> None:
            try:
                self._install_crds()
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(20)

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)


class OperatorThread:
    """The trex operator (kopf + Reconciler) in its own thread and event loop against ``url``."""

    def __init__(self, url: str, interval_s: float = 1.0, metrics_addr: str | None = "127.0.0.1",
                 webhook_port: int = -1) -> None:
        self.url = url
        self.webhook_port = webhook_port
        """Serve the validating webhook on 127.0.0.1 (plain HTTP) at this port (-1 = off)."""
        self.interval_s = interval_s
        self.metrics_addr = metrics_addr
        self.metrics_port: int | None = None
        """Port of the operator's /metrics on ``metrics_addr`` once started (None: not served)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        """Start kopf; returns once it is ready (RuntimeError after ``timeout_s``)."""
        import kopf

        from trex_operator.handlers import register
        from trex_operator.kube import Connection, Kube
        from trex_operator.reconciler import Reconciler, Settings

        settings = Settings(interval_s=self.interval_s, metrics_port=-1, scrape_timeout_s=1.0,
                            webhook_port=self.webhook_port, webhook_addr="127.0.0.1")
        reconciler = Reconciler(Kube(Connection(server=self.url), retries=2, backoff_s=0.05), settings)
        if self.metrics_addr is not None:
            self.metrics_port = reconciler.metrics.serve(0, addr=self.metrics_addr)
        registry = register(kopf.OperatorRegistry(), settings, reconciler)
        ready = threading.Event()
        stop = self._stop

        def main() -> None:
            asyncio.run(kopf.operator(registry=registry, clusterwide=True, standalone=True,
                                      stop_flag=stop, ready_flag=ready))

        self._thread = threading.Thread(target=main, name="trex-operator", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise RuntimeError("the operator did not start")
        if self.webhook_port > 0:
            _wait_listening("127.0.0.1", self.webhook_port, timeout_s)

    def stop(self) -> None:
        """Stop kopf and wait for its thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None


def _wait_listening(host: str, port: int, timeout_s: float) -> None:
    """Block until something accepts connections on host:port (RuntimeError after ``timeout_s``)."""
    import socket
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {host}:{port} after {timeout_s:.0f}s")
