"""The I/O side of a reconciliation: gather Observed, run the pure planner, apply the Plan.

Idempotent and level-based: the job is re-read on every pass (from the watch when the watched copy
provably carries the status this operator last saw, else by a GET), children have deterministic names,
creating an existing child adopts it (409 -> read, check ownership, patch data), deletions ignore 404.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trex_operator.api import API_VERSION, KINDS
from trex_operator.children import LABEL_NAME, JobCtx, to_json
from trex_operator.defaults import ClusterDefaults
from trex_operator.engine import plan_job, pod_attempt, pod_index
from trex_operator.kube import ApiError, Kube
from trex_operator.opmetrics import OperatorMetrics
from trex_operator.plan import Event, Manifest, Observed, Plan
from trex_operator.progress import UrlBuilder, default_url, scrape
from trex_operator.refgraph import MAX_DEPTH, referenced

log = logging.getLogger("trex_operator")
JobKey = tuple[str, str, str]  # kind, namespace, name


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a number") from None


@dataclass
class Settings:
    """Operator tunables (env: TREX_OPERATOR_INTERVAL, TREX_OPERATOR_METRICS_PORT, TREX_OPERATOR_SCRAPE_TIMEOUT,
    TREX_OPERATOR_WEBHOOK_PORT / _CERT / _KEY) and the cluster defaults for jobs (the chart's
    TREX_DEFAULT_*, TREX_*_RESOURCE, ... variables)."""

    interval_s: float = 10.0
    """Timer period: every job is re-derived at least this often (s)."""
    metrics_port: int = 8080
    """Port of the operator's /metrics (0 = a free port, -1 = off)."""
    scrape_timeout_s: float = 3.0
    """Timeout of one scrape of rank 0's /metrics (s)."""
    cache_ttl_s: float = 300.0
    """How long a created child is trusted to still exist before it is re-ensured (s)."""
    url_builder: UrlBuilder = default_url
    """Scrape URL of a pod (injectable for tests)."""
    clock: Callable[[], dt.datetime] = field(default=lambda: dt.datetime.now(dt.UTC))
    """Current time (injectable for tests)."""
    defaults: ClusterDefaults = field(default_factory=ClusterDefaults)
    """Cluster defaults the planners apply (read once at start-up; put into every Observed)."""
    webhook_port: int = -1
    """Port of the validating admission webhook (-1 = off; 0 = a free port)."""
    webhook_addr: str = "0.0.0.0"
    """Address the webhook listens on."""
    webhook_cert: str | None = None
    """TLS certificate (PEM) of the webhook; None serves plain HTTP (a local API server only)."""
    webhook_key: str | None = None
    """TLS private key (PEM) of the webhook."""

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> Settings:
        """Settings from environment variables (``env``, default os.environ); ValueError names a bad one."""
        env = os.environ if env is None else env
        return Settings(interval_s=_env_float(env, "TREX_OPERATOR_INTERVAL", 10.0),
                        metrics_port=int(_env_float(env, "TREX_OPERATOR_METRICS_PORT", 8080)),
                        scrape_timeout_s=_env_float(env, "TREX_OPERATOR_SCRAPE_TIMEOUT", 3.0),
                        defaults=ClusterDefaults.from_env(env),
                        webhook_port=int(_env_float(env, "TREX_OPERATOR_WEBHOOK_PORT", -1)),
                        webhook_cert=env.get("TREX_OPERATOR_WEBHOOK_CERT") or None,
                        webhook_key=env.get("TREX_OPERATOR_WEBHOOK_KEY") or None)


