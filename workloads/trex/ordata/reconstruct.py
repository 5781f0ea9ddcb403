"""Reference reconstruction: from the IR, a written formulation and standalone gurobipy / highspy programs.

Two layouts. ``inline`` (every family, both libraries): the formulation and the program write the IR's
coefficients into each constraint. ``data`` (gurobipy, the families in :data:`DATA_LAYOUT_FAMILIES`): the
program restates the problem's data once, as positional lists (the entity names, then one list per data line
of the problem, in its order), then builds the family's model over list positions; the formulation is symbolic
(no numbers). The data layout is the copy-friendly one: a model writing it copies each number next to where
the prompt states it, and a repeated entity name cannot merge two entries.
Every program prints one protocol line ``TREX_RESULT {"status": ..., "objective": ..., "values": {...}}``
that the sandbox parses.
"""

from __future__ import annotations

import json
import keyword
from collections import defaultdict
from collections.abc import Callable

from trex.ordata.ir import Constraint, Instance, Param, Variable
from trex.ordata.render.numbers import fmt_num

PROTOCOL_PREFIX = "TREX_RESULT "


def _c(x: float) -> str:
    return fmt_num(float(x), 12)


def _ident(name: str) -> str:
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"variable name {name!r} is not a Python identifier")
    return name


def linear_text(coeffs: dict[str, float], times: str = " * ") -> str:
    """``3 * x + y - 2 * z`` (coefficients 1 and -1 written implicitly; empty -> 0)."""
    parts: list[str] = []
    for name, a in coeffs.items():
        if a == 0:
            continue
        mag = abs(a)
        term = name if mag == 1 else f"{_c(mag)}{times}{name}"
        if not parts:
            parts.append(term if a > 0 else f"-{term}")
        else:
            parts.append(("+ " if a > 0 else "- ") + term)
    return " ".join(parts) if parts else "0"


def _quad_text(quad: tuple[tuple[str, str, float], ...], times: str = " * ") -> str:
    parts: list[str] = []
    for u, w, q in quad:
        term = f"{_c(abs(q))}{times}{u}{times}{w}"
        parts.append(term if not parts and q > 0 else (f"-{term}" if not parts else ("+ " if q > 0 else "- ") + term))
    return " ".join(parts)


def _objective_text(inst: Instance, times: str = " * ") -> str:
    o = inst.objective
    pieces = []
    if o.linear:
        pieces.append(linear_text(o.linear, times))
    if o.quadratic:
        q = _quad_text(o.quadratic, times)
        pieces.append(q if not pieces else ("+ " + q if not q.startswith("-") else "- " + q[1:]))
    if o.constant:
        pieces.append(("+ " if o.constant > 0 else "- ") + _c(abs(o.constant)))
    return " ".join(pieces) if pieces else "0"


def _domain_text(v: Variable) -> str:
    kind = {"continuous": "continuous", "integer": "integer", "binary": "binary"}[v.vtype]
    if v.vtype == "binary":
        return f"{v.name} in {{0, 1}}"
    ub = f" <= {_c(v.ub)}" if v.ub is not None else ""
    return f"{_c(v.lb)} <= {v.name}{ub}, {kind}"


def formulation(inst: Instance) -> str:
    """Readable mathematical formulation: decision variables, objective, constraints grouped by kind."""
    lines = [f"Model: {inst.title} ({inst.family.replace('_', ' ')})", "", "Decision variables:"]
    for v in inst.variables:
        unit = f" [{v.unit}]" if v.unit else ""
        lines.append(f"  {_domain_text(v)}: {v.description}{unit}")
    sense = "minimize" if inst.objective.sense == "min" else "maximize"
    lines += ["", f"Objective ({inst.objective.description}):", f"  {sense} {_objective_text(inst, ' ')}", "",
              "Constraints:"]
    groups: dict[str, list[Constraint]] = defaultdict(list)
    for c in inst.constraints:
        groups[c.group or "constraints"].append(c)
    for g, cs in groups.items():
        lines.append(f"  {g.replace('_', ' ')}:")
        for c in cs:
            note = f"  ({c.description})" if c.description else ""
            lines.append(f"    {c.name}: {linear_text(c.coeffs, ' ')} {c.sense} {_c(c.rhs)}{note}")
    return "\n".join(lines)


_GUROBI_HEAD = ["import json", "", "import gurobipy as gp", "from gurobipy import GRB", ""]
_GUROBI_RESULT = [
    "m.optimize()",
    'names = {GRB.OPTIMAL: "optimal", GRB.INFEASIBLE: "infeasible", GRB.UNBOUNDED: "unbounded",',
    '         GRB.INF_OR_UNBD: "inf_or_unbd", GRB.TIME_LIMIT: "time_limit"}',
    'status = names.get(m.Status, "error")',
    'result = {"status": status, "objective": m.ObjVal if status == "optimal" else None,',
    '          "values": {v.VarName: v.X for v in m.getVars()} if status == "optimal" else {}}',
    f'print("{PROTOCOL_PREFIX}" + json.dumps(result))', ""]
