"""The jobs a trex object references (dataFrom, kernelsFrom, modelFrom, opd teachers) and the cycles they form.

A job that references itself, or a ring of jobs that reference each other, would wait for its own output
forever; `trex validate` refuses such manifests (across the files and documents it is given) and the operator
fails such a job in the cluster with a ``DependencyCycle`` condition and Event naming the ring.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trex.config_base import DNS1123_LABEL

REF_FIELDS = (("dataFrom", "ORDataJob"), ("kernelsFrom", "KernelTuneJob"), ("modelFrom", "TrainJob"))
MAX_DEPTH = 64
"""Longest chain of references followed (a manifest set or a namespace holds at most this many in a row)."""

Node = tuple[str, str]
"""(kind, name) of a job in one namespace."""


def _valid_name(name: Any) -> bool:
    return isinstance(name, str) and len(name) <= 63 and DNS1123_LABEL.match(name) is not None


def referenced_fields(body: Mapping[str, Any], waits: bool = False) -> list[tuple[str, Node]]:
    """(field path, (kind, name)) of every job a raw object references (malformed specs tolerated); with
    ``waits`` only those the job waits for (not an opd teacher given its own ``path``, not a KernelTuneJob's
    shapesFrom)."""
    spec = body.get("spec")
    out: list[tuple[str, Node]] = []
    if not isinstance(spec, dict):
        return out
    for key, kind in REF_FIELDS:
        ref = spec.get(key)
        if isinstance(ref, dict) and _valid_name(ref.get("name")):
            out.append((f"spec.{key}", (kind, ref["name"])))
    kernels = spec.get("kernels")
    shapes_from = kernels.get("shapesFrom") if isinstance(kernels, dict) else None
    name = shapes_from.get("trainJob") if isinstance(shapes_from, dict) else None
    if not waits and isinstance(name, str) and _valid_name(name):  # a KernelTuneJob reads the TrainJob's spec, never waits for it
        out.append(("spec.kernels.shapesFrom", ("TrainJob", name)))
    trainer = spec.get("trainer")
    opd = trainer.get("opd") if isinstance(trainer, dict) else None
    teachers = opd.get("teachers") if isinstance(opd, dict) else None
    for i, t in enumerate(teachers if isinstance(teachers, list) else []):
        name = t.get("name") if isinstance(t, dict) else None
        if isinstance(name, str) and _valid_name(name) and not (waits and isinstance(t, dict) and t.get("path")):
            out.append((f"spec.trainer.opd.teachers[{i}]", ("TrainJob", name)))
    return out


def referenced(body: Mapping[str, Any]) -> list[Node]:
    """(kind, name) of the jobs a raw object references, in field order."""
    return [node for _, node in referenced_fields(body)]


def node_of(body: Mapping[str, Any]) -> Node | None:
    """(kind, name) of a raw object, None when it has no string kind and name."""
    meta = body.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    kind = body.get("kind")
    return (kind, name) if isinstance(kind, str) and isinstance(name, str) else None


def find_cycle(start: Node, refs_of: Callable[[Node], list[tuple[str, Node]]]) -> tuple[str, list[Node]] | None:
    """(field of ``start`` that begins it, the ring ``start -> ... -> start``) when ``start`` lies on a cycle of
    references; ``refs_of`` gives a job's (field, referenced job) pairs ([] for an unknown job). Depth-first,
    at most :data:`MAX_DEPTH` deep, each job expanded once."""
    for field, first in refs_of(start):
        path, seen = [start, first], {first}
        stack = [iter(refs_of(first))]
        if first == start:
            return field, path
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                path.pop()
                continue
            node = nxt[1]
            if node == start:
                return field, [*path, start]
            if node in seen or len(path) >= MAX_DEPTH:
                continue
            seen.add(node)
            path.append(node)
            stack.append(iter(refs_of(node)))
    return None


def describe(ring: list[Node]) -> str:
    """``TrainJob/a -> TrainJob/b -> TrainJob/a``."""
    return " -> ".join(f"{k}/{n}" for k, n in ring)


def cycle_message(field: str, ring: list[Node]) -> str:
    """The one-line problem: which field starts the ring, the ring, why it can never start."""
    what = "references itself" if len(ring) == 2 else f"is part of a dependency cycle {describe(ring)}"
    return f"{field}: {describe(ring[:1])} {what}; each job would wait for its own output forever"
