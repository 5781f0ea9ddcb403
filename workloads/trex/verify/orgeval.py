"""ORGEval: structural equivalence of two instantiated models by Weisfeiler-Lehman colour refinement.

Each LP file becomes a weighted bipartite graph: one node per variable (type, lower bound, upper
bound, objective coefficient), one node per constraint (sense, right-hand side), one edge per
nonzero coefficient (weight = coefficient); quadratic objective terms add variable-variable edges
(weight "q" + coefficient, a self-loop for squares); the objective constant and the counts of other
nonlinear parts (quadratic constraints, SOS, general constraints) are graph-level labels. Two models are *equivalent* when colour refinement cannot tell their
graphs apart: same colour histogram after every round, refined until the partition is stable.
This is ORGEval's criterion (arXiv 2510.27610); like every WL test it is exact for "different" and
a (very rarely fooled) certificate for "same".

Canonical form, decided here and reported with every run (all exact rewrites, no heuristics):

* names and order of variables and constraints are ignored (the graph has no order);
* a maximisation becomes a minimisation of the negated objective;
* a ``>=`` row becomes ``<=`` with coefficients and right-hand side negated;
* binary variables are integer variables with bounds [0, 1];
* numbers are compared at 9 significant digits (LP files print 10 to 17), infinite bounds as inf.

Not equivalent by design: a constraint multiplied by a constant (it changes the formulation's row
scaling, duals and the graph's weights), a bound written as a constraint row (or vice versa),
split or merged constraints, and any change of a coefficient, sense, bound or variable type.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

ORGEVAL_VERSION = "1"
INF = 1e30  # solvers' "infinite" bounds (Gurobi 1e100, HiGHS inf) are all beyond this


@dataclass(frozen=True)
class Variable:
    """One column."""

    name: str
    vtype: str  # "C" continuous, "I" integer, "B" binary, "S"/"N" semi-continuous/-integer
    lb: float
    ub: float
    obj: float


@dataclass(frozen=True)
class Constraint:
    """One linear row: ``sum coeffs[j] * x_j  sense  rhs``."""

    name: str
    sense: str  # "<", ">", "="
    rhs: float
    coeffs: tuple[tuple[int, float], ...]


@dataclass
class LinearModel:
    """A model read from an LP file: linear part, quadratic objective terms, counts of other nonlinear parts."""

    sense: str  # "min" | "max"
    obj_constant: float
    variables: list[Variable]
    constraints: list[Constraint]
    extras: dict[str, int] = field(default_factory=dict)
    quad_obj: tuple[tuple[int, int, float], ...] = ()
    """Quadratic objective terms ``coef * x_i * x_j`` (i <= j), as the objective states them."""


@contextmanager
def _lp_file(text: str) -> Iterator[str]:
    fd, path = tempfile.mkstemp(suffix=".lp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        yield path
    finally:
        os.unlink(path)


def _gurobi_env() -> Any:
    import gurobipy as gp

    env = gp.Env(empty=True)
    env.setParam("OutputFlag", 0)
    env.start()
    return env


def _read_gurobi(text: str) -> LinearModel:
    import gurobipy as gp

    env = _gurobi_env()
    try:
        with _lp_file(text) as path:
            m = gp.read(path, env=env)
        m.update()
        variables = [Variable(v.VarName, v.VType, v.LB, v.UB, v.Obj) for v in m.getVars()]
        index = {v.VarName: i for i, v in enumerate(m.getVars())}
        constraints = []
        for c in m.getConstrs():
            row = m.getRow(c)
            coeffs = tuple((index[row.getVar(k).VarName], row.getCoeff(k)) for k in range(row.size()))
            constraints.append(Constraint(c.ConstrName, c.Sense, c.RHS, coeffs))
        extras = {"quadratic_constraints": m.NumQConstrs, "sos": m.NumSOS, "general_constraints": m.NumGenConstrs}
        quad: list[tuple[int, int, float]] = []
        obj = m.getObjective()
        if isinstance(obj, gp.QuadExpr):
            for k in range(obj.size()):
                i, j = index[obj.getVar1(k).VarName], index[obj.getVar2(k).VarName]
                quad.append((min(i, j), max(i, j), obj.getCoeff(k)))
        sense = "max" if m.ModelSense == -1 else "min"
        model = LinearModel(sense, float(m.ObjCon), variables, constraints, extras, tuple(quad))
        m.dispose()
        return model
    finally:
        env.dispose()


_BRACKET = re.compile(r"\[([^\]\s]*)\]")


def lp_legal_names(text: str) -> str:
    """Gurobi-style bracketed names (``x[0,1]``) -> ``x_0_1`` so HiGHS's LP reader accepts them."""
    return _BRACKET.sub(lambda m: "_" + m.group(1).replace(",", "_"), text)


