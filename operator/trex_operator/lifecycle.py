"""Lifecycle policy shared by all kinds: pod failure classification, conditions, phases, references.

Pure functions over plain dicts and the api models; no I/O.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from trex_operator.api import JobStatus, LineageEntry

GENUINE_CAUSES = frozenset({"failure", "oomKilled"})
"""Causes that spend backoffLimit; preemption, eviction and node loss do not."""
FATAL_CAUSES = frozenset({"imagePull", "configError"})
"""Causes a restart cannot fix: the job fails at once."""
CONFIG_ERROR_EXIT_CODE = 2
"""Exit code of a workload that rejected its configuration (argparse/validation errors)."""
_IMAGE_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
_PREEMPT_REASONS = frozenset({"PreemptionByScheduler", "PreemptionByKubeScheduler", "Preempting", "Preempted"})
_NODE_REASONS = frozenset({"NodeLost", "NodeShutdown", "DeletionByTaintManager", "DeletionByPodGC", "UnexpectedAdmissionError"})


def iso(t: dt.datetime) -> str:
    """RFC 3339 UTC timestamp with second precision."""
    return t.astimezone(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_time(value: Any) -> dt.datetime | None:
    """Parse an RFC 3339 timestamp; None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class PodState:
    """A pod's phase as the operator sees it, with the failure cause when it failed."""

    phase: str  # Pending | Running | Succeeded | Failed
    cause: str | None = None
    message: str = ""
    exit_code: int | None = None
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def genuine(self) -> bool:
        """A failure that spends backoffLimit."""
        return self.cause in GENUINE_CAUSES


