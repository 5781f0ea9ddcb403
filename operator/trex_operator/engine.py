"""The generic job planner: validation, references, deadline, TTL, suspend, gang restarts, cleanup.

``plan_job(body, observed)`` is the one pure entry point; kind-specific parts live in
:mod:`trex_operator.kinds` behind the small :class:`KindImpl` interface.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError
from trex.config_base import format_validation_error

from trex_operator import refgraph
from trex_operator.api import KINDS, CommonSpec, JobStatus
from trex_operator.children import LABEL_ATTEMPT, LABEL_INDEX, LABEL_ROLE, JobCtx
from trex_operator.defaults import EffectiveGang, GangError, effective_gang
from trex_operator.lifecycle import (
    FATAL_CAUSES,
    GENUINE_CAUSES,
    Dependencies,
    PodState,
    check_dependencies,
    classify_pod,
    condition,
    dump_status,
    iso,
    load_status,
    parse_time,
    set_condition,
    transition,
)
from trex_operator.plan import ChildRef, Event, Manifest, Observed, Plan
from trex_operator.ranktable import LayoutError, ascend_layout

FINISHED = ("Succeeded", "Failed")
_FATAL_REASONS = {"imagePull": "ImagePullError", "configError": "ConfigError"}


@dataclass
class Ctx:
    """Everything one planning pass works on; kinds read it and append to ``plan``."""

    job: JobCtx
    body: dict[str, Any]
    model: Any
    spec: CommonSpec
    status: JobStatus
    observed: Observed
    plan: Plan
    generation: int | None
    deps: Dependencies = field(default_factory=lambda: Dependencies("ready"))
    gang: EffectiveGang = field(default_factory=lambda: EffectiveGang("none", None))
    """spec.scheduling with the cluster defaults applied."""

    @property
    def now(self) -> dt.datetime:
        """Time of this pass."""
        return self.observed.now

    def event(self, type_: str, reason: str, message: str) -> None:
        """Record an Event."""
        self.plan.events.append(Event(type_, reason, message))

    def move(self, phase: str, reason: str, message: str) -> None:
        """Phase transition with a condition, plus an Event when it is a change."""
        if transition(self.status, phase, reason, message, self.now, self.generation):
            self.event("Warning" if phase == "Failed" or phase == "Restarting" else "Normal", reason, message)


class KindImpl(Protocol):
    """What differs per kind."""

    def refs(self, ctx: Ctx) -> list[tuple[str, str, str]]:
        """Referenced jobs as (kind, name, what is taken)."""
        ...

    def children(self, ctx: Ctx) -> list[Manifest]:
        """Static children (ConfigMaps, Services, PodGroups, Deployments) for the current state."""
        ...

    def run(self, ctx: Ctx) -> None:
        """Drive the workers (create pods/Jobs, detect success/failure), updating status and plan."""
        ...

    def workers(self, ctx: Ctx, running_only: bool) -> list[ChildRef]:
        """Worker objects to delete on suspend or cleanup (only unfinished ones when ``running_only``)."""
        ...

    def suspended(self, ctx: Ctx) -> bool:
        """True once no worker runs any more after a suspend."""
        ...

    def finished(self, ctx: Ctx) -> None:
        """Extra actions while finished (release servers, publish results)."""
        ...

    def ref_problem(self, ctx: Ctx) -> str | None:
        """Why the succeeded references cannot serve this job as asked (None when they can)."""
        ...


def _impl(kind: str) -> KindImpl:
    from trex_operator import kinds

    return kinds.IMPLS[kind]


def plan_job(body: dict[str, Any], observed: Observed) -> Plan:
    """Decide children, deletions, status and Events for one job (pure)."""
    job = JobCtx.from_body(body)
    status = load_status(body.get("status"))
    plan = Plan()
    meta = body.get("metadata") or {}
    gen = meta.get("generation") if isinstance(meta.get("generation"), int) else None
    ctx = Ctx(job, body, None, CommonSpec(), status, observed, plan, gen)
    if job.kind not in KINDS:
        return plan
    impl = _impl(job.kind)
    if status.phase in FINISHED:
        _finished(ctx, impl)
        plan.status = dump_status(status)
        return plan
    try:
        envelope = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec")}
        ctx.model = KINDS[job.kind].model_validate(envelope, by_alias=True, by_name=False)
        ctx.spec = ctx.model.spec
    except ValidationError as err:
        lines = format_validation_error(err, model=KINDS[job.kind])
        ctx.move("Failed", "InvalidSpec", "; ".join(lines)[:2000])
        plan.status = dump_status(status)
        return plan
    except Exception as exc:
        ctx.move("Failed", "InvalidSpec", f"{type(exc).__name__}: {exc}"[:2000])
        plan.status = dump_status(status)
        return plan
    try:
        ctx.gang = effective_gang(ctx.spec.scheduling, observed.defaults, ctx.spec.device_type)
        ascend_layout(body, ctx.spec, observed.defaults)
    except (GangError, LayoutError) as exc:
        ctx.move("Failed", "InvalidSpec", str(exc)[:2000])
        plan.status = dump_status(status)
        return plan
    status.observed_generation = gen
    before = status.model_copy(deep=True)
    try:
        _active(ctx, impl)
        if condition(status, "ReconcileError") is not None:
            set_condition(status, "ReconcileError", "False", "Recovered", "", observed.now, gen)
    except Exception as exc:
        # a planner bug on an unusual but valid object: report it on the object, change nothing else
        ctx.plan = plan = Plan()
        status = before
        set_condition(status, "ReconcileError", "True", type(exc).__name__, str(exc)[:1000], observed.now, gen)
    plan.status = dump_status(status)
    return plan


def _finished(ctx: Ctx, impl: KindImpl) -> None:
    policy = "Running"
    spec = (ctx.body.get("spec") or {})
    run_policy = spec.get("runPolicy") if isinstance(spec, dict) else None
    if isinstance(run_policy, dict) and run_policy.get("cleanPodPolicy") in ("None", "Running", "All"):
        policy = run_policy["cleanPodPolicy"]
    if policy != "None":
        ctx.plan.delete.extend(impl.workers(ctx, running_only=policy == "Running"))
    impl.finished(ctx)
    ttl = run_policy.get("ttlSecondsAfterFinished") if isinstance(run_policy, dict) else None
    done = parse_time(ctx.status.completion_time)
    if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0 and done is not None:
        if (ctx.now - done).total_seconds() >= ttl:
            ctx.plan.delete_job = True


def dependency_cycle(body: dict[str, Any], observed: dict[tuple[str, str], dict[str, Any] | None]) -> str | None:
    """The message naming the ring when ``body`` references itself or lies on a cycle of references among the
    jobs observed in its namespace (the reconciler fetches referenced jobs transitively); else None."""
    start = refgraph.node_of(body)
    if start is None:
        return None

    def refs_of(node: tuple[str, str]) -> list[tuple[str, tuple[str, str]]]:
        other = body if node == start else observed.get(node)
        return refgraph.referenced_fields(other, waits=True) if other is not None else []

    found = refgraph.find_cycle(start, refs_of)
    return refgraph.cycle_message(*found) if found is not None else None


def finish(ctx: Ctx, impl: KindImpl, phase: str, reason: str, message: str) -> None:
    """End the job now and apply cleanPodPolicy on the same pass."""
    ctx.move(phase, reason, message)
    policy = ctx.spec.run_policy.clean_pod_policy
    if policy != "None":
        ctx.plan.delete.extend(impl.workers(ctx, running_only=policy == "Running"))
    impl.finished(ctx)


def _active(ctx: Ctx, impl: KindImpl) -> None:
    st, spec, now = ctx.status, ctx.spec, ctx.now
    if st.phase is None:
        ctx.move("Pending", "Created", f"{ctx.job.kind} accepted")
    refs = impl.refs(ctx)
    ring = dependency_cycle(ctx.body, ctx.observed.refs)
    if ring is not None:
        set_condition(st, "WaitingForDependency", "False", "DependencyCycle", ring, now, ctx.generation)
        finish(ctx, impl, "Failed", "DependencyCycle", ring)
        return
    if refs:
        cond = condition(st, "WaitingForDependency")
        since = parse_time(cond.last_transition_time) if cond is not None and cond.status == "True" else None
        deps = check_dependencies(refs, ctx.observed.refs, since, spec.run_policy.dependency_timeout_seconds, now)
        if deps.state == "failed":
            set_condition(st, "WaitingForDependency", "False", deps.reason, deps.message, now, ctx.generation)
            finish(ctx, impl, "Failed", deps.reason, deps.message)
            return
        if deps.state == "waiting":
            set_condition(st, "WaitingForDependency", "True", deps.reason, deps.message, now, ctx.generation)
            if st.phase != "Pending" or st.reason != "WaitingForDependency":
                ctx.move("Pending", "WaitingForDependency", deps.message)
            return
        set_condition(st, "WaitingForDependency", "False", "DependenciesSucceeded", "all referenced jobs succeeded",
                      now, ctx.generation)
        st.lineage = deps.lineage
        ctx.deps = deps
        problem = impl.ref_problem(ctx)
        if problem is not None:
            finish(ctx, impl, "Failed", "DependencyIncompatible", problem)
            return
    started = parse_time(st.start_time)
    deadline = spec.run_policy.active_deadline_seconds
    if deadline is not None and started is not None and (now - started).total_seconds() > deadline:
        finish(ctx, impl, "Failed", "DeadlineExceeded", f"ran longer than activeDeadlineSeconds={deadline}s")
        return
    ctx.plan.ensure.extend(impl.children(ctx))
    if spec.run_policy.suspend:
        ctx.plan.delete.extend(impl.workers(ctx, running_only=False))
        if impl.suspended(ctx):
            if st.phase != "Suspended":
                ctx.move("Suspended", "Suspended", "runPolicy.suspend is true; workers deleted, config kept")
        elif st.phase != "Suspended":
            set_condition(st, "Suspended", "False", "Suspending", "waiting for the workers to terminate", now,
                          ctx.generation)
        return
    if st.phase == "Suspended":
        ctx.move("Starting", "Resumed", "runPolicy.suspend is false; recreating the workers")
    impl.run(ctx)


# ---- gang of pods (TrainJob, KernelTuneJob, EvalJob) ---------------------------------------------


def pod_attempt(pod: Manifest) -> int | None:
    """The attempt label of a pod (None when missing or malformed)."""
    raw = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ATTEMPT)
    try:
        return int(str(raw))
    except (TypeError, ValueError):
        return None


def pod_index(pod: Manifest) -> int:
    """The replica index label of a pod (0 when missing)."""
    raw = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_INDEX)
    try:
        return int(str(raw))
    except (TypeError, ValueError):
        return 0


def pod_name(pod: Manifest) -> str:
    """metadata.name."""
    return str((pod.get("metadata") or {}).get("name", ""))


def pod_refs(pods: list[Manifest], running_only: bool) -> list[ChildRef]:
    """Delete references for pods (only unfinished ones when ``running_only``)."""
    out = []
    for p in pods:
        phase = (p.get("status") or {}).get("phase") or "Pending"
        if running_only and phase in ("Succeeded", "Failed"):
            continue
        out.append(ChildRef("v1", "Pod", pod_name(p)))
    return out


ANNOTATION_SPEC_HASH = "trex.dev/pod-spec-hash"
ANNOTATION_CONFIG_HASH = "trex.dev/config-hash"


def spec_hash(pod: Manifest) -> str:
    """Short hash of a pod's spec and rendered config: a pod whose hash differs was built from an older job spec."""
    config = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_CONFIG_HASH, "")
    return hashlib.sha256(json.dumps([pod.get("spec"), config], sort_keys=True).encode()).hexdigest()[:16]


