"""Stage 1: the joint tiling decision of one kernel as a mixed-integer linear programme.

Variables: a one-hot binary x[p, v] per tunable parameter p and allowed value v (tile sizes per
dimension, K split, buffer count, thread/core split, loop order, vector width, ...), and a one-hot
pseudo-parameter LEVEL: the memory level that holds one stage's working set. Every term of the cost
model that couples parameters lives on a *group* of them: one continuous weight w[g, c] per value
combination c of the group, tied to the binaries by its marginals (sum over c with c[p] = v of w[g, c]
equals x[p, v]). With binary x the weights are exactly the product indicator, so products of tile sizes
(a GEMM's MB*KB + KB*NB + MB*NB footprint) or of buffers and tile length stay linear.

Constraints: one value per parameter; the stage footprint (double buffering included: the footprint
terms are functions of the buffer count) within the chosen level's capacity (big-M on x[LEVEL, L]);
alignment and divisibility as fixed-zero binaries (x[p, v] = 0) and pairwise exclusions
(x[p, v] + x[q, w] <= 1).

Objective: a linearized stage-latency model. Compute C and memory M are sums of group terms (FLOPs over
the peak of the cores and vector width used; bytes over the measured bandwidth of the level at the
thread count); they are pipelined across buffers: T >= C + a_b M and T >= M + a_b C for the chosen
buffer count b (big-M), where a_b is the fraction of the smaller stream that stays exposed (1 = no
overlap, single buffering; 0 = perfect double buffering). Plus per-stage and per-launch overheads
(group terms). Minimise T + overheads. The k best configurations come from re-solving with a no-good cut
on the previous optimum's binaries; they seed the tree search.

Solved with HiGHS (highspy); the same model goes to Gurobi (gurobipy) for cross-checks within its
size-limited licence.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from trex.kernels.facts import DIRECTION_OF, DeviceFacts, ParamSpace
from trex.kernels.roofline import (
    FORK_JOIN_S,
    LAUNCH_S,
    classify,
    compute_seconds,
    transcendentals,
    unfused_flops,
    vector_width,
)
from trex.kernels.suite.base import KernelSpec, elem_bytes

if TYPE_CHECKING:
    from trex.kernels.backends.base import Backend

Solver = Literal["highs", "gurobi"]
LEVEL = "LEVEL"
"""Pseudo-parameter: index (into TilingModel.levels) of the memory level holding one stage's working set."""
Combo = tuple[int, ...]


@dataclass(frozen=True)
class Group:
    """Terms over the joint values of ``params`` (keys: value tuples in ``params`` order; missing = 0)."""

    params: tuple[str, ...]
    compute: dict[Combo, float] = field(default_factory=dict)
    """Seconds of arithmetic (enters the pipelined max)."""
    memory: dict[Combo, float] = field(default_factory=dict)
    """Seconds of data movement (enters the pipelined max)."""
    overhead: dict[Combo, float] = field(default_factory=dict)
    """Seconds added outside the pipeline: per-stage issue, per-launch fork/join, load imbalance."""
    footprint: dict[Combo, float] = field(default_factory=dict)
    """Bytes one stage keeps in the chosen level (all its buffers)."""


