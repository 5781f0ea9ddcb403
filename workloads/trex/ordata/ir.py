"""Instance IR: sets, parameters, variables, linear constraints and a linear (or quadratic) objective.

Every generator produces an :class:`Instance`; the solver adapters, the verifier, the renderer and the
reconstructor all read this one form. :func:`canonical` gives a sorted, float-normalised JSON view and
:meth:`Instance.content_hash` the sha256 of it, so the same instance always hashes the same.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

VarType = Literal["continuous", "integer", "binary"]
Sense = Literal["<=", ">=", "=="]
ObjSense = Literal["min", "max"]
ParamValue = float | list[float] | list[list[float]]

IR_VERSION = "trex.ordata.ir/v1"


def norm_float(x: float) -> float:
    """Round to 12 significant digits so that equal data always serialises identically (-0.0 -> 0.0)."""
    if math.isinf(x):
        return x
    y = float(f"{float(x):.12g}")
    return 0.0 if y == 0 else y


@dataclass(frozen=True)
class Param:
    """A named data parameter indexed by zero or more sets (scalar, vector or matrix)."""

    name: str
    value: ParamValue
    index: tuple[str, ...] = ()
    unit: str = ""
    description: str = ""
    template: str = ""
    """Long-form sentence with <e> (first index entity), <f> (second index entity) and <v> (the number)."""

    def flat(self) -> list[float]:
        """All numbers of the parameter in row-major order."""
        v = self.value
        if isinstance(v, list):
            out: list[float] = []
            for row in v:
                out.extend(row if isinstance(row, list) else [row])
            return [float(x) for x in out]
        return [float(v)]


@dataclass(frozen=True)
class Variable:
    """A decision variable with type, bounds (None: unbounded above), unit and a readable description."""

    name: str
    vtype: VarType = "continuous"
    lb: float = 0.0
    ub: float | None = None
    unit: str = ""
    description: str = ""


@dataclass(frozen=True)
class Constraint:
    """``sum(coeffs[v] * v) sense rhs``; ``group`` names the family of constraints it belongs to."""

    name: str
    coeffs: dict[str, float]
    sense: Sense
    rhs: float
    group: str = ""
    description: str = ""


@dataclass(frozen=True)
class Objective:
    """``constant + sum(linear[v] * v) + sum(q * u * w for u, w, q in quadratic)`` to minimise or maximise."""

    sense: ObjSense
    linear: dict[str, float]
    quadratic: tuple[tuple[str, str, float], ...] = ()
    constant: float = 0.0
    description: str = ""


@dataclass(frozen=True)
class Instance:
    """One optimisation instance with its data, model and provenance of the generator."""

    family: str
    domain: str
    title: str
    seed: int
    sets: dict[str, list[str]]
    params: dict[str, Param]
    variables: tuple[Variable, ...]
    constraints: tuple[Constraint, ...]
    objective: Objective
    generator_version: str = "1"
    notes: dict[str, str] = field(default_factory=dict)

    # ----------------------------------------------------------------------------------------------
    @property
    def is_quadratic(self) -> bool:
        """True when the objective has quadratic terms."""
        return bool(self.objective.quadratic)

    @property
    def is_mip(self) -> bool:
        """True when any variable is integer or binary."""
        return any(v.vtype != "continuous" for v in self.variables)

    def var_index(self) -> dict[str, int]:
        """Variable name -> column position."""
        return {v.name: i for i, v in enumerate(self.variables)}

    def validate(self) -> None:
        """Raise ValueError on dangling names, duplicate names, NaN data or inverted bounds."""
        names = [v.name for v in self.variables]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.family}: duplicate variable names")
        cnames = [c.name for c in self.constraints]
        if len(set(cnames)) != len(cnames):
            raise ValueError(f"{self.family}: duplicate constraint names")
        known = set(names)
        for v in self.variables:
            if v.ub is not None and v.ub < v.lb:
                raise ValueError(f"{self.family}: variable {v.name} has ub < lb")
        for c in self.constraints:
            for n, a in c.coeffs.items():
                if n not in known:
                    raise ValueError(f"{self.family}: constraint {c.name} uses unknown variable {n}")
                if not math.isfinite(a):
                    raise ValueError(f"{self.family}: constraint {c.name} has a non-finite coefficient")
            if not math.isfinite(c.rhs):
                raise ValueError(f"{self.family}: constraint {c.name} has a non-finite rhs")
        for n in self.objective.linear:
            if n not in known:
                raise ValueError(f"{self.family}: objective uses unknown variable {n}")
        for u, w, _ in self.objective.quadratic:
            if u not in known or w not in known:
                raise ValueError(f"{self.family}: quadratic objective uses unknown variable {u} or {w}")

    # ----------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (inverse of :func:`instance_from_dict`)."""
        d = asdict(self)
        d["ir_version"] = IR_VERSION
        d["params"] = {k: asdict(p) for k, p in self.params.items()}
        return d

    def to_json(self) -> str:
        """JSON text of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def content_hash(self) -> str:
        """sha256 of the canonical JSON (stable across runs, platforms and dict orders)."""
        text = json.dumps(canonical(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def evaluate_objective(self, values: dict[str, float]) -> float:
        """Objective value at ``values`` (missing variables count as 0)."""
        o = self.objective
        total = o.constant + math.fsum(a * values.get(n, 0.0) for n, a in o.linear.items())
        total += math.fsum(q * values.get(u, 0.0) * values.get(w, 0.0) for u, w, q in o.quadratic)
        return total


def _norm(x: Any) -> Any:
    if isinstance(x, float):
        return norm_float(x)
    if isinstance(x, int) and not isinstance(x, bool):
        return norm_float(float(x))
    if isinstance(x, list | tuple):
        return [_norm(v) for v in x]
    if isinstance(x, dict):
        return {k: _norm(v) for k, v in x.items()}
    return x


def canonical(inst: Instance) -> dict[str, Any]:
    """Sorted, float-normalised view: variables, constraints, coefficients and quadratic terms in name order."""
    quad: dict[tuple[str, str], float] = {}
    for u, w, q in inst.objective.quadratic:
        key = (u, w) if u <= w else (w, u)
        quad[key] = quad.get(key, 0.0) + q
    return {
        "family": inst.family,
        "domain": inst.domain,
        "sets": {k: list(v) for k, v in sorted(inst.sets.items())},
        "params": {k: _norm(asdict(p)) for k, p in sorted(inst.params.items())},
        "variables": [_norm(asdict(v)) for v in sorted(inst.variables, key=lambda v: v.name)],
        "constraints": [
            {"name": c.name, "sense": c.sense, "rhs": norm_float(c.rhs),
             "coeffs": [[n, norm_float(a)] for n, a in sorted(c.coeffs.items()) if a != 0]}
            for c in sorted(inst.constraints, key=lambda c: c.name)
        ],
        "objective": {
            "sense": inst.objective.sense,
            "constant": norm_float(inst.objective.constant),
            "linear": [[n, norm_float(a)] for n, a in sorted(inst.objective.linear.items()) if a != 0],
            "quadratic": [[u, w, norm_float(q)] for (u, w), q in sorted(quad.items()) if q != 0],
        },
    }


def instance_from_dict(d: dict[str, Any]) -> Instance:
    """Rebuild an :class:`Instance` from :meth:`Instance.to_dict` output (JSON round-trip)."""
    if d.get("ir_version", IR_VERSION) != IR_VERSION:
        raise ValueError(f"ir_version {d.get('ir_version')!r} is not {IR_VERSION!r}")
    o = d["objective"]
    return Instance(
        family=d["family"], domain=d["domain"], title=d["title"], seed=int(d["seed"]),
        sets={k: list(v) for k, v in d["sets"].items()},
        params={k: Param(name=p["name"], value=p["value"], index=tuple(p["index"]), unit=p["unit"],
                         description=p["description"], template=p.get("template", ""))
                for k, p in d["params"].items()},
        variables=tuple(Variable(**v) for v in d["variables"]),
        constraints=tuple(Constraint(name=c["name"], coeffs=dict(c["coeffs"]), sense=c["sense"], rhs=c["rhs"],
                                     group=c["group"], description=c["description"]) for c in d["constraints"]),
        objective=Objective(sense=o["sense"], linear=dict(o["linear"]),
                            quadratic=tuple((u, w, q) for u, w, q in o["quadratic"]),
                            constant=o["constant"], description=o["description"]),
        generator_version=d.get("generator_version", "1"), notes=dict(d.get("notes", {})),
    )


def instance_from_json(text: str) -> Instance:
    """Parse :meth:`Instance.to_json` output."""
    return instance_from_dict(json.loads(text))