def termination_summary(container_status: dict[str, Any]) -> dict[str, Any]:
    """The JSON summary the workload wrote to its termination message ({} when absent or not JSON)."""
    term = ((container_status.get("state") or {}).get("terminated")
            or (container_status.get("lastState") or {}).get("terminated") or {})
    raw = term.get("message")
    if not isinstance(raw, str) or not raw.strip().startswith("{"):
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def classify_pod(pod: dict[str, Any]) -> PodState:
    """Classify a pod: phase plus, for failures, the cause (exit code, OOMKilled, eviction, preemption, node loss, image)."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    reason = status.get("reason") or ""
    message = status.get("message") or ""
    containers = [c for c in (status.get("containerStatuses") or []) if isinstance(c, dict)]
    main = next((c for c in containers if c.get("name") == "trex"), containers[0] if containers else {})
    summary = termination_summary(main) if main else {}
    disruption = next((c for c in (status.get("conditions") or [])
                       if isinstance(c, dict) and c.get("type") == "DisruptionTarget" and c.get("status") == "True"), None)
    if (pod.get("metadata") or {}).get("deletionTimestamp") and phase in ("Pending", "Running") and disruption:
        phase = "Failed"
    waiting = (main.get("state") or {}).get("waiting") or {}
    if phase == "Pending" and waiting.get("reason") in _IMAGE_ERRORS:
        return PodState("Failed", "imagePull", f"{waiting.get('reason')}: {waiting.get('message', '')}".strip())
    if phase == "Unknown" or reason in _NODE_REASONS:
        return PodState("Failed", "nodeLost", message or reason or "node lost")
    if phase in ("Pending", "Running", "Succeeded") and not disruption:
        return PodState(phase, summary=summary)
    if phase == "Succeeded":
        return PodState(phase, summary=summary)
    if reason == "Evicted":
        return PodState("Failed", "evicted", message or "evicted", summary=summary)
    if disruption is not None:
        d_reason = str(disruption.get("reason") or "")
        if d_reason in _PREEMPT_REASONS:
            return PodState("Failed", "preempted", disruption.get("message") or d_reason, summary=summary)
        if d_reason in _NODE_REASONS:
            return PodState("Failed", "nodeLost", disruption.get("message") or d_reason, summary=summary)
        if d_reason == "EvictionByEvictionAPI" or d_reason == "TerminationByKubelet":
            return PodState("Failed", "evicted", disruption.get("message") or d_reason, summary=summary)
    if reason in _PREEMPT_REASONS:
        return PodState("Failed", "preempted", message or reason, summary=summary)
    term = (main.get("state") or {}).get("terminated") or {}
    code = term.get("exitCode")
    code = int(code) if isinstance(code, int) else None
    if term.get("reason") == "OOMKilled":
        return PodState("Failed", "oomKilled", "container was OOMKilled", code, summary)
    if code == CONFIG_ERROR_EXIT_CODE:
        return PodState("Failed", "configError", _short(term.get("message")) or "workload rejected its configuration",
                        code, summary)
    detail = f"exit code {code}" if code is not None else (message or "pod failed")
    if term.get("reason") and term.get("reason") not in ("Error", "Completed"):
        detail += f" ({term['reason']})"
    return PodState("Failed", "failure", detail, code, summary)


def _short(text: Any, limit: int = 300) -> str:
    if not isinstance(text, str):
        return ""
    stripped: str = text.strip()
    return stripped if len(stripped) <= limit else stripped[-limit:]


def set_condition(status: JobStatus, type_: str, value: str, reason: str, message: str, now: dt.datetime,
                  generation: int | None = None) -> bool:
    """Upsert a condition; lastTransitionTime changes only when the status value flips. Returns True on change."""
    from trex_operator.api import Condition

    for i, c in enumerate(status.conditions):
        if c.type == type_:
            if c.status == value and c.reason == reason and c.message == message:
                return False
            ltt = c.last_transition_time if c.status == value else iso(now)
            status.conditions[i] = Condition(type=type_, status=value, reason=reason, message=message,  # type: ignore[arg-type]
                                             last_transition_time=ltt, observed_generation=generation)
            return True
    status.conditions.append(Condition(type=type_, status=value, reason=reason, message=message,  # type: ignore[arg-type]
                                       last_transition_time=iso(now), observed_generation=generation))
    return True


def condition(status: JobStatus, type_: str) -> Any:
    """The condition of ``type_`` or None."""
    return next((c for c in status.conditions if c.type == type_), None)


PHASE_CONDITIONS = ("Pending", "Starting", "Running", "Restarting", "Suspended", "Succeeded", "Failed")


def transition(status: JobStatus, phase: str, reason: str, message: str, now: dt.datetime,
               generation: int | None = None) -> bool:
    """Move to ``phase`` with reason/message; the phase's condition turns True and the previous one False.

    Returns True when the phase or its reason changed (worth an Event).
    """
    changed = status.phase != phase or status.reason != reason
    previous = status.phase
    status.phase = phase  # type: ignore[assignment]
    status.reason = reason
    status.message = message
    if previous and previous != phase:
        set_condition(status, previous, "False", reason, message, now, generation)
    set_condition(status, phase, "True", reason, message, now, generation)
    if phase in ("Succeeded", "Failed") and status.completion_time is None:
        status.completion_time = iso(now)
    return changed


def load_status(raw: Any) -> JobStatus:
    """Status from the object; a malformed status (hand-edited) restarts from empty rather than crashing."""
    if not isinstance(raw, dict):
        return JobStatus()
    try:
        return JobStatus.model_validate(raw, by_alias=True, by_name=False)
    except Exception:
        keep = {k: raw[k] for k in ("attempt", "restarts", "phase") if k in raw}
        try:
            return JobStatus.model_validate(keep, by_alias=True, by_name=False)
        except Exception:
            return JobStatus()


def dump_status(status: JobStatus) -> dict[str, Any]:
    """Status as camelCase JSON (None values kept so a merge patch clears them; progress and results carry only
    the fields a job has reached, as the workloads' summaries gave them)."""
    out = status.model_dump(mode="json", by_alias=True)
    for name in ("progress", "results"):
        out[name] = getattr(status, name).model_dump(mode="json", by_alias=True, exclude_unset=True)
    return out


@dataclass(frozen=True)
class Dependencies:
    """Outcome of checking a job's references."""

    state: str  # ready | waiting | failed
    reason: str = ""
    message: str = ""
    lineage: list[LineageEntry] = field(default_factory=list)
    bodies: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


def check_dependencies(refs: list[tuple[str, str, str]], observed: dict[tuple[str, str], dict[str, Any] | None],
                       waiting_since: dt.datetime | None, timeout_s: int, now: dt.datetime) -> Dependencies:
    """Decide whether referenced jobs (kind, name, what) are ready, still awaited, or have failed/timed out."""
    lineage: list[LineageEntry] = []
    bodies: dict[tuple[str, str], dict[str, Any]] = {}
    waiting: list[str] = []
    for kind, name, what in refs:
        body = observed.get((kind, name))
        if body is None:
            waiting.append(f"{kind} {name} does not exist")
            continue
        phase = (body.get("status") or {}).get("phase")
        if phase == "Failed":
            return Dependencies("failed", "DependencyFailed", f"referenced {kind} {name} failed "
                                f"({(body.get('status') or {}).get('reason') or 'no reason'})")
        if phase != "Succeeded":
            waiting.append(f"{kind} {name} is {phase or 'not started'}")
            continue
        bodies[(kind, name)] = body
        lineage.append(LineageEntry(kind=kind, name=name, uid=(body.get("metadata") or {}).get("uid"), detail=what))
    if not waiting:
        return Dependencies("ready", lineage=lineage, bodies=bodies)
    since = waiting_since or now
    if (now - since).total_seconds() > timeout_s:
        return Dependencies("failed", "DependencyTimeout",
                            f"waited more than runPolicy.dependencyTimeoutSeconds={timeout_s}s: " + "; ".join(waiting))
    return Dependencies("waiting", "WaitingForDependency", "; ".join(waiting))