@dataclass(frozen=True)
class TilingModel:
    """One kernel's MILP data: parameter domains, memory levels, cost groups and the excluded values."""

    space: ParamSpace
    levels: tuple[tuple[str, float], ...]
    """(name, capacity in bytes), innermost first; LEVEL takes the indices 0..len-1."""
    groups: tuple[Group, ...]
    overlap: dict[int, float] = field(default_factory=lambda: {1: 0.25})
    """Exposed fraction of the smaller of compute/memory, per value of ``buffers`` (key 1 when there is none)."""
    buffers: str | None = None
    """Parameter holding the buffer count (BUFFER_NUM, STAGES), or None."""
    launch_s: float = 0.0
    forbid: dict[tuple[str, int], str] = field(default_factory=dict)
    """(param, value) -> why it is excluded (alignment, tile larger than the padded dimension)."""
    forbid_pairs: dict[tuple[tuple[str, int], tuple[str, int]], str] = field(default_factory=dict)
    """Pairs of values that cannot be combined (divisibility, vector width vs tile) -> why."""

    def domains(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's values, LEVEL included."""
        return {**self.space, LEVEL: tuple(range(len(self.levels)))}


@dataclass(frozen=True)
class Candidate:
    """One configuration with its modelled time and per-stage working set."""

    params: dict[str, int]
    predicted: float
    working_set: float
    level: str = ""


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
    model: TilingModel | None = None


# ---- evaluating the model at one configuration (the MILP's objective, and the brute-force reference) -----------


def _combo(g: Group, p: Mapping[str, int]) -> Combo:
    return tuple(int(p[n]) for n in g.params)


def violation(model: TilingModel, params: Mapping[str, int]) -> str | None:
    """Why a full assignment (LEVEL included) breaks a constraint, or None when it is feasible."""
    dom = model.domains()
    for n, v in params.items():
        if n not in dom or int(v) not in dom[n]:
            return f"{n}={v} is not a value of the model's space"
        if (n, int(v)) in model.forbid:
            return model.forbid[(n, int(v))]
    for (a, b), why in model.forbid_pairs.items():
        if params.get(a[0]) == a[1] and params.get(b[0]) == b[1]:
            return why
    fp = sum(g.footprint.get(_combo(g, params), 0.0) for g in model.groups)
    name, cap = model.levels[int(params[LEVEL])]
    if fp > cap:
        return f"stage footprint {fp:.0f} B exceeds {name} ({cap:.0f} B)"
    return None


def stage_time(model: TilingModel, params: Mapping[str, int]) -> float:
    """Modelled seconds of a full assignment (LEVEL included), feasible or not."""
    c = sum(g.compute.get(_combo(g, params), 0.0) for g in model.groups)
    m = sum(g.memory.get(_combo(g, params), 0.0) for g in model.groups)
    o = sum(g.overhead.get(_combo(g, params), 0.0) for g in model.groups)
    a = model.overlap[int(params[model.buffers])] if model.buffers else model.overlap[1]
    return max(c + a * m, m + a * c) + o + model.launch_s


def model_time(model: TilingModel, params: Mapping[str, int]) -> tuple[float, int] | None:
    """Best modelled seconds of a configuration over the levels that can hold it, with that level; None when
    no level can (or an alignment rule excludes it)."""
    best: tuple[float, int] | None = None
    for li in range(len(model.levels)):
        full = {**params, LEVEL: li}
        if violation(model, full) is None:
            t = stage_time(model, full)
            if best is None or t < best[0]:
                best = (t, li)
    return best


def footprint(model: TilingModel, params: Mapping[str, int]) -> float:
    """Bytes one stage keeps on chip for these parameters."""
    full = {**params, LEVEL: 0}
    return sum(g.footprint.get(_combo(g, full), 0.0) for g in model.groups)


# ---- the MILP ---------------------------------------------------------------------------------------------------


@dataclass
class _Lp:
    """A solver-neutral MILP: columns (lb, ub, integer, cost) and rows (coefficients, lo, hi)."""

    cols: list[tuple[float, float, bool, float]] = field(default_factory=list)
    rows: list[tuple[dict[int, float], float, float]] = field(default_factory=list)

    def var(self, lb: float = 0.0, ub: float = 1.0, integer: bool = False, cost: float = 0.0) -> int:
        self.cols.append((lb, ub, integer, cost))
        return len(self.cols) - 1

    def row(self, coef: Mapping[int, float], lo: float = -math.inf, hi: float = math.inf) -> None:
        self.rows.append(({i: c for i, c in coef.items() if c != 0.0}, lo, hi))


def build_lp(model: TilingModel) -> tuple[_Lp, dict[tuple[str, int], int]]:
    """The MILP of the module docstring; returns it and the column of every x[p, v]."""
    lp = _Lp()
    dom = model.domains()
    x: dict[tuple[str, int], int] = {}
    for p, vals in dom.items():
        for v in vals:
            x[(p, v)] = lp.var(0.0, 0.0 if (p, v) in model.forbid else 1.0, integer=True)
        lp.row({x[(p, v)]: 1.0 for v in vals}, 1.0, 1.0)
    for (a, b) in model.forbid_pairs:
        if a in x and b in x:
            lp.row({x[a]: 1.0, x[b]: 1.0}, hi=1.0)
    unit = 1e6  # seconds -> microseconds: keeps the objective's coefficients far above the solvers' tolerances
    comp: dict[int, float] = {}
    mem: dict[int, float] = {}
    over: dict[int, float] = {}
    foot: dict[int, float] = {}
    for g in model.groups:
        used = set(g.compute) | set(g.memory) | set(g.overhead) | set(g.footprint)
        if not used:
            continue
        w: dict[Combo, int] = {}
        for c in itertools.product(*(dom[n] for n in g.params)):
            w[c] = lp.var()
            for key, acc in ((g.compute, comp), (g.memory, mem), (g.overhead, over), (g.footprint, foot)):
                if key.get(c):
                    acc[w[c]] = acc.get(w[c], 0.0) + key[c] * (1.0 if key is g.footprint else unit)
        for i, n in enumerate(g.params):
            for v in dom[n]:
                lp.row({**{w[c]: 1.0 for c in w if c[i] == v}, x[(n, v)]: -1.0}, 0.0, 0.0)
    total_fp = sum(max(g.footprint.values(), default=0.0) for g in model.groups)
    for li, (_, cap) in enumerate(model.levels):
        if math.isfinite(cap) and total_fp > cap:
            big = total_fp - cap
            lp.row({**foot, x[(LEVEL, li)]: big}, hi=cap + big)
    scale = unit * sum(max(d.values(), default=0.0) for g in model.groups for d in (g.compute, g.memory)) or 1.0
    t = lp.var(0.0, math.inf, cost=1.0)
    for i, cost in over.items():
        lp.cols[i] = (*lp.cols[i][:3], cost)
    options = [(v, model.overlap[v], x[(model.buffers, v)]) for v in dom[model.buffers]] if model.buffers \
        else [(1, model.overlap[1], None)]
    for _, exposed, xb in options:
        for first, second in ((comp, mem), (mem, comp)):
            coef = {t: 1.0}
            for i, val in first.items():
                coef[i] = coef.get(i, 0.0) - val
            for i, val in second.items():
                coef[i] = coef.get(i, 0.0) - exposed * val
            if xb is not None:  # T >= C + a M - BIG (1 - x_b)
                coef[xb] = coef.get(xb, 0.0) - 2.0 * scale
                lp.row(coef, lo=-2.0 * scale)
            else:
                lp.row(coef, lo=0.0)
    return lp, x


def _solve_highs(lp: _Lp) -> list[float] | None:
    import highspy

    h = _new_highs(highspy)
    inf = highspy.kHighsInf
    for lb, ub, integer, cost in lp.cols:
        h.addVar(lb, ub if math.isfinite(ub) else inf)
        if integer:
            h.changeColIntegrality(h.getNumCol() - 1, highspy.HighsVarType.kInteger)
        h.changeColCost(h.getNumCol() - 1, cost)
    for coef, lo, hi in lp.rows:
        idx = list(coef)
        h.addRow(lo if math.isfinite(lo) else -inf, hi if math.isfinite(hi) else inf, len(idx), idx,
                 [coef[i] for i in idx])
    h.setOptionValue("mip_rel_gap", 1e-9)
    h.setOptionValue("mip_abs_gap", 0.0)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return list(h.getSolution().col_value)


def _solve_gurobi(lp: _Lp) -> list[float] | None:
    import gurobipy as gp

    with gp.Env(params={"OutputFlag": 0}) as env, gp.Model(env=env) as m:
        vs = [m.addVar(lb=lb, ub=ub if math.isfinite(ub) else gp.GRB.INFINITY, obj=cost,
                       vtype=gp.GRB.BINARY if integer and ub > 0 else (gp.GRB.INTEGER if integer else gp.GRB.CONTINUOUS))
              for lb, ub, integer, cost in lp.cols]
        for coef, lo, hi in lp.rows:
            expr = gp.quicksum(c * vs[i] for i, c in coef.items())
            if lo == hi:
                m.addConstr(expr == lo)
            else:
                if math.isfinite(lo):
                    m.addConstr(expr >= lo)
                if math.isfinite(hi):
                    m.addConstr(expr <= hi)
        m.Params.MIPGap = 1e-9
        m.Params.MIPGapAbs = 0.0
        m.optimize()
        if m.Status != gp.GRB.OPTIMAL:
            return None
        return [float(v.X) for v in vs]


def solve(model: TilingModel, k: int = 5, solver: Solver = "highs") -> list[dict[str, int]]:
    """The k best configurations (LEVEL included) in order; each re-solve adds a no-good cut on the previous
    optimum (sum of its chosen binaries <= number of parameters - 1)."""
    lp, x = build_lp(model)
    run = _solve_gurobi if solver == "gurobi" else _solve_highs
    dom = model.domains()
    out: list[dict[str, int]] = []
    for _ in range(k):
        sol = run(lp)
        if sol is None:
            break
        chosen = {p: max(vals, key=lambda v, p=p: sol[x[(p, v)]]) for p, vals in dom.items()}  # type: ignore[misc]
        out.append(chosen)
        lp.row({x[(p, v)]: 1.0 for p, v in chosen.items() if p != LEVEL}, hi=len(model.space) - 1.0)
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


def enumerate_configs(space: ParamSpace, fixed: Mapping[str, int] | None = None, limit: int = 200_000) -> list[dict[str, int]]:
    """Cartesian product of the space (``fixed`` parameters pinned); refuses to exceed ``limit``."""
    names = sorted(space)
    values = [((fixed[n],) if fixed and n in fixed else space[n]) for n in names]
    if math.prod(len(v) for v in values) > limit:
        raise ValueError(f"more than {limit} configurations; pin some parameters")
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)]


