"""Shared machinery of the instance generators: seeds, domains, feasibility-aware sampling, IR helpers."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from trex.ordata.ir import Constraint, Instance, Objective, Param, ParamValue, Sense, Variable

MAX_ATTEMPTS = 25


class GenerationError(RuntimeError):
    """No feasible, bounded instance was found within the attempt cap."""


class Infeasible(Exception):
    """Raised by a family builder when a sampled instance fails its structural feasibility check."""


@dataclass(frozen=True)
class Domain:
    """An industry setting of a family: wording, units and entity name pools."""

    key: str
    title: str
    intro: str
    words: dict[str, str] = field(default_factory=dict)
    names: dict[str, tuple[str, ...]] = field(default_factory=dict)


# Draws one candidate instance from (rng, size, domain, seed); raises Infeasible when it must be resampled.
Builder = Callable[[np.random.Generator, int, Domain, int], Instance]


@dataclass(frozen=True)
class Family:
    """A generator family: name, problem class, domains and builder."""

    name: str
    kind: Literal["LP", "QP", "MILP"]
    domains: tuple[Domain, ...]
    build: Builder
    version: str = "1"
    note: str = ""


def derive_seed(master_seed: int, family: str, index: int) -> int:
    """A 63-bit seed from (master seed, family, index): independent streams per instance."""
    digest = hashlib.sha256(f"{master_seed}:{family}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def sample_feasible(fam: Family, seed: int, size: int, domain: Domain | None = None,
                    accept: Callable[[Instance], str | None] | None = None,
                    max_attempts: int = MAX_ATTEMPTS) -> tuple[Instance, int]:
    """Draw candidates until one passes the family's checks and ``accept`` (None = accepted).

    ``accept`` typically solves the instance and returns a reason when it is infeasible or unbounded.
    Returns the instance and the number of attempts; raises :class:`GenerationError` at the cap.
    """
    rng = np.random.default_rng(seed)
    dom = domain if domain is not None else fam.domains[int(rng.integers(len(fam.domains)))]
    reasons: list[str] = []
    for attempt in range(1, max_attempts + 1):
        try:
            inst = fam.build(rng, size, dom, seed)
        except Infeasible as exc:
            reasons.append(str(exc))
            continue
        inst.validate()
        why = accept(inst) if accept is not None else None
        if why is None:
            return inst, attempt
        reasons.append(why)
    last = "; ".join(dict.fromkeys(reasons[-3:]))
    raise GenerationError(
        f"{fam.name}: no feasible bounded instance after {max_attempts} attempts (seed {seed}, size {size}): {last}"
    )


# --- small helpers used by every family --------------------------------------------------------------
def slug(text: str) -> str:
    """Identifier-safe lowercase form of a display name ("Plant A" -> "plant_a")."""
    s = re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()
    return s if s and not s[0].isdigit() else f"n{s}"


def pick(rng: np.random.Generator, pool: Sequence[str], k: int) -> list[str]:
    """``k`` distinct names from ``pool`` (numbered beyond its length), in a random order."""
    names = list(pool)
    while len(names) < k:
        names.append(f"{pool[len(names) % len(pool)]} {len(names) // len(pool) + 1}")
    idx = rng.permutation(len(names))[:k]
    return [names[int(i)] for i in idx]


def r(x: float, digits: int = 2) -> float:
    """Round data to a printable precision (integers stay integral)."""
    return float(round(float(x), digits))


def ints(rng: np.random.Generator, lo: int, hi: int, n: int) -> list[float]:
    """``n`` integers in [lo, hi] as floats."""
    return [float(v) for v in rng.integers(lo, hi + 1, size=n)]


def param(name: str, value: ParamValue, index: Sequence[str], unit: str, description: str, template: str) -> Param:
    """Shorthand constructor of :class:`Param`."""
    return Param(name=name, value=value, index=tuple(index), unit=unit, description=description, template=template)


def cons(name: str, coeffs: dict[str, float], sense: Sense, rhs: float, group: str, description: str = "") -> Constraint:
    """Shorthand constructor of :class:`Constraint` (drops zero coefficients)."""
    return Constraint(name=name, coeffs={k: float(v) for k, v in coeffs.items() if v != 0}, sense=sense,
                      rhs=float(rhs), group=group, description=description)


def make_instance(fam_name: str, dom: Domain, seed: int, sets: dict[str, list[str]], params: list[Param],
                  variables: list[Variable], constraints: list[Constraint], objective: Objective,
                  notes: dict[str, Any], version: str = "1") -> Instance:
    """Assemble an :class:`Instance` with the domain's intro and title."""
    n = {"intro": dom.intro, **{k: str(v) for k, v in notes.items()}}
    return Instance(family=fam_name, domain=dom.key, title=dom.title, seed=seed, sets=sets,
                    params={p.name: p for p in params}, variables=tuple(variables), constraints=tuple(constraints),
                    objective=objective, generator_version=version, notes=n)