def _read_highs(text: str) -> LinearModel:
    import highspy

    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    with _lp_file(lp_legal_names(text)) as path:
        st = h.readModel(path)
    if st == highspy.HighsStatus.kError:
        raise ValueError("HiGHS could not read the LP file")
    lp = h.getLp()
    n, m = lp.num_col_, lp.num_row_
    names = list(lp.col_names_) or [f"c{j}" for j in range(n)]
    rnames = list(lp.row_names_) or [f"r{i}" for i in range(m)]
    integrality = list(lp.integrality_) if len(lp.integrality_) else [highspy.HighsVarType.kContinuous] * n
    variables = []
    for j in range(n):
        kind = "I" if integrality[j] == highspy.HighsVarType.kInteger else "C"
        lb, ub = lp.col_lower_[j], lp.col_upper_[j]
        if kind == "I" and lb == 0 and ub == 1:
            kind = "B"
        variables.append(Variable(names[j], kind, lb, ub, lp.col_cost_[j]))
    rows: list[list[tuple[int, float]]] = [[] for _ in range(m)]
    a = lp.a_matrix_
    start, index, value = list(a.start_), list(a.index_), list(a.value_)
    colwise = a.format_ == highspy.MatrixFormat.kColwise
    for outer in range(len(start) - 1):
        for k in range(start[outer], start[outer + 1]):
            if colwise:
                rows[index[k]].append((outer, value[k]))
            else:
                rows[outer].append((index[k], value[k]))
    constraints = []
    extras = {"ranged_rows": 0}
    for i in range(m):
        lo, up = lp.row_lower_[i], lp.row_upper_[i]
        if lo == up:
            constraints.append(Constraint(rnames[i], "=", up, tuple(rows[i])))
        elif lo <= -INF:
            constraints.append(Constraint(rnames[i], "<", up, tuple(rows[i])))
        elif up >= INF:
            constraints.append(Constraint(rnames[i], ">", lo, tuple(rows[i])))
        else:
            extras["ranged_rows"] += 1
            constraints.append(Constraint(rnames[i] + "_lo", ">", lo, tuple(rows[i])))
            constraints.append(Constraint(rnames[i] + "_up", "<", up, tuple(rows[i])))
    sense = "max" if lp.sense_ == highspy.ObjSense.kMaximize else "min"
    offset = float(lp.offset_)
    # HiGHS: objective c'x + 1/2 x'Qx with Q's lower triangle stored column-wise.
    quad: list[tuple[int, int, float]] = []
    hess = h.getModel().hessian_
    if hess.dim_ > 0:
        hstart, hindex, hvalue = list(hess.start_), list(hess.index_), list(hess.value_)
        for col in range(hess.dim_):
            for k in range(hstart[col], hstart[col + 1]):
                row = hindex[k]
                quad.append((min(row, col), max(row, col), hvalue[k] / 2 if row == col else hvalue[k]))
    # Gurobi writes an objective constant as a column "Constant" fixed to 1 in no row; fold it back.
    used = {j for c in constraints for j, _ in c.coeffs}
    keep = [j for j, v in enumerate(variables)
            if not (v.name == "Constant" and v.lb == v.ub == 1.0 and j not in used)]
    if len(keep) < len(variables):
        offset += sum(variables[j].obj for j in range(len(variables)) if j not in keep)
        remap = {old: new for new, old in enumerate(keep)}
        variables = [variables[j] for j in keep]
        constraints = [Constraint(c.name, c.sense, c.rhs, tuple((remap[j], a) for j, a in c.coeffs))
                       for c in constraints]
        quad = [(remap[i], remap[j], q) for i, j, q in quad if i in remap and j in remap]
    return LinearModel(sense, offset, variables, constraints, extras, tuple(quad))


def read_lp_text(text: str) -> LinearModel:
    """Parse LP-format text with gurobipy (its native writer's format), falling back to HiGHS."""
    try:
        return _read_gurobi(text)
    except ImportError:
        return _read_highs(text)
    except Exception as gurobi_error:  # licence or reader failure: the unrestricted solver decides
        try:
            return _read_highs(text)
        except Exception as highs_error:
            raise ValueError(f"cannot read LP file: gurobipy: {gurobi_error}; HiGHS: {highs_error}") from highs_error