"""Solve and print the TREX_RESULT line: the tail of every gurobipy program."""


def gurobipy_code(inst: Instance) -> str:
    """A standalone gurobipy program for ``inst`` printing the TREX_RESULT line."""
    vt = {"continuous": "GRB.CONTINUOUS", "integer": "GRB.INTEGER", "binary": "GRB.BINARY"}
    out = [f'"""{inst.title}: {inst.objective.description} ({inst.family.replace("_", " ")}), solved with gurobipy."""',
           *_GUROBI_HEAD, f'm = gp.Model("{inst.family}")', "m.Params.OutputFlag = 0", "", "# Decision variables"]
    for v in inst.variables:
        ub = "GRB.INFINITY" if v.ub is None else _c(v.ub)
        out.append(f'{_ident(v.name)} = m.addVar(lb={_c(v.lb)}, ub={ub}, vtype={vt[v.vtype]}, name="{v.name}")'
                   f"  # {v.description}")
    out += _constraint_lines(inst, "m")
    sense = "GRB.MINIMIZE" if inst.objective.sense == "min" else "GRB.MAXIMIZE"
    out += ["", f"# Objective: {inst.objective.description}", f"m.setObjective({_objective_text(inst)}, {sense})", "",
            *_GUROBI_RESULT]
    return "\n".join(out)


def _constraint_lines(inst: Instance, model: str) -> list[str]:
    """``<model>.addConstr(...)`` lines for every constraint, under one comment per constraint group."""
    groups: dict[str, list[Constraint]] = defaultdict(list)
    for c in inst.constraints:
        groups[c.group or "constraints"].append(c)
    out: list[str] = []
    for g, cs in groups.items():
        out += ["", f"# Constraints: {g.replace('_', ' ')}"]
        out += [f'{model}.addConstr({linear_text(c.coeffs)} {c.sense} {_c(c.rhs)}, name="{c.name}")' for c in cs]
    return out


def highspy_code(inst: Instance) -> str:
    """A standalone highspy program for ``inst`` printing the TREX_RESULT line."""
    out = [f'"""{inst.title}: {inst.objective.description} ({inst.family.replace("_", " ")}), solved with highspy."""',
           "import json", "", "import highspy", "", "h = highspy.Highs()", "h.silent()", "", "# Decision variables"]
    for v in inst.variables:
        ub = "highspy.kHighsInf" if v.ub is None else _c(v.ub)
        if v.vtype == "binary":
            call = f'h.addBinary(name="{v.name}")'
        elif v.vtype == "integer":
            call = f'h.addIntegral(lb={_c(v.lb)}, ub={ub}, name="{v.name}")'
        else:
            call = f'h.addVariable(lb={_c(v.lb)}, ub={ub}, name="{v.name}")'
        out.append(f"{_ident(v.name)} = {call}  # {v.description}")
    out += _constraint_lines(inst, "h")
    o = inst.objective
    lin = linear_text(o.linear) if o.linear else "0"
    if o.constant:
        lin = f"{lin} + {_c(o.constant)}" if o.linear else _c(o.constant)
    out += ["", f"# Objective: {o.description}"]
    if o.quadratic:
        out += ["# HiGHS minimises c'x + 0.5 x'Qx; Q is passed as its lower triangle, column by column.",
                "quad = {"]
        out += [f'    ("{u}", "{w}"): {_c(q)},' for u, w, q in o.quadratic]
        out += ["}",
                "col = {name: i for i, name in enumerate(h.getLp().col_names_)}",
                "entries = {}",
                "for (u, w), q in quad.items():",
                "    i, j = col[u], col[w]",
                "    key = (max(i, j), min(i, j))",
                "    entries[key] = entries.get(key, 0.0) + (2.0 * q if i == j else q)",
                "hess = highspy.HighsHessian()",
                "hess.dim_ = h.getNumCol()",
                "hess.format_ = highspy.HessianFormat.kTriangular",
                "start, index, value = [0], [], []",
                "for c in range(hess.dim_):",
                "    for (r, cc), q in sorted(entries.items()):",
                "        if cc == c:",
                "            index.append(r)",
                "            value.append(q)",
                "    start.append(len(index))",
                "hess.start_, hess.index_, hess.value_ = start, index, value",
                "h.passHessian(hess)"]
    call = "h.minimize" if o.sense == "min" else "h.maximize"
    out += [f"{call}({lin})" if o.linear or o.constant else f"{call}()", "",
            "model_status = h.getModelStatus()",
            "names = {highspy.HighsModelStatus.kOptimal: \"optimal\", highspy.HighsModelStatus.kInfeasible: "
            "\"infeasible\",",
            "         highspy.HighsModelStatus.kUnbounded: \"unbounded\", highspy.HighsModelStatus.kTimeLimit: "
            "\"time_limit\"}",
            'status = names.get(model_status, "error")',
            "lp = h.getLp()",
            "values = dict(zip(lp.col_names_, h.getSolution().col_value)) if status == \"optimal\" else {}",
            'result = {"status": status,',
            '          "objective": h.getInfo().objective_function_value if status == "optimal" else None,',
            '          "values": values}',
            f'print("{PROTOCOL_PREFIX}" + json.dumps(result))', ""]
    return "\n".join(out)


