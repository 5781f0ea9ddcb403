"""The output protocol parser, real solver programs reporting through it from inside the sandbox, and the
solves the sandbox records from the solvers themselves."""

from __future__ import annotations

import math
import textwrap

import pytest
from trex.sandbox import Limits, format_protocol, parse_protocol, run_python
from trex.verify.orgeval import solve_lp_text


def test_last_protocol_line_wins() -> None:
    out = (
        'noise\nTREX_RESULT {"status": "error", "objective": null}\nmore noise\n'
        'TREX_RESULT {"status": "optimal", "objective": 12, "values": {"x": 1.5}}\ntrailing\n'
    )
    rec = parse_protocol(out)
    assert rec == {"status": "optimal", "objective": 12.0, "values": {"x": 1.5}}
    assert isinstance(rec["objective"], float)


@pytest.mark.parametrize(
    "out",
    [
        "",
        "Optimal objective: 3.0\n",  # a common fallback, deliberately not accepted
        'TREX_RESULT {"status": "optimal", "objective": 1}\nTREX_RESULT {status: optimal}\n',  # last malformed
        "TREX_RESULT [1, 2]\n",
        'TREX_RESULT {"objective": 1.0}\n',  # no status
        'TREX_RESULT {"status": "optimal", "objective": "12"}\n',
        'TREX_RESULT {"status": "optimal", "objective": true}\n',
        'TREX_RESULT {"status": "optimal", "objective": 1, "values": [1]}\n',
        'TREX_RESULT {"status": "optimal", "objective": 1, "values": {"x": "a"}}\n',
        'TREX_RESULTS {"status": "optimal", "objective": 1}\n',
    ],
)
def test_malformed_or_missing_records_give_none(out: str) -> None:
    assert parse_protocol(out) is None


def test_format_round_trips_and_maps_nan_to_null() -> None:
    assert parse_protocol(format_protocol("optimal", 2.5, {"a": 1.0})) == {
        "status": "optimal", "objective": 2.5, "values": {"a": 1.0}}
    assert parse_protocol(format_protocol("infeasible", math.nan))["objective"] is None  # type: ignore[index]


# max 3x + 2y  s.t.  x + y <= 4,  x + 3y <= 6,  x <= 3,  x, y >= 0.
# Vertices: (0,0)=0, (3,0)=9, (3,1)=11, (0,2)=4; so the optimum is 11 at (3, 1).
LP_OPTIMUM = 11.0

GUROBI_LP = textwrap.dedent("""
    import json
    import gurobipy as gp
    from gurobipy import GRB
    m = gp.Model("tiny")
    m.Params.OutputFlag = 0
    x = m.addVar(name="x", ub=3)
    y = m.addVar(name="y")
    m.setObjective(3 * x + 2 * y, GRB.MAXIMIZE)
    m.addConstr(x + y <= 4)
    m.addConstr(x + 3 * y <= 6)
    m.optimize()
    status = "optimal" if m.Status == GRB.OPTIMAL else "error"
    print("TREX_RESULT " + json.dumps({"status": status, "objective": m.ObjVal, "values": {"x": x.X, "y": y.X}}))
""")

HIGHS_LP = textwrap.dedent("""
    import json
    import highspy
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    inf = highspy.kHighsInf
    h.addVar(0, 3)
    h.addVar(0, inf)
    h.changeColCost(0, 3)
    h.changeColCost(1, 2)
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    h.addRow(-inf, 4, 2, [0, 1], [1, 1])
    h.addRow(-inf, 6, 2, [0, 1], [1, 3])
    h.run()
    ok = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    sol = h.getSolution().col_value
    print("TREX_RESULT " + json.dumps({"status": "optimal" if ok else "error",
                                       "objective": h.getInfo().objective_function_value,
                                       "values": {"x": sol[0], "y": sol[1]}}))
""")


@pytest.mark.parametrize("program", [GUROBI_LP, HIGHS_LP], ids=["gurobipy", "highspy"])
def test_solver_program_reports_objective_through_protocol(program: str) -> None:
    res = run_python(program, limits=Limits(timeout_s=60.0))
    assert res.ok, res.stderr
    assert res.status == "optimal"
    assert res.objective == pytest.approx(LP_OPTIMUM, abs=1e-6)
    assert res.result is not None
    assert res.result["values"]["x"] == pytest.approx(3.0, abs=1e-6)
    assert res.result["values"]["y"] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("program", [GUROBI_LP, HIGHS_LP], ids=["gurobipy", "highspy"])
def test_the_solver_call_is_recorded_with_its_model(program: str) -> None:
    lying = program.replace('"objective": ', '"objective": 99.0 or ', 1)  # the printed line lies
    res = run_python(lying, limits=Limits(timeout_s=60.0))
    assert res.ok, res.stderr
    assert res.result is not None and res.result["objective"] == 99.0
    assert len(res.solves) == 1
    rec = res.solves[0]
    assert rec["api"] == ("gurobipy" if "gurobipy" in program else "highspy")
    assert (rec["status"], rec["num_vars"], rec["num_constrs"]) == ("optimal", 2, 2)
    assert res.objective == pytest.approx(LP_OPTIMUM, abs=1e-6)  # the recorded solve, not the print
    assert rec["lp"] and not rec["lp_truncated"]
    # Independent check: the recorded LP text, read and solved outside, is the program's model.
    assert solve_lp_text(rec["lp"]) == ("optimal", pytest.approx(LP_OPTIMUM, abs=1e-6))


def test_model_text_over_the_cap_is_dropped_not_cut() -> None:
    big = GUROBI_LP.replace('m.optimize()', 'm.addVars(200, name="padding_variable_with_a_long_name")\nm.optimize()')
    res = run_python(big, limits=Limits(timeout_s=60.0, max_model_kb=1))
    assert res.ok, res.stderr
    assert res.solve is not None and res.solve["lp"] is None and res.solve["lp_truncated"]
    assert res.objective == pytest.approx(LP_OPTIMUM, abs=1e-6)
