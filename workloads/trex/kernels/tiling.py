"""Stage 1: tile/configuration selection as a MILP.

One binary z_c per candidate configuration c (the product of the backend's parameter values, tile sizes
included). Constraints: exactly one configuration; its per-tile working set fits the capacity (a cache
level, or the usable on-chip buffer: half of it under double buffering); configurations violating
alignment or divisibility are fixed to zero. Objective: minimise the cost model's predicted time.
Ranked starting points come from re-solving with no-good cuts; the directions worth exploring are the
parameters whose alternatives the model cannot separate from the optimum (within ``spread``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from trex.kernels.backends.base import DIRECTION_OF, Backend, DeviceFacts, ParamSpace
from trex.kernels.suite.base import KernelSpec, elem_bytes

Solver = Literal["highs", "gurobi"]


@dataclass(frozen=True)
class Candidate:
    """One configuration with its predicted time and per-tile working set."""

    params: dict[str, int]
    predicted: float
    working_set: float


@dataclass(frozen=True)
class TilingPlan:
    """Ranked starting configurations and the parameters (with their directions) worth searching first."""

    ranked: list[Candidate]
    param_order: list[str]
    directions: list[str]
    capacity: float
    solver: str
    regime: str = ""
    rejected: dict[str, int] = field(default_factory=dict)


def enumerate_configs(space: ParamSpace, fixed: Mapping[str, int] | None = None, limit: int = 50_000) -> list[dict[str, int]]:
    """Cartesian product of the space (``fixed`` parameters pinned); refuses to exceed ``limit``."""
    names = sorted(space)
    values = [((fixed[n],) if fixed and n in fixed else space[n]) for n in names]
    total = 1
    for v in values:
        total *= len(v)
    if total > limit:
        raise ValueError(f"{total} configurations exceed the MILP limit {limit}; pin some parameters")
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)]


def solve_selection(costs: Sequence[float], weights: Sequence[float], capacity: float, allowed: Sequence[bool],
                    k: int = 5, solver: Solver = "highs") -> list[int]:
    """min sum c_i z_i s.t. sum z_i = 1, sum w_i z_i <= capacity, z_i = 0 where not allowed, z binary;
    the k best solutions in order (each re-solve forbids the previous optimum)."""
    n = len(costs)
    if not (len(weights) == len(allowed) == n):
        raise ValueError("costs, weights and allowed must have equal length")
    out: list[int] = []
    banned = [not a for a in allowed]
    if solver == "gurobi":
        import gurobipy as gp

        env = gp.Env(params={"OutputFlag": 0})
        m = gp.Model(env=env)
        z = m.addVars(list(range(n)), vtype=gp.GRB.BINARY, obj=[float(c) for c in costs])
        m.addConstr(z.sum() == 1)
        m.addConstr(gp.quicksum(weights[i] * z[i] for i in range(n)) <= capacity)
        for i in range(n):
            if banned[i]:
                z[i].setAttr("UB", 0.0)
        for _ in range(k):
            m.optimize()
            if m.Status != gp.GRB.OPTIMAL:
                break
            best = max(range(n), key=lambda i: z[i].X)
            out.append(best)
            z[best].setAttr("UB", 0.0)
        m.dispose()
        env.dispose()
        return out
    import highspy

    h = _new_highs(highspy)
    h.setOptionValue("output_flag", False)
    zs = [h.addBinary(obj=float(c)) for c in costs]
    h.addConstr(sum(zs) == 1)
    h.addConstr(sum(float(w) * zi for w, zi in zip(weights, zs, strict=True)) <= float(capacity))
    for i in range(n):
        if banned[i]:
            h.changeColBounds(i, 0.0, 0.0)
    for _ in range(k):
        h.minimize()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            break
        vals = list(h.getSolution().col_value)
        best = max(range(n), key=lambda i: vals[i])
        out.append(best)
        h.changeColBounds(best, 0.0, 0.0)
    return out


def _new_highs(highspy: Any) -> Any:
    """A silent HiGHS instance (its licence banner goes to the C-level stdout on construction)."""
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
    h.setOptionValue("output_flag", False)
    return h


def _pow2_ceil(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def working_set(spec: KernelSpec, shape: Mapping[str, int], dtype: str, params: Mapping[str, int]) -> float:
    """Bytes one tile touches: the GEMM's A/B/C tiles, a BLOCK-wide slice, or a CHUNK of rows."""
    e = elem_bytes(dtype)
    if spec.kclass == "gemm":
        return 4.0 * (params["MB"] * params["KB"] + params["KB"] * params["NB"] + params["MB"] * params["NB"])
    if "BLOCK" in params:
        return spec.tile_bytes(shape, params["BLOCK"], e)
    return spec.tile_bytes(shape, params.get("CHUNK", 1), e)


