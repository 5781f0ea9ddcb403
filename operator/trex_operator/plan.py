"""What a reconciliation sees (Observed) and what it decides (Plan): the interface of the pure planners.

Planners are functions ``(job body, Observed) -> Plan``; the reconciler gathers Observed through the
API and applies the Plan. Keeping both sides plain data makes every decision unit-testable.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from trex_operator.defaults import ClusterDefaults

Manifest = dict[str, Any]


@dataclass(frozen=True)
class ChildRef:
    """A child object to delete: apiVersion, kind and name (namespace = the job's)."""

    api_version: str
    kind: str
    name: str


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to record on the job."""

    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Observed:
    """The cluster state one reconciliation of one job works from."""

    now: dt.datetime
    pods: list[Manifest] = field(default_factory=list)
    """Pods labelled as children of this job (any attempt)."""
    batch_jobs: dict[str, Manifest] = field(default_factory=dict)
    """batch/v1 Jobs of this job by name."""
    deployments: dict[str, Manifest] = field(default_factory=dict)
    """apps/v1 Deployments of this job by name."""
    refs: dict[tuple[str, str], Manifest | None] = field(default_factory=dict)
    """Referenced jobs by (kind, name); None when the object does not exist."""
    metrics: dict[str, float] | None = None
    """Samples scraped from rank 0's /metrics (None when not scraped or unreachable)."""
    defaults: ClusterDefaults = field(default_factory=ClusterDefaults)
    """The cluster defaults the operator was started with (images, gang, device resources, rank table)."""


@dataclass
class Plan:
    """The desired changes: children to ensure, objects to delete, the new status and Events."""

    ensure: list[Manifest] = field(default_factory=list)
    """Children that must exist (create, or adopt on 409). ConfigMaps are also updated when their data differs."""
    delete: list[ChildRef] = field(default_factory=list)
    """Children to delete (404 is fine)."""
    patch: list[Manifest] = field(default_factory=list)
    """Merge patches for existing children (apiVersion, kind, metadata.name plus the changed fields)."""
    status: dict[str, Any] = field(default_factory=dict)
    """The complete new status (camelCase JSON)."""
    events: list[Event] = field(default_factory=list)
    """Events to record."""
    delete_job: bool = False
    """Delete the job itself (ttlSecondsAfterFinished elapsed)."""
    restart_causes: list[str] = field(default_factory=list)
    """Causes of the gang restarts decided in this pass (for the operator's metrics)."""