def reference_code(inst: Instance, library: str) -> str:
    """Program text for ``library`` ("gurobipy" or "highspy")."""
    if library == "gurobipy":
        return gurobipy_code(inst)
    if library == "highspy":
        return highspy_code(inst)
    raise ValueError(f"library must be 'gurobipy' or 'highspy', got {library!r}")


# --- the data layout ------------------------------------------------------------------------------------
def _data_value(p: Param) -> str:
    """``p`` as a Python literal: a scalar, a list in the problem's entity order, or a list of such rows."""
    v = p.value
    if not isinstance(v, list):
        return _c(v)
    if v and isinstance(v[0], list):
        return "[" + ", ".join("[" + ", ".join(_c(x) for x in row) + "]" for row in v) + "]"
    return "[" + ", ".join(_c(x) for x in v) + "]"  # type: ignore[arg-type]


def data_block(inst: Instance) -> list[str]:
    """The entity names of every set the parameters index (``items = ["Tent", ...]``), then one positional list
    per parameter, in the order the rendered problem states them: a number sits at its entity's position, so
    repeated or miswritten names cannot merge two entries."""
    used = [s for p in inst.params.values() if isinstance(p.value, list) for s in p.index]
    sets = [f"{_ident(s)} = [" + ", ".join(json.dumps(e) for e in inst.sets[s]) + "]" for s in dict.fromkeys(used)]
    return [*sets, *(f"{_ident(p.name)} = {_data_value(p)}" for p in inst.params.values())]


def _knapsack(inst: Instance) -> tuple[str, list[str]]:
    words = ["Decision variables:", "  take[i] in {0, 1} for each item i: 1 if item i is selected", "",
             f"Objective ({inst.objective.description}):", "  maximize sum over items i of value[i] * take[i]", "",
             "Constraints:", "  capacity: sum over items i of weight[i] * take[i] <= capacity"]
    code = ['take = [m.addVar(vtype=GRB.BINARY, name=f"take_{i}") for i in range(len(items))]',
            'm.addConstr(gp.quicksum(w * x for w, x in zip(weight, take, strict=True)) <= capacity, name="capacity")',
            "m.setObjective(gp.quicksum(v * x for v, x in zip(value, take, strict=True)), GRB.MAXIMIZE)"]
    return "\n".join(words), code


DATA_MODELS: dict[str, Callable[[Instance], tuple[str, list[str]]]] = {"knapsack": _knapsack}
"""Per family with a data layout: its symbolic formulation body and the gurobipy lines building its model over
the lists of :func:`data_block`."""
DATA_LAYOUT_FAMILIES: tuple[str, ...] = tuple(DATA_MODELS)


def data_layout(inst: Instance) -> tuple[str, str]:
    """(symbolic formulation, gurobipy program restating the data once) for a family with a data layout."""
    if inst.family not in DATA_MODELS:
        raise ValueError(f"family {inst.family!r} has no data layout; allowed: {', '.join(DATA_LAYOUT_FAMILIES)}")
    words, model = DATA_MODELS[inst.family](inst)
    form = f"Model: {inst.title} ({inst.family.replace('_', ' ')})\n\n{words}"
    code = [*_GUROBI_HEAD, "# Data, as stated in the problem", *data_block(inst), "",
            f'm = gp.Model("{inst.family}")', "m.Params.OutputFlag = 0", *model, "", *_GUROBI_RESULT]
    return form, "\n".join(code)


def reconstruction(inst: Instance, library: str, layout: str = "inline") -> tuple[str, str]:
    """(formulation, program) of ``inst`` in ``layout`` ("inline" or "data")."""
    if layout == "data":
        if library != "gurobipy":
            raise ValueError(f"the data layout is written for gurobipy, got {library!r}")
        return data_layout(inst)
    if layout != "inline":
        raise ValueError(f"layout must be 'inline' or 'data', got {layout!r}")
    return formulation(inst), reference_code(inst, library)