class Reconciler:
    """Runs reconciliations; one at a time per job, with coalesced re-runs when kicked meanwhile."""

    def __init__(self, kube: Kube, settings: Settings, metrics: OperatorMetrics | None = None) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics or OperatorMetrics()
        self._locks: dict[JobKey, asyncio.Lock] = {}
        self._dirty: set[JobKey] = set()
        self._known: dict[tuple[str, str, str, str], tuple[str, float]] = {}
        self._pod_phase: dict[str, str] = {}
        self._status_seen: dict[JobKey, str] = {}
        """Per job, the normalised status after this operator's last pass (what it read or wrote)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self.instance = socket.gethostname()

    # ---- triggering ------------------------------------------------------------------------------

    def pod_changed(self, pod: dict[str, Any], deleted: bool) -> JobKey | None:
        """Remember a pod's phase; returns its job's key when the phase changed (worth a reconcile)."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        uid = str(meta.get("uid") or meta.get("name"))
        phase = "Deleted" if deleted else str((pod.get("status") or {}).get("phase") or "Pending")
        previous = self._pod_phase.get(uid)
        if previous == phase:
            return None
        if deleted:
            self._pod_phase.pop(uid, None)
        else:
            self._pod_phase[uid] = phase
        if previous is None and phase == "Pending":
            return None  # a pod appearing as Pending is what the last pass just did: nothing to decide
        kind = labels.get("trex.dev/job-kind")
        name = labels.get(LABEL_NAME)
        if kind not in KINDS or not name:
            return None
        return (str(kind), str(meta.get("namespace") or "default"), str(name))

    def kick(self, key: JobKey, observe: Callable[[JobKey], Observed]) -> None:
        """Reconcile ``key`` soon without waiting (coalesced with a running pass)."""
        task = asyncio.get_running_loop().create_task(self.run(key, observe))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Cancel pending kicks and close the API session."""
        self._closing = True
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.kube.close()

    async def run(self, key: JobKey, observe: Callable[[JobKey], Observed],
                  watched: Mapping[str, Any] | None = None) -> None:
        """Reconcile ``key``; if a pass is already running, mark it dirty so it runs once more.

        ``watched`` is the job as the watch last delivered it; it replaces the GET when it is current
        (see :meth:`current_body`).
        """
        if self._closing:
            return
        lock = self._locks.setdefault(key, asyncio.Lock())
        if lock.locked():
            self._dirty.add(key)
            return
        async with lock:
            for _ in range(3):
                self._dirty.discard(key)
                await self.reconcile_once(key, observe, watched)
                watched = None  # a re-run was asked for by something newer than that copy
                if key not in self._dirty:
                    break

    def current_body(self, key: JobKey, watched: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """A copy of the watched job when it carries the status this operator last read or wrote for it.

        Status is written only by this operator, and watch events arrive in order, so a watched copy with
        that status has seen this operator's last write: planning from it decides what a GET would (a
        spec change not yet delivered is picked up by the pass after it arrives). Otherwise None (GET).
        """
        seen = self._status_seen.get(key)
        if watched is None or seen is None:
            return None
        body = copy.deepcopy(dict(watched))
        status = body.get("status")
        if _norm_status(status if isinstance(status, dict) else {}) != seen:
            return None
        return body

    # ---- one pass --------------------------------------------------------------------------------

    async def reconcile_once(self, key: JobKey, observe: Callable[[JobKey], Observed],
                             watched: Mapping[str, Any] | None = None) -> Plan | None:
        """Read the job, gather the rest of Observed, plan, apply. Errors are logged and counted."""
        kind, namespace, name = key
        t0 = time.perf_counter()
        result = "ok"
        try:
            body = self.current_body(key, watched)
            self._status_seen.pop(key, None)  # until this pass has read or written the status again
            if body is None:
                body = await self.kube.get(API_VERSION, kind, namespace, name)
            if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
                self.metrics.job_phase(key, None)
                self.metrics.job_results(key, None)
                self._locks.pop(key, None)
                return None
            observed = observe(key)
            observed.now = self.settings.clock()
            await self._observe_more(body, observed)
            plan = plan_job(body, observed)
            await self.apply(body, plan)
            phase = (plan.status or {}).get("phase")
            self.metrics.job_phase(key, phase if isinstance(phase, str) else None)
            self.metrics.job_results(key, plan.status or body.get("status") or {})
            for cause in plan.restart_causes:
                self.metrics.restarted(kind, cause)
            return plan
        except ApiError as exc:
            result = "error"
            log.warning("reconcile %s %s/%s: %s", kind, namespace, name, exc)
            return None
        except Exception:
            result = "error"
            if not self._closing:
                log.exception("reconcile %s %s/%s failed", kind, namespace, name)
            return None
        finally:
            self.metrics.reconciled(kind, result, time.perf_counter() - t0)

    async def _observe_more(self, body: dict[str, Any], observed: Observed) -> None:
        ns = JobCtx.from_body(body).namespace
        # the referenced jobs and, transitively, theirs: a reference cycle through the cluster shows up here
        todo = list(referenced(body))
        while todo and len(observed.refs) < MAX_DEPTH:
            kind, ref = todo.pop(0)
            if (kind, ref) in observed.refs:
                continue
            got = observed.refs[(kind, ref)] = await self.kube.get(API_VERSION, kind, ns, ref)
            if got is not None:
                todo.extend(referenced(got))
        spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
        status = body.get("status") if isinstance(body.get("status"), dict) else {}
        attempt = status.get("attempt", 0) if isinstance(status, dict) else 0
        current = [p for p in observed.pods if pod_attempt(p) == attempt]
        phase = status.get("phase") if isinstance(status, dict) else None
        if body.get("kind") in ("TrainJob", "EvalJob") and phase in ("Running", "Starting"):
            rank0 = [p for p in current if pod_index(p) == 0 and (p.get("status") or {}).get("phase") == "Running"]
            port = spec.get("metricsPort", 9400) if isinstance(spec, dict) else 9400
            if rank0 and isinstance(port, int):
                url = self.settings.url_builder(rank0[0], port)
                if url:
                    observed.metrics = await scrape(url, self.settings.scrape_timeout_s)

    # ---- applying ---------------------------------------------------------------------------------

    async def apply(self, body: dict[str, Any], plan: Plan) -> None:
        """Apply deletions, ensures, patches, status and events of ``plan``."""
        job = JobCtx.from_body(body)
        for ref in plan.delete:
            self._known.pop((job.uid, ref.kind, ref.name, job.namespace), None)
            await self.kube.delete(ref.api_version, ref.kind, job.namespace, ref.name)
        await self._ensure_all(job, plan.ensure)
        for p in plan.patch:
            await self.kube.patch(p["apiVersion"], p["kind"], job.namespace, p["metadata"]["name"],
                                  {k: v for k, v in p.items() if k not in ("apiVersion", "kind")})
        raw_old = body.get("status")
        old: dict[str, Any] = raw_old if isinstance(raw_old, dict) else {}
        key = (job.kind, job.namespace, job.name)
        if plan.status and _status_changed(old, plan.status):
            written = await self.kube.patch(API_VERSION, job.kind, job.namespace, job.name,
                                            {"status": plan.status}, subresource="status")
            now = written.get("status")
            if isinstance(now, dict):
                self._status_seen[key] = _norm_status(now)
        else:
            self._status_seen[key] = _norm_status(old)
        for ev in plan.events:
            await self.event(body, ev)
        if plan.delete_job:
            await self.kube.delete(API_VERSION, job.kind, job.namespace, job.name)

    async def _ensure_all(self, job: JobCtx, manifests: Iterable[Manifest]) -> None:
        pending = list(manifests)
        # Configuration objects first (pods mount them), then the rest concurrently.
        first = [m for m in pending if m["kind"] in ("ConfigMap", "Service", "PodGroup")]
        rest = [m for m in pending if m["kind"] not in ("ConfigMap", "Service", "PodGroup")]
        for group in (first, rest):
            if group:
                await asyncio.gather(*(self.ensure(job, m) for m in group))

    async def ensure(self, job: JobCtx, manifest: Manifest) -> None:
        """Create ``manifest`` or adopt the existing object (ConfigMap data is brought up to date)."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        cache_key = (job.uid, kind, name, job.namespace)
        digest = to_json(manifest)
        cached = self._known.get(cache_key)
        # pods come from the watch-fed index; a short memory only bridges the index's lag after a create
        ttl = min(10.0, self.settings.cache_ttl_s) if kind == "Pod" else self.settings.cache_ttl_s
        if cached is not None and cached[0] == digest and time.monotonic() - cached[1] < ttl:
            return
        try:
            await self.kube.create(manifest, encoded=digest)
        except ApiError as exc:
            if exc.status != 409:
                if exc.status == 404 and kind == "PodGroup":
                    log.warning("PodGroup API not installed (is Volcano running?): %s", exc)
                    return
                raise
            existing = await self.kube.get(manifest["apiVersion"], kind, job.namespace, name)
            if existing is None:
                return  # deleted meanwhile: the next pass creates it
            if not _owned_by(existing, job):
                await self.event_for(job, Event("Warning", "NameConflict",
                                                f"{kind} {name} exists and is not owned by this job; not adopting"))
                return
            if kind == "ConfigMap" and existing.get("data") != manifest.get("data"):
                await self.kube.patch("v1", "ConfigMap", job.namespace, name, {"data": manifest.get("data")})
        self._known[cache_key] = (digest, time.monotonic())

    async def event(self, body: dict[str, Any], ev: Event) -> None:
        """Record a Kubernetes Event on the job (best effort)."""
        await self.event_for(JobCtx.from_body(body), ev)

    async def event_for(self, job: JobCtx, ev: Event) -> None:
        """Record a Kubernetes Event on ``job`` (failures are logged, never raised)."""
        now = self.settings.clock().astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        manifest = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{job.name}.{uuid.uuid4().hex[:16]}", "namespace": job.namespace},
            "involvedObject": {"apiVersion": API_VERSION, "kind": job.kind, "name": job.name,
                               "namespace": job.namespace, "uid": job.uid},
            "reason": ev.reason, "message": ev.message[:1024], "type": ev.type,
            "source": {"component": "trex-operator"}, "reportingComponent": "trex-operator",
            "reportingInstance": self.instance, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            await self.kube.create(manifest)
        except ApiError as exc:
            log.warning("event %s on %s/%s not recorded: %s", ev.reason, job.namespace, job.name, exc)


def _owned_by(obj: dict[str, Any], job: JobCtx) -> bool:
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("kind") == job.kind and ref.get("name") == job.name:
            return not job.uid or not ref.get("uid") or ref.get("uid") == job.uid
    labels = meta.get("labels") or {}
    return labels.get(LABEL_NAME) == job.name and labels.get("trex.dev/job-kind") == job.kind


def _norm_status(d: dict[str, Any]) -> str:
    return to_json({k: v for k, v in d.items() if v not in (None, [], {})})


def _status_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return _norm_status(old) != _norm_status(new)