SERVER_ROLE = "server"
"""trex.dev/role of model-server pods (a Deployment's, outside the gang and its attempts)."""


def gang_pods(pods: list[Manifest]) -> list[Manifest]:
    """The pods of the worker gang: every observed pod except the model servers' (their Deployments own them)."""
    return [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE) != SERVER_ROLE]


def current_pods(ctx: Ctx) -> list[Manifest]:
    """Observed gang pods of the current attempt."""
    return [p for p in gang_pods(ctx.observed.pods) if pod_attempt(p) == ctx.status.attempt]


def run_gang(ctx: Ctx, impl: KindImpl, desired: list[Manifest], resume_step: int | None) -> dict[str, PodState] | None:
    """Create/restart the pods of the current attempt as one gang.

    Returns the pod states by name when every desired pod exists and none failed (the caller then
    decides success and progress), or None when this pass created, restarted or finished.
    """
    st = ctx.status
    old = [p for p in gang_pods(ctx.observed.pods) if (pod_attempt(p) or 0) < st.attempt or pod_attempt(p) is None]
    cur = current_pods(ctx)
    if old:
        ctx.plan.delete.extend(ChildRef("v1", "Pod", pod_name(p)) for p in old)
        if st.phase != "Restarting":
            ctx.move("Restarting", "CleaningUp", f"waiting for {len(old)} pod(s) of earlier attempts to terminate")
        return None
    hashes = {}
    for m in desired:
        h = spec_hash(m)
        m["metadata"].setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = h
        hashes[m["metadata"]["name"]] = h
    stale = [p for p in cur if pod_name(p) not in hashes
             or ((p.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SPEC_HASH, hashes[pod_name(p)])
             != hashes[pod_name(p)]]
    if stale and st.phase not in ("Succeeded", "Failed"):
        # the spec changed under running pods: the gang restarts on the new spec (not a failure)
        ctx.plan.delete.extend(ChildRef("v1", "Pod", pod_name(p)) for p in cur)
        st.restarts = {**st.restarts, "specChanged": st.restarts.get("specChanged", 0) + 1}
        st.attempt += 1
        ctx.plan.restart_causes.append("specChanged")
        ctx.move("Restarting", "SpecChanged", f"pod spec changed ({pod_name(stale[0])}); restarting all pods as "
                                              f"attempt {st.attempt}")
        return None
    states = {pod_name(p): classify_pod(p) for p in cur}
    failed = [(n, s) for n, s in states.items() if s.phase == "Failed"]
    if failed:
        _gang_failure(ctx, impl, cur, failed, resume_step)
        return None
    have = set(states)
    missing = [m for m in desired if m["metadata"]["name"] not in have]
    if missing:
        ctx.plan.ensure.extend(missing)
        if st.start_time is None:
            st.start_time = iso(ctx.now)
        if st.phase in ("Pending", "Restarting", None) or st.phase == "Suspended":
            reason = "Restarted" if st.attempt > 0 else "PodsCreated"
            ctx.move("Starting", reason, f"attempt {st.attempt}: creating {len(desired)} pod(s)")
        return None
    return states


def _gang_failure(ctx: Ctx, impl: KindImpl, cur: list[Manifest], failed: list[tuple[str, PodState]],
                  resume_step: int | None) -> None:
    st, rp = ctx.status, ctx.spec.run_policy
    fatal = [(n, s) for n, s in failed if s.cause in FATAL_CAUSES]
    genuine = [(n, s) for n, s in failed if s.genuine]
    name, state = (fatal or genuine or failed)[0]
    cause = state.cause or "failure"
    if fatal:
        finish(ctx, impl, "Failed", _FATAL_REASONS.get(cause, "PodFailed"), f"pod {name}: {state.message}")
        return
    used = sum(v for k, v in st.restarts.items() if k in GENUINE_CAUSES)
    if state.genuine and used >= rp.backoff_limit:
        finish(ctx, impl, "Failed", "BackoffLimitExceeded",
               f"pod {name} failed ({cause}: {state.message}) after {used} restart(s); backoffLimit={rp.backoff_limit}")
        return
    ctx.plan.delete.extend(ChildRef("v1", "Pod", pod_name(p)) for p in cur)
    st.restarts = {**st.restarts, cause: st.restarts.get(cause, 0) + 1}
    st.attempt += 1
    step = resume_step
    for _, s in failed:
        v = s.summary.get("lastCheckpointStep")
        if isinstance(v, int) and not isinstance(v, bool) and (step is None or v > step):
            step = v
    ctx.plan.restart_causes.append(cause)
    resume = f"; resuming from checkpoint step {step}" if step is not None else ""
    if step is not None:
        st.progress = st.progress.model_copy(update={"resume_step": step})
    ctx.move("Restarting", "GangRestart",
             f"pod {name} failed ({cause}: {state.message}); restarting all pods as attempt {st.attempt}{resume}")
