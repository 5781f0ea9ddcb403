"""Run the trex operator in-process against the local API server (kmock-based) on loopback.

``async with OperatorEnv() as env:`` starts the API server (with the trex CRDs installed),
then kopf with the trex handlers; ``env.restart_operator()``
stops and starts kopf (a fresh Reconciler with empty caches) against the same emulator state.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import uuid
from collections.abc import Callable
from typing import Any

import kopf
from trex_operator.api import API_VERSION
from trex_operator.handlers import register
from trex_operator.kube import Connection, Kube
from trex_operator.local.emulator import EmulatorThread
from trex_operator.progress import UrlBuilder, default_url
from trex_operator.reconciler import Reconciler, Settings

__all__ = ["EmulatorThread", "OperatorEnv"]


class OperatorEnv:
    """Emulator + operator; ``kube`` is a client the tests use to act as users and as the kubelet."""

    def __init__(self, interval_s: float = 0.2, url_builder: UrlBuilder = default_url,
                 clock: Callable[[], dt.datetime] | None = None) -> None:
        self.interval_s = interval_s
        self.url_builder = url_builder
        self.clock = clock
        self.emulator: Any = None
        self.kube: Kube | None = None
        self.reconciler: Reconciler | None = None
        self._task: threading.Thread | None = None
        self._stop: threading.Event | None = None
        self.namespace = "default"

    async def __aenter__(self) -> OperatorEnv:
        self._server = EmulatorThread()
        self._server.start()
        self.emulator = self._server.emulator
        self.conn = Connection(server=self._server.url)
        self.kube = Kube(self.conn, retries=2, backoff_s=0.05, user_agent="trex-tests")
        await self.start_operator()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop_operator()
        if self.kube is not None:
            await self.kube.close()
        self._server.stop()

    async def start_operator(self) -> None:
        """Start kopf with a fresh Reconciler (empty caches), as after an operator restart.

        The operator runs in its own thread and event loop, like a separate process would.
        """
        settings = Settings(interval_s=self.interval_s, metrics_port=-1, scrape_timeout_s=1.0,
                            url_builder=self.url_builder)
        if self.clock is not None:
            settings.clock = self.clock
        self.reconciler = Reconciler(Kube(self.conn, retries=2, backoff_s=0.05), settings)
        registry = register(kopf.OperatorRegistry(), settings, self.reconciler)
        self._stop = threading.Event()
        ready = threading.Event()
        stop = self._stop

        def main() -> None:
            asyncio.run(kopf.operator(registry=registry, clusterwide=True, standalone=True,
                                      stop_flag=stop, ready_flag=ready))

        self._task = threading.Thread(target=main, name="trex-operator", daemon=True)
        self._task.start()
        if not await asyncio.to_thread(ready.wait, 20):
            raise RuntimeError("the operator did not start")

    async def stop_operator(self) -> None:
        """Stop kopf and wait for its thread to exit."""
        if self._task is None or self._stop is None:
            return
        self._stop.set()
        await asyncio.to_thread(self._task.join, 30)
        self._task = None

    async def restart_operator(self) -> None:
        """Stop and start the operator against the same cluster state."""
        await self.stop_operator()
        await self.start_operator()

    # ---- user actions ---------------------------------------------------------------------------

    async def apply(self, kind: str, name: str, spec: dict[str, Any], labels: dict[str, str] | None = None) -> str:
        """Create a trex job (with a uid and creationTimestamp as the API server would set); returns the uid."""
        uid = str(uuid.uuid4())
        assert self.kube is not None
        await self.kube.create({"apiVersion": API_VERSION, "kind": kind,
                                "metadata": {"name": name, "namespace": self.namespace, "uid": uid, "generation": 1,
                                             "resourceVersion": "1",
                                             "labels": labels or {},
                                             "creationTimestamp": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
                                "spec": spec})
        return uid

    async def job(self, kind: str, name: str) -> dict[str, Any] | None:
        """The job object as stored."""
        assert self.kube is not None
        return await self.kube.get(API_VERSION, kind, self.namespace, name)

    async def patch_spec(self, kind: str, name: str, spec: dict[str, Any]) -> None:
        """Merge-patch the job's spec."""
        assert self.kube is not None
        await self.kube.patch(API_VERSION, kind, self.namespace, name, {"spec": spec})

    def objects(self, plural: str) -> list[dict[str, Any]]:
        """Live (not deleted) objects of a resource path such as 'v1/pods'."""
        out = []
        for (res, _ns, _name), obj in list(self.emulator.objects.items()):
            if f"{res.group + '/' if res.group else ''}{res.version}/{res.plural}" == plural and not obj.deleted:
                out.append(obj.raw)
        return out

    def history_names(self, plural: str) -> list[str]:
        """Names of every object ever created for a resource path (including deleted ones)."""
        names = []
        for (res, _ns, name), _obj in list(self.emulator.objects.items()):
            if f"{res.group + '/' if res.group else ''}{res.version}/{res.plural}" == plural:
                names.append(name)
        return names

    def creates(self, plural: str) -> list[str]:
        """Names of every successful or attempted POST for a resource path (from the request log)."""
        out = []
        for r in list(self.emulator._requests):
            if r.method == "POST" and r.resource is not None:
                res = r.resource
                if f"{res.group + '/' if res.group else ''}{res.version}/{res.plural}" == plural:
                    out.append(str((r.data or {}).get("metadata", {}).get("name")))
        return out

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
        """Poll ``predicate`` (sync or async) until truthy; fail with ``what`` after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            if loop.time() > end:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.05)

    async def wait_phase(self, kind: str, name: str, phase: str, timeout: float = 20.0) -> dict[str, Any]:
        """Wait until the job reports ``phase``; returns the job."""
        async def check() -> dict[str, Any] | None:
            job = await self.job(kind, name)
            return job if job and (job.get("status") or {}).get("phase") == phase else None
        try:
            result: dict[str, Any] = await self.wait_for(check, timeout, f"{kind} {name} phase {phase}")
        except AssertionError:
            job = await self.job(kind, name)
            raise AssertionError(f"{kind} {name} never reached {phase}; status: {(job or {}).get('status')}") from None
        return result

    def pods(self, job: str, attempt: int | None = None) -> list[dict[str, Any]]:
        """Live pods of ``job`` (optionally one attempt), ordered by name."""
        out = [p for p in self.objects("v1/pods")
               if p["metadata"].get("labels", {}).get("trex.dev/job-name") == job
               and (attempt is None or p["metadata"]["labels"].get("trex.dev/attempt") == str(attempt))]
        return sorted(out, key=lambda p: p["metadata"]["name"])

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        """Recorded Events (optionally of one reason)."""
        return [e for e in self.objects("v1/events") if reason is None or e.get("reason") == reason]


def names(pods: list[dict[str, Any]]) -> list[str]:
    """Object names, in the given order."""
    return [p["metadata"]["name"] for p in pods]
