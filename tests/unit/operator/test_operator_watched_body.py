"""The reconciler plans from the watched copy of a job only when that copy carries the status it last
read or wrote; any other copy (older, or changed by someone else) is replaced by a GET."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any, cast

from trex_operator.kube import Connection, Kube
from trex_operator.plan import Observed
from trex_operator.reconciler import JobKey, Reconciler, Settings

KEY: JobKey = ("TrainJob", "default", "wj")


class MemoryKube:
    """Kube's interface over one TrainJob in memory; counts GETs of it and status writes (children and
    events are accepted)."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.conn = Connection(server="http://127.0.0.1:9")
        self.job = job
        self.gets = 0
        self.status_writes = 0

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        if kind != "TrainJob":
            return None
        self.gets += 1
        return copy.deepcopy(self.job)

    async def create(self, manifest: dict[str, Any], encoded: str | None = None) -> dict[str, Any]:
        return manifest

    async def patch(self, api_version: str, kind: str, namespace: str | None, name: str, body: dict[str, Any],
                    subresource: str | None = None) -> dict[str, Any]:
        if kind == "TrainJob" and subresource == "status":
            self.status_writes += 1
            merged = {**(self.job.get("status") or {}), **body["status"]}
            self.job["status"] = {k: v for k, v in merged.items() if v is not None}
            return copy.deepcopy(self.job)
        return {}


def _job() -> dict[str, Any]:
    return {"apiVersion": "trex.dev/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "wj", "namespace": "default", "uid": "u-1", "generation": 1},
            "spec": {"replicas": 2, "trainer": {"maxSteps": 10}}}


def _observe(_: JobKey) -> Observed:
    return Observed(now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))


async def test_first_pass_reads_the_job_even_with_a_watched_copy() -> None:
    kube = MemoryKube(_job())
    r = Reconciler(cast(Kube, kube), Settings(metrics_port=-1))
    await r.run(KEY, _observe, _job())
    assert kube.gets == 1
    assert kube.status_writes == 1
    assert kube.job["status"]["phase"]


async def test_watched_copy_with_the_written_status_spares_the_get() -> None:
    kube = MemoryKube(_job())
    r = Reconciler(cast(Kube, kube), Settings(metrics_port=-1))
    await r.run(KEY, _observe)
    assert kube.gets == 1
    await r.run(KEY, _observe, copy.deepcopy(kube.job))  # the watch has delivered the status write
    assert kube.gets == 1


async def test_stale_watched_copy_is_replaced_by_a_get() -> None:
    kube = MemoryKube(_job())
    r = Reconciler(cast(Kube, kube), Settings(metrics_port=-1))
    await r.run(KEY, _observe)
    stale = _job()  # the watch has not delivered the status write yet
    writes = kube.status_writes
    await r.run(KEY, _observe, stale)
    assert kube.gets == 2
    # planned from the stored job, whose status is current: nothing to write again
    assert kube.status_writes == writes


async def test_status_changed_by_someone_else_is_read_again() -> None:
    kube = MemoryKube(_job())
    r = Reconciler(cast(Kube, kube), Settings(metrics_port=-1))
    await r.run(KEY, _observe)
    kube.job["status"] = {**kube.job["status"], "message": "edited by hand"}
    await r.run(KEY, _observe, copy.deepcopy(kube.job))
    assert kube.gets == 2