# ---- the cpu-c model (the default; other backends build their own) -----------------------------------------------


def _pow2_ceil(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def _vec_eff(vec: int, unroll: int) -> float:
    """Fraction of the vector peak a loop reaches: scalar ~1/4 (unrolling helps a little), simdlen 16 fills a
    512-bit register, wider lengths add independent accumulators."""
    return {0: 0.25 + 0.05 * min(unroll, 4), 8: 0.8, 16: 1.0, 32: 1.15, 64: 1.2}.get(vec, 0.5)


def cpu_model(spec: KernelSpec, shape: Mapping[str, int], dtype: str, space: ParamSpace, facts: DeviceFacts,
              capacity: float | None = None) -> TilingModel:
    """The cpu-c tiling MILP data: stage footprint in L1 or L2 (at most ``capacity``), compute over the
    per-core peak at the vector width and thread count, streaming bytes over the measured bandwidth of the
    data's level at that thread count (a stage spilling out of L1 re-reads 10 %), fork/join per launch,
    per-block issue and chunk imbalance."""
    e = elem_bytes(dtype)
    moved, fl = spec.bytes_moved(shape, e), spec.flops(shape)
    cores = max(1, facts.cores)
    pcp = facts.peak_flops / cores
    cap = capacity if capacity is not None else float(facts.caches.get("L2", 1 << 20))
    levels: tuple[tuple[str, float], ...] = ()
    for lname, size in facts.caches.items():
        if lname in ("L1", "L2") and (not levels or levels[-1][1] < cap):
            levels = (*levels, (lname, float(min(size, cap))))
    levels = levels or (("L2", cap),)
    ths = space.get("THREADS", (1,))
    has = set(space)

    def bw(th: int) -> float:
        return facts.bandwidth_for(moved) * min(1.0, 0.6 + 0.4 * min(th, cores) / cores)

    def pick(*names: str) -> tuple[str, ...]:
        return tuple(n for n in names if n in has)

    groups: list[Group] = []
    forbid: dict[tuple[str, int], str] = {}
    pairs: dict[tuple[tuple[str, int], tuple[str, int]], str] = {}
    n_elem = moved / e
    n_exp = transcendentals(spec, shape, n_elem)
    # compute: FLOPs over the cores' peak at the vector width (accumulating in double costs 40 %), transcendental
    # evaluations at the libm or polynomial rate
    cg = pick("VEC", "UNROLL", "ACC_DOUBLE", "EXP_POLY", "THREADS")
    comp: dict[Combo, float] = {}
    for c in itertools.product(*(space[n] for n in cg)):
        p = dict(zip(cg, c, strict=True))
        th = min(int(p.get("THREADS", 1)), cores)
        vec = vector_width(spec, shape, int(p.get("VEC", 0)))
        eff = _vec_eff(vec, int(p.get("UNROLL", 1)))
        t = compute_seconds(spec, shape, fl, pcp * th, eff, bool(p.get("ACC_DOUBLE", 0))) if spec.kclass != "gemm" else 0.0
        exp_cost = 1.2e-9 if not p.get("EXP_POLY", 0) else (0.15e-9 if vec else 0.6e-9)
        comp[c] = t + n_exp * exp_cost / th
    groups.append(Group(cg, compute=comp))
    # memory: the data's bandwidth at the thread count; a stage spilling out of L1 re-reads part of it
    mg = (LEVEL, *pick("THREADS"))
    memory: dict[Combo, float] = {}
    for c in itertools.product(range(len(levels)), *(space[n] for n in mg[1:])):
        th = int(c[1]) if len(c) > 1 else 1
        spill = 0.1 if (levels[c[0]][0] != "L1" and "BLOCK" in has) else 0.0
        memory[c] = moved / bw(th) * (1.0 + spill)
    groups.append(Group(mg, memory=memory))
    if "FUSED" in has and "VEC" in has and unfused_flops(spec, shape):
        fg = pick("FUSED", "VEC", "UNROLL", "THREADS")
        fcomp: dict[Combo, float] = {}
        for c in itertools.product(*(space[n] for n in fg)):
            p = dict(zip(fg, c, strict=True))
            if not p["FUSED"]:
                eff = _vec_eff(vector_width(spec, shape, int(p["VEC"])), int(p.get("UNROLL", 1)))
                fcomp[c] = unfused_flops(spec, shape) / (pcp * min(int(p.get("THREADS", 1)), cores) * eff)
        groups.append(Group(fg, compute=fcomp))
    if "FUSED" in has and spec.kclass in ("loss", "mixing"):
        row_bytes = moved / max(1, shape.get("rows", shape.get("tokens", 1)))
        extra = 1.0 if row_bytes > facts.caches.get("L2", 1 << 20) / 2 else 0.0
        groups.append(Group(pick("FUSED", "THREADS"), memory={
            (f, th): extra * moved / bw(th) for f in space["FUSED"] for th in ths if not f}
            if "THREADS" in has else {(f,): extra * moved / bw(1) for f in space["FUSED"] if not f}))
    if "THREADS" in has:
        groups.append(Group(("THREADS",), overhead={(th,): FORK_JOIN_S for th in ths if th > 1}))
    # footprint and per-stage issue
    if spec.kclass == "gemm":
        mb_max = max(4, _pow2_ceil(max(1, shape["tokens"] // max(1, shape["experts"]))))
        for v in space["MB"]:
            if v > mb_max:
                forbid[("MB", v)] = "MB larger than the average group"
        for v in space["NB"]:
            if v > max(16, _pow2_ceil(shape["out"])):
                forbid[("NB", v)] = "tile larger than the padded dimension"
        for v in space["KB"]:
            if v > max(32, _pow2_ceil(shape["hidden"])):
                forbid[("KB", v)] = "tile larger than the padded dimension"
        for nb in space["NB"]:
            for vec in space["VEC"]:
                if vec and nb % vec:
                    pairs[(("NB", nb), ("VEC", vec))] = "NB not a multiple of the vector width"
        groups.append(Group(("MB", "NB", "KB"), footprint={
            (mb, nb, kb): 4.0 * (mb * kb + kb * nb + mb * nb)
            for mb in space["MB"] for nb in space["NB"] for kb in space["KB"]}))
        # GEMM compute: reuse by loop order, register width of the N tile, cache fit of the stage
        reuse = {0: 1.0, 1: 1.6, 2: 2.4, 3: 3.0}
        gg = ("VEC", "UNROLL", "NB", "ORDER", LEVEL, *pick("THREADS"))
        gcomp: dict[Combo, float] = {}
        for c in itertools.product(space["VEC"], space["UNROLL"], space["NB"], space["ORDER"], range(len(levels)),
                                   *(ths for _ in pick("THREADS"))):
            vec, un, nb, order, li = c[:5]
            th = min(int(c[5]) if len(c) > 5 else 1, cores)
            fit = 1.0 if levels[li][0] == "L1" else 0.8
            width = min(1.0, nb / (16.0 if vec >= 16 else 8.0))
            gcomp[c] = fl / (pcp * th * _vec_eff(vec, un) * reuse.get(order, 1.0) * fit * width)
        groups.append(Group(gg, compute=gcomp))
        groups.append(Group(("MB", "NB"), overhead={
            (mb, nb): (shape["experts"] + shape["tokens"] / mb * -(-shape["out"] // nb)) * 0.3e-6
            for mb in space["MB"] for nb in space["NB"]}))
    else:
        if "BLOCK" in has:
            for v in space["BLOCK"]:
                if v > max(256, _pow2_ceil(shape[spec.tile_dim])):
                    forbid[("BLOCK", v)] = "BLOCK larger than the padded dimension"
            groups.append(Group(("BLOCK",), footprint={(b,): spec.tile_bytes(shape, b, e) for b in space["BLOCK"]},
                                overhead={(b,): shape.get("rows", 1) * -(-shape.get(spec.tile_dim, 1) // b) * 40e-9
                                          for b in space["BLOCK"]}))
            for b in space["BLOCK"]:
                for vec in space.get("VEC", ()):
                    if vec and b % vec:
                        pairs[(("BLOCK", b), ("VEC", vec))] = "BLOCK not a multiple of the vector width"
        elif "CHUNK" in has:
            groups.append(Group(("CHUNK",), footprint={(ch,): spec.tile_bytes(shape, ch, e) for ch in space["CHUNK"]}))
        if "CHUNK" in has and "THREADS" in has:
            units = shape.get(spec.tile_dim, 1) if "BLOCK" not in has else shape.get("rows", 1)
            bound = {th: max(moved / bw(th), fl / (pcp * min(th, cores))) for th in ths}
            imb: dict[Combo, float] = {}
            for ch in space["CHUNK"]:
                chunks = -(-units // ch)
                for th in ths:
                    if th > 1 and chunks < th and ch > 1:
                        pairs[(("CHUNK", ch), ("THREADS", th))] = "fewer chunks than threads"
                    if th > 1:
                        imb[(ch, th)] = ((-(-chunks // th) * th) / max(chunks, 1) - 1.0) * bound[th]
            groups.append(Group(("CHUNK", "THREADS"), overhead=imb))
    if "VEC" in has and "UNROLL" in has:
        for vec in space["VEC"]:
            for un in space["UNROLL"]:
                if vec and un != 1:
                    pairs[(("VEC", vec), ("UNROLL", un))] = "UNROLL only applies to scalar loops"
    return TilingModel(space=space, levels=levels, groups=tuple(groups), overlap={1: 0.25}, launch_s=LAUNCH_S,
                       forbid=forbid, forbid_pairs=pairs)


def _restrict(model: TilingModel, fixed: Mapping[str, int] | None) -> TilingModel:
    if not fixed:
        return model
    space = {p: ((fixed[p],) if p in fixed else vals) for p, vals in model.space.items()}
    return TilingModel(space, model.levels, model.groups, model.overlap, model.buffers, model.launch_s,
                       model.forbid, model.forbid_pairs)


def plan(spec: KernelSpec, shape: Mapping[str, int], dtype: str, backend: Backend, facts: DeviceFacts, k: int = 5, fixed: Mapping[str, int] | None = None, capacity: float | None = None,
         solver: Solver = "highs", spread: float = 0.25) -> TilingPlan:
    """Build and solve the backend's MILP for one (kernel, shape, dtype); the parameters whose alternatives the
    model cannot separate from the optimum (within ``spread``) are the directions worth exploring first."""
    model = _restrict(backend.tiling_model(spec, shape, dtype, facts, capacity), fixed)
    sols = solve(model, k=k, solver=solver)
    if not sols:
        raise ValueError(f"no configuration of {spec.name} fits the memory levels with the alignment rules")
    ranked = []
    for s in sols:
        cfg = {p: v for p, v in s.items() if p != LEVEL}
        ranked.append(Candidate(cfg, stage_time(model, s), footprint(model, cfg), model.levels[s[LEVEL]][0]))
    best = ranked[0]
    sens: dict[str, float] = {}
    for p, vals in model.space.items():
        alts = [r[0] / best.predicted - 1.0 for v in vals if v != best.params[p]
                for r in [model_time(model, {**best.params, p: v})] if r is not None]
        if alts:
            sens[p] = min(alts)
    order = sorted(sens, key=lambda p: (sens[p] > spread, sens[p], p))
    dirs: list[str] = []
    for p in order:
        d = DIRECTION_OF.get(p, "tile")
        if d not in dirs:
            dirs.append(d)
    rejected: dict[str, int] = {}
    for why in [*model.forbid.values(), *model.forbid_pairs.values()]:
        rejected[why] = rejected.get(why, 0) + 1
    return TilingPlan(ranked, order, dirs, model.levels[-1][1], solver, classify(spec, shape, dtype, facts).regime,
                      rejected, model)


def predicted_times(model: TilingModel, configs: Sequence[Mapping[str, int]]) -> list[float | None]:
    """The model's seconds for each configuration (None where it is infeasible)."""
    out: list[float | None] = []
    for c in configs:
        r = model_time(model, c)
        out.append(r[0] if r else None)
    return out
