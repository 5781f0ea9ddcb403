"""kopf handlers: thin wiring from cluster events to :class:`trex_operator.reconciler.Reconciler`.

- indexes of the operator's pods, batch Jobs and Deployments (the observed children, kept current by watches);
- one timer per kind that re-derives each job's desired state (level-based; from the watched copy of the
  job when it is current, else from a GET);
- pod phase changes (seen by the pods index) and pod deletions kick an immediate reconciliation of the owning job;
- with a webhook port, a validating admission handler per kind (`trex_operator.webhook`).

Every per-event handler is a coroutine: kopf runs plain functions in a thread pool, a thread hop per watch
event that costs more than the handler itself at thousands of pods.

Importing this module registers the handlers in kopf's default registry (for `kopf run -m trex_operator`);
:func:`register` builds them into any registry (tests, `trex operator run`).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from trex_operator.api import GROUP, KIND_INFO, VERSION
from trex_operator.children import LABEL_KIND, LABEL_MANAGED, LABEL_NAME, MANAGER
from trex_operator.defaults import ClusterDefaults
from trex_operator.kube import Connection, Kube
from trex_operator.plan import Observed
from trex_operator.reconciler import JobKey, Reconciler, Settings
from trex_operator.webhook import denial, handler_id

log = logging.getLogger("trex_operator")
MANAGED = {LABEL_MANAGED: MANAGER}


def _key(namespace: str | None, labels: Any) -> tuple[str, str, str] | None:
    kind, name = (labels or {}).get(LABEL_KIND), (labels or {}).get(LABEL_NAME)
    if not kind or not name:
        return None
    return (str(kind), str(namespace or "default"), str(name))


def _snapshot(body: Any) -> dict[str, Any]:
    return {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec", "status")}


def _observer(pods: Any, batch: Any, deploys: Any, defaults: ClusterDefaults) -> Any:
    def observe(key: JobKey) -> Observed:
        import datetime as dt

        obs = Observed(now=dt.datetime.now(dt.UTC), defaults=defaults)
        obs.pods = list(pods.get(key, ()))
        obs.batch_jobs = {str(j["metadata"]["name"]): j for j in batch.get(key, ())}
        obs.deployments = {str(d["metadata"]["name"]): d for d in deploys.get(key, ())}
        return obs

    return observe


def register(registry: kopf.OperatorRegistry, settings: Settings | None = None,
             reconciler: Reconciler | None = None) -> kopf.OperatorRegistry:
    """Register every handler into ``registry``; ``settings``/``reconciler`` default to env-driven ones."""
    cfg = settings or Settings.from_env()
    state: dict[str, Reconciler] = {}

    def rec() -> Reconciler:
        if "r" not in state:
            state["r"] = reconciler or Reconciler(Kube(Connection.load()), cfg)
        return state["r"]

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=f"{GROUP}")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=f"{GROUP}")
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        settings.networking.error_backoffs = [0.1, 0.5, 1, 5, 10]
        # deleting a job stops its timer (kopf holds a finalizer until then): let that be prompt
        settings.background.instant_exit_timeout = 1.0
        settings.background.cancellation_polling = min(5.0, cfg.interval_s)
        if cfg.webhook_port >= 0:
            settings.admission.server = kopf.WebhookServer(
                addr=cfg.webhook_addr, port=cfg.webhook_port or None, certfile=cfg.webhook_cert,
                pkeyfile=cfg.webhook_key, insecure=cfg.webhook_cert is None)
        r = rec()
        if cfg.metrics_port >= 0 and r.metrics.port is None:
            port = r.metrics.serve(cfg.metrics_port)
            log.info("operator metrics on :%d/metrics", port)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        if "r" in state:
            await state["r"].close()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        c = rec().kube.conn
        return kopf.ConnectionInfo(server=c.server, token=c.token, scheme="Bearer" if c.token else None,
                                   ca_path=c.ca_path, certificate_path=c.cert_path, private_key_path=c.key_path,
                                   insecure=c.insecure)

    @kopf.index("pods", id="trex_pods", labels=MANAGED, registry=registry)
    async def trex_pods(namespace: str | None, labels: Any, body: Any, **kwargs: Any) -> dict[Any, Any]:
        # The pod's phase change also kicks its job from here (a separate kopf on.event handler costs a
        # second handler pass per pod event). The kick runs as a task after kopf has stored this entry.
        key = _key(namespace, labels)
        snap = _snapshot(body)
        job = rec().pod_changed(snap, deleted=False)
        if job is not None:
            rec().kick(job, _observer(kwargs["trex_pods"], kwargs["trex_batch"], kwargs["trex_deploys"],
                                      rec().settings.defaults))
        return {key: snap} if key else {}

    def deleted(type: str | None, **_: Any) -> bool:
        return type == "DELETED"

    @kopf.on.event("pods", id="pod_deleted", labels=MANAGED, when=deleted, registry=registry)
    async def pod_deleted(body: Any, **kwargs: Any) -> None:
        # kopf drops a deleted pod from the index without calling trex_pods: kick its job from here
        key = rec().pod_changed(_snapshot(body), deleted=True)
        if key is not None:
            rec().kick(key, _observer(kwargs["trex_pods"], kwargs["trex_batch"], kwargs["trex_deploys"],
                                      rec().settings.defaults))

    @kopf.index("batch", "v1", "jobs", id="trex_batch", labels=MANAGED, registry=registry)
    async def trex_batch(namespace: str | None, labels: Any, body: Any, **_: Any) -> dict[Any, Any]:
        key = _key(namespace, labels)
        return {key: _snapshot(body)} if key else {}

    @kopf.index("apps", "v1", "deployments", id="trex_deploys", labels=MANAGED, registry=registry)
    async def trex_deploys(namespace: str | None, labels: Any, body: Any, **_: Any) -> dict[Any, Any]:
        key = _key(namespace, labels)
        return {key: _snapshot(body)} if key else {}

    for kind, info in KIND_INFO.items():
        def make(kind: str) -> Any:
            async def tick(namespace: str | None, name: str, body: Any, trex_pods: Any, trex_batch: Any,
                           trex_deploys: Any, **_: Any) -> None:
                # kopf's body is the job as last watched: it spares the GET once it carries the latest status
                await rec().run((kind, namespace or "default", name),
                                _observer(trex_pods, trex_batch, trex_deploys, rec().settings.defaults), body)
            return tick

        kopf.timer(GROUP, VERSION, info.plural, id=f"reconcile-{info.singular}", interval=cfg.interval_s,
                   registry=registry)(make(kind))
        if cfg.webhook_port >= 0:
            kopf.on.validate(GROUP, VERSION, info.plural, id=handler_id(kind), registry=registry)(validate)
    return registry


async def validate(body: Any, **_: Any) -> None:
    """Admission: refuse an invalid job with the lines `trex validate` prints (kopf answers 422)."""
    message = denial(dict(body))
    if message is not None:
        raise kopf.AdmissionError(message, code=422)


register(kopf.get_default_registry())