def solve_lp_text(text: str, time_limit_s: float = 60.0) -> tuple[str, float | None]:
    """Solve an LP-format model: (status, objective) with status optimal / infeasible / unbounded /
    infeasible_or_unbounded / other; gurobipy first, HiGHS when gurobipy is missing or refuses."""
    try:
        import gurobipy as gp

        env = _gurobi_env()
        try:
            with _lp_file(text) as path:
                m = gp.read(path, env=env)
            m.setParam("TimeLimit", time_limit_s)
            m.optimize()
            codes = {gp.GRB.OPTIMAL: "optimal", gp.GRB.INFEASIBLE: "infeasible", gp.GRB.UNBOUNDED: "unbounded",
                     gp.GRB.INF_OR_UNBD: "infeasible_or_unbounded"}
            status = codes.get(m.Status, f"gurobi_status_{m.Status}")
            value = float(m.ObjVal) if status == "optimal" else None
            m.dispose()
            return status, value
        finally:
            env.dispose()
    except Exception as gurobi_error:
        if not isinstance(gurobi_error, ImportError) and "size-limited" not in str(gurobi_error).lower() \
                and "license" not in str(gurobi_error).lower():
            raise
    import highspy

    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", time_limit_s)
    with _lp_file(lp_legal_names(text)) as path:
        if h.readModel(path) == highspy.HighsStatus.kError:
            raise ValueError("HiGHS could not read the LP file")
    h.run()
    ms = h.getModelStatus()
    hmap = {highspy.HighsModelStatus.kOptimal: "optimal", highspy.HighsModelStatus.kInfeasible: "infeasible",
            highspy.HighsModelStatus.kUnbounded: "unbounded",
            highspy.HighsModelStatus.kUnboundedOrInfeasible: "infeasible_or_unbounded"}
    status = hmap.get(ms, f"highs_{h.modelStatusToString(ms)}")
    return status, (float(h.getInfo().objective_function_value) if status == "optimal" else None)


_NO_ANSWER = frozenset({"infeasible", "unbounded", "infeasible_or_unbounded"})


def verify_recorded_solve(record: dict[str, Any], time_limit_s: float = 60.0) -> tuple[bool, str]:
    """Re-solve a sandbox-recorded model and check that it backs the recorded answer: (ok, reason).

    The records channel is written from inside the untrusted process, so a record is believed only
    as far as its own model supports it: an optimum must be the re-solved optimum (relative 1e-4,
    the default MIP gap), an infeasible/unbounded verdict must be re-solved as one of those.
    """
    status = str(record.get("status"))
    if status != "optimal" and status not in _NO_ANSWER:
        return True, f"status {status} is no answer"
    lp = record.get("lp")
    if not lp:
        return False, "the recorded solve carries no model text (over the recording cap)"
    try:
        status2, value2 = solve_lp_text(str(lp), time_limit_s)
    except Exception as exc:  # an unreadable or unsolvable model backs nothing
        return False, f"recorded model could not be re-solved: {str(exc)[:200]}"
    if status in _NO_ANSWER:
        return (status2 in _NO_ANSWER, f"re-solved as {status2}")
    obj = record.get("objective")
    if status2 != "optimal" or value2 is None or not isinstance(obj, int | float):
        return False, f"recorded optimal {obj!r}, re-solved as {status2}"
    if abs(float(obj) - value2) > 1e-4 * (abs(value2) + 1.0):
        return False, f"recorded objective {obj!r} but its model's optimum is {value2!r}"
    return True, "re-solved optimum agrees"


# --- canonical bipartite graph -------------------------------------------------------------------

def num(x: float) -> str:
    """Canonical text of a number: 9 significant digits, signed zero folded, |x| >= 1e30 as inf."""
    if math.isnan(x):
        return "nan"
    if x >= INF:
        return "inf"
    if x <= -INF:
        return "-inf"
    s = f"{x:.9g}"
    return "0" if s in ("-0", "0") else s


@dataclass
class Graph:
    """Node labels (variables first, then constraints), weighted edges and graph-level labels."""

    labels: list[str]
    edges: list[tuple[int, int, str]]
    graph_label: str


def canonical_graph(model: LinearModel) -> Graph:
    """The weighted bipartite variable-constraint graph of ``model`` in canonical form."""
    flip = -1.0 if model.sense == "max" else 1.0
    labels: list[str] = []
    for v in model.variables:
        vtype, lb, ub = v.vtype, v.lb, v.ub
        if vtype == "B":
            vtype, lb, ub = "I", max(lb, 0.0), min(ub, 1.0)
        labels.append(f"v|{vtype}|{num(lb)}|{num(ub)}|{num(flip * v.obj)}")
    nv = len(model.variables)
    edges: list[tuple[int, int, str]] = []
    for i, c in enumerate(model.constraints):
        s = -1.0 if c.sense == ">" else 1.0
        sense = "=" if c.sense == "=" else "<"
        labels.append(f"c|{sense}|{num(s * c.rhs)}")
        merged: dict[int, float] = {}
        for j, a in c.coeffs:
            merged[j] = merged.get(j, 0.0) + a
        edges += [(j, nv + i, num(s * a)) for j, a in sorted(merged.items()) if a != 0.0]
    merged_q: dict[tuple[int, int], float] = {}
    for i, j, q in model.quad_obj:
        key = (min(i, j), max(i, j))
        merged_q[key] = merged_q.get(key, 0.0) + q
    edges += [(i, j, "q" + num(flip * q)) for (i, j), q in sorted(merged_q.items()) if q != 0.0]
    extras = ",".join(f"{k}={v}" for k, v in sorted(model.extras.items()) if v)
    return Graph(labels, edges, f"obj_const={num(flip * model.obj_constant)};{extras}")