def admissible(spec: KernelSpec, shape: Mapping[str, int], params: Mapping[str, int], cores: int) -> str | None:
    """Alignment/divisibility rules; the reason a configuration is excluded, or None."""
    vec = params.get("VEC", 0)
    if spec.kclass == "gemm":
        if vec and params["NB"] % vec:
            return "NB not a multiple of the vector width"
        if params["NB"] > max(16, _pow2_ceil(shape["out"])) or params["KB"] > max(32, _pow2_ceil(shape["hidden"])):
            return "tile larger than the padded dimension"
        if params["MB"] > max(4, _pow2_ceil(max(1, shape["tokens"] // max(1, shape["experts"])))):
            return "MB larger than the average group"
    if "BLOCK" in params:
        if vec and params["BLOCK"] % vec:
            return "BLOCK not a multiple of the vector width"
        if params["BLOCK"] > max(256, _pow2_ceil(shape[spec.tile_dim])):
            return "BLOCK larger than the padded dimension"
    if "CHUNK" in params and params.get("THREADS", 1) > 1:
        units = shape.get(spec.tile_dim, 1) if "BLOCK" not in params else shape.get("rows", 1)
        if -(-units // params["CHUNK"]) < params["THREADS"] and params["CHUNK"] > 1:
            return "fewer chunks than threads"
    if vec == 0 and params.get("UNROLL", 1) == 1 and False:
        return None
    if vec and params.get("UNROLL", 1) != 1:
        return "UNROLL only applies to scalar loops"
    return None


def plan(spec: KernelSpec, shape: Mapping[str, int], dtype: str, backend: Backend, facts: DeviceFacts,
         predictor: Callable[[KernelSpec, Mapping[str, int], str, Mapping[str, int], DeviceFacts], float],
         k: int = 5, fixed: Mapping[str, int] | None = None, capacity: float | None = None,
         solver: Solver = "highs", spread: float = 0.25) -> TilingPlan:
    """Build and solve the MILP for one (kernel, shape, dtype); see the module docstring."""
    from trex.kernels.roofline import classify

    space = backend.param_space(spec, shape)
    configs = enumerate_configs(space, fixed)
    cap = capacity if capacity is not None else float(facts.caches.get("L2", 1 << 20))
    costs, weights, allowed = [], [], []
    rejected: dict[str, int] = {}
    for c in configs:
        costs.append(predictor(spec, shape, dtype, c, facts))
        weights.append(working_set(spec, shape, dtype, c))
        why = admissible(spec, shape, c, facts.cores)
        allowed.append(why is None)
        if why:
            rejected[why] = rejected.get(why, 0) + 1
    # scale objective to O(1) for the solver's tolerances
    scale = 1.0 / max(min(costs), 1e-12)
    idx = solve_selection([c * scale for c in costs], weights, cap, allowed, k=k, solver=solver)
    if not idx:
        raise ValueError(f"no configuration of {spec.name} fits capacity {cap:.0f} B with the alignment rules")
    ranked = [Candidate(configs[i], costs[i], weights[i]) for i in idx]
    best = ranked[0]
    sens: dict[str, float] = {}
    for p, vals in space.items():
        alts = []
        for v in vals:
            if v == best.params[p]:
                continue
            alt = {**best.params, p: v}
            if admissible(spec, shape, alt, facts.cores) is None and working_set(spec, shape, dtype, alt) <= cap:
                alts.append(predictor(spec, shape, dtype, alt, facts) / best.predicted - 1.0)
        if alts:
            sens[p] = min(alts)
    order = sorted(sens, key=lambda p: (sens[p] > spread, sens[p], p))
    dirs: list[str] = []
    for p in order:
        d = DIRECTION_OF.get(p, "tile")
        if d not in dirs:
            dirs.append(d)
    return TilingPlan(ranked, order, dirs, cap, solver, classify(spec, shape, dtype, facts).regime, rejected)
