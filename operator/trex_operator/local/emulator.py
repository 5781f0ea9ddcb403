"""kmock's KubernetesEmulator on loopback in its own thread, and the operator (kopf) in another.

Both run on their own event loops, like separate processes would: kopf cancels every task in its loop
when it stops, so keeping the emulator's watch streams elsewhere makes stopping the operator immediate.
Used by `trex demo` and by the operator's integration tests.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any

import kmock

from trex_operator.api import GROUP, KIND_INFO, VERSION

CORE: dict[str, tuple[str, bool, set[str]]] = {
    "v1/pods": ("Pod", True, {"status"}), "v1/configmaps": ("ConfigMap", True, set()),
    "v1/services": ("Service", True, set()), "v1/events": ("Event", True, set()),
    "v1/nodes": ("Node", False, set()), "batch/v1/jobs": ("Job", True, {"status"}),
    "apps/v1/deployments": ("Deployment", True, {"status"}),
    "scheduling.volcano.sh/v1beta1/podgroups": ("PodGroup", True, {"status"}),
    "v1/namespaces": ("Namespace", False, set()),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, set()),
}
"""Core resources declared for discovery: path -> (kind, namespaced, subresources)."""
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


class IndexedEmulator(kmock.KubernetesEmulator):
    """The emulator for scale runs: O(1) work per request instead of O(requests so far) and O(objects).

    kmock keeps every request and matches each new one against that history, and looks objects up by
    scanning them all; at thousands of objects that measures kmock, not the operator. This subclass
    keeps only the request being served (counting all of them in ``stats``) and looks named objects up
    by key. Also used by the demo, which runs long enough for the request history to matter.
    """

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.stats: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.created: dict[str, list[float]] = collections.defaultdict(list)

    async def _handle(self, request: Any) -> Any:
        agent = str(request.headers.get("User-Agent", "")).split("/")[0]
        plural = request.resource.plural if request.resource is not None else ""
        method = str(getattr(request.method, "value", request.method)).upper()
        self.stats[(agent, method, str(plural))] += 1
        self._requests[:] = [request]
        response = await super()._handle(request)
        if method == "POST" and response.status < 300 and plural in ("pods", "configmaps", "services"):
            labels = ((request.data or {}).get("metadata") or {}).get("labels") or {}
            if labels.get("trex.dev/job-name"):
                self.created[labels["trex.dev/job-name"]].append(time.perf_counter())
        return response

    def _KubernetesEmulator__get_obj(self, request: Any, strict: bool) -> Any:
        if not strict or request.name is None:
            return super()._KubernetesEmulator__get_obj(request, strict)  # type: ignore[misc]
        return self._objects._objects.get((request.resource, request.namespace, request.name))


class EmulatorThread:
    """kmock's emulator serving on loopback from its own thread and event loop (the trex CRDs and the
    core resources the operator uses are declared for discovery)."""

    def __init__(self, indexed: bool = False) -> None:
        self.indexed = indexed
        self.emulator: Any = None
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="kmock", daemon=True)

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        cls = IndexedEmulator if self.indexed else kmock.KubernetesEmulator
        async with cls() as emulator, kmock.Server(emulator) as server:
            for path, (kind, namespaced, subs) in CORE.items():
                emulator.resources[path] = kmock.ResourceInfo(kind=kind, namespaced=namespaced, verbs=VERBS,
                                                              subresources=subs)
            for kind, info in KIND_INFO.items():
                emulator.resources[f"{GROUP}/{VERSION}/{info.plural}"] = kmock.ResourceInfo(
                    kind=kind, singular=info.singular, namespaced=True, verbs=VERBS, subresources={"status"})
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def start(self) -> None:
        """Start serving; returns once the URL is known."""
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("the Kubernetes emulator did not start")

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)


class OperatorThread:
    """The trex operator (kopf + Reconciler) in its own thread and event loop against ``url``."""

    def __init__(self, url: str, interval_s: float = 1.0, metrics_addr: str | None = "127.0.0.1") -> None:
        self.url = url
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

        settings = Settings(interval_s=self.interval_s, metrics_port=-1, scrape_timeout_s=1.0)
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

    def stop(self) -> None:
        """Stop kopf and wait for its thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