def _h(s: str) -> str:
    return hashlib.blake2b(s.encode(), digest_size=12).hexdigest()


def wl_rounds(g: Graph, max_rounds: int | None = None) -> list[Counter[str]]:
    """Colour histograms of each refinement round: ``max_rounds`` rounds, or until the partition is stable."""
    adj: list[list[tuple[str, int]]] = [[] for _ in g.labels]
    for a, b, w in g.edges:
        adj[a].append((w, b))
        adj[b].append((w, a))
    colours = [_h(lbl) for lbl in g.labels]
    hist = [Counter(colours)]
    limit = max_rounds if max_rounds is not None else len(g.labels) + 1
    for _ in range(limit):
        new = [_h(colours[n] + "|" + ",".join(sorted(f"{w}:{colours[m]}" for w, m in adj[n])))
               for n in range(len(colours))]
        stable = len(set(new)) == len(set(colours))
        colours = new
        hist.append(Counter(colours))
        if stable and max_rounds is None:
            break
    return hist


@dataclass(frozen=True)
class Equivalence:
    """Verdict of :func:`equivalent` with the first difference found."""

    equivalent: bool
    reason: str
    rounds: int = 0


def equivalent_models(a: LinearModel, b: LinearModel) -> Equivalence:
    """WL-equivalence of two models' canonical graphs."""
    if len(a.variables) != len(b.variables):
        return Equivalence(False, f"variables: {len(a.variables)} vs {len(b.variables)}")
    if len(a.constraints) != len(b.constraints):
        return Equivalence(False, f"constraints: {len(a.constraints)} vs {len(b.constraints)}")
    ga, gb = canonical_graph(a), canonical_graph(b)
    if ga.graph_label != gb.graph_label:
        return Equivalence(False, f"graph labels differ: {ga.graph_label} vs {gb.graph_label}")
    if len(ga.edges) != len(gb.edges):
        return Equivalence(False, f"nonzeros: {len(ga.edges)} vs {len(gb.edges)}")
    # Refine both graphs the same number of rounds: the larger count of rounds either needs.
    ha, hb = wl_rounds(ga), wl_rounds(gb)
    rounds = max(len(ha), len(hb))
    ha, hb = wl_rounds(ga, rounds), wl_rounds(gb, rounds)
    for r, (x, y) in enumerate(zip(ha, hb, strict=False)):
        if x != y:
            what = "node labels (types, bounds, objective, senses or right-hand sides)" if r == 0 else \
                f"structure (coefficients or incidence) at refinement round {r}"
            return Equivalence(False, f"differ in {what}", r)
    return Equivalence(True, "WL-equivalent", rounds)


def structural_check(solve: dict[str, Any] | None, reference: LinearModel) -> tuple[str | None, str]:
    """Whether a recorded solve's model (its ``lp``) is ``reference`` (WL-equivalence): (None, why it is), or
    (``no_model`` or ``mismatch``, why not). ORData's structural gate and GRPO's reward both decide with it."""
    lp = None if solve is None else solve.get("lp")
    if not lp:
        truncated = bool(solve and solve.get("lp_truncated"))
        return "no_model", "model larger than the recording cap" if truncated else "no LP text"
    try:
        candidate = read_lp_text(lp)
    except ValueError as exc:
        return "mismatch", f"recorded LP unreadable: {str(exc)[:200]}"
    eq = equivalent_models(candidate, reference)
    return (None, eq.reason) if eq.equivalent else ("mismatch", eq.reason)


def equivalent_lp(candidate_lp: str, reference_lp: str) -> Equivalence:
    """Read two LP texts and decide equivalence; an unreadable candidate is not equivalent."""
    ref = read_lp_text(reference_lp)
    try:
        cand = read_lp_text(candidate_lp)
    except ValueError as e:
        return Equivalence(False, f"candidate LP unreadable: {e}")
    return equivalent_models(cand, ref)


def to_networkx(model: LinearModel) -> Any:
    """The canonical graph as a networkx Graph (node attr ``label``, edge attr ``w``)."""
    import networkx as nx

    g = canonical_graph(model)
    out = nx.Graph(label=g.graph_label)
    for i, lbl in enumerate(g.labels):
        out.add_node(i, label=lbl)
    for a, b, w in g.edges:
        out.add_edge(a, b, w=w)
    return out
