"""ORData gates: correct knapsack code passes, each kind of wrong code is rejected with the right reason.

The execution, structural and objective gates read the solve the sandbox recorded from gurobipy/highspy,
never the printed TREX_RESULT line.
"""

from __future__ import annotations

import itertools
import textwrap

import pytest
from trex.ordata import gates
from trex.ordata.gates import (
    REASONS,
    Cleaner,
    GateResult,
    ast_gate,
    execution_gate,
    instance_model,
    objective_gate,
    review_gate,
    structural_gate,
)
from trex.ordata.ir import Constraint, Instance, Objective, Variable
from trex.sandbox import Limits, SandboxResult, run_python

VALUES = [10, 13, 7, 8]
WEIGHTS = [3, 4, 2, 3]
CAPACITY = 7
TOL = 1e-6


def brute_force_knapsack() -> float:
    """Independent reference: enumerate all 2^n subsets."""
    best = 0
    for pick in itertools.product((0, 1), repeat=len(VALUES)):
        if sum(w * p for w, p in zip(WEIGHTS, pick, strict=True)) <= CAPACITY:
            best = max(best, sum(v * p for v, p in zip(VALUES, pick, strict=True)))
    return float(best)


def knapsack_instance() -> Instance:
    """The knapsack as trex IR (the generator's side), with a redundant cardinality row x0+..+x3 <= 4."""
    xs = tuple(Variable(f"x{i}", "binary", 0.0, 1.0) for i in range(len(VALUES)))
    rows = (Constraint("cap", {f"x{i}": float(w) for i, w in enumerate(WEIGHTS)}, "<=", float(CAPACITY)),
            Constraint("card", {f"x{i}": 1.0 for i in range(len(VALUES))}, "<=", float(len(VALUES))))
    return Instance("knapsack", "test", "knapsack", 0, {}, {}, xs, rows,
                    Objective("max", {f"x{i}": float(v) for i, v in enumerate(VALUES)}))


def knapsack_program(*, sense: str = "GRB.MAXIMIZE", capacity: bool = True, vtype: str = "GRB.BINARY",
                     extra_import: str = "", report: bool = True, weights: list[int] | None = None,
                     cardinality: bool = True, vtype3: str | None = None) -> str:
    cons = f"m.addConstr(gp.quicksum(w[i] * x[i] for i in range(n)) <= {CAPACITY})" if capacity else ""
    card = "m.addConstr(gp.quicksum(x) <= n)" if cardinality else ""
    relax = f"x[3].VType = {vtype3}" if vtype3 else ""
    out = ('print("TREX_RESULT " + json.dumps({"status": "optimal" if m.Status == GRB.OPTIMAL else "error", '
           '"objective": m.ObjVal, "values": {f"x{i}": x[i].X for i in range(n)}}))') if report else "print(m.ObjVal)"
    return textwrap.dedent(f"""
        import json
        {extra_import}
        import gurobipy as gp
        from gurobipy import GRB

        v = {VALUES}
        w = {weights or WEIGHTS}
        n = len(v)
        m = gp.Model("knapsack")
        m.Params.OutputFlag = 0
        x = [m.addVar(vtype={vtype}, ub=1, name=f"x{{i}}") for i in range(n)]
        {relax}
        m.setObjective(gp.quicksum(v[i] * x[i] for i in range(n)), {sense})
        {cons}
        {card}
        m.optimize()
        {out}
    """).lstrip()


def full_gate(code: str, reference: float, *, structure: bool = True) -> GateResult:
    """The pipeline's order: clean -> AST -> sandbox -> execution -> structure -> objective."""
    code = Cleaner().clean_code(code)
    g = ast_gate(code)
    if not g.accepted:
        return g
    run = run_python(code, limits=Limits(timeout_s=60.0))
    g = execution_gate(run)
    if g.accepted and structure:
        g = structural_gate(run.solve, instance_model(knapsack_instance()))
    if not g.accepted:
        return g
    return objective_gate(run.objective, reference, TOL)


def test_reference_is_what_we_think() -> None:
    assert brute_force_knapsack() == 23.0  # items 0 and 1; the LP relaxation would give 23.5


def test_correct_code_is_accepted() -> None:
    fenced = "Here is the model:\n```python\n" + knapsack_program() + "```\nDone."
    g = full_gate(fenced, brute_force_knapsack())
    assert g.accepted, g
    assert g.outcome == "accepted"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sense": "GRB.MINIMIZE"},  # wrong objective sense -> 0
        {"capacity": False},  # missing constraint -> take everything
        {"vtype": "GRB.CONTINUOUS"},  # relaxed integrality -> LP bound 23.5
    ],
    ids=["wrong_sense", "missing_constraint", "relaxed_integrality"],
)
def test_wrong_models_fail_objective_agreement(kwargs: dict[str, object]) -> None:
    g = full_gate(knapsack_program(**kwargs), brute_force_knapsack(), structure=False)  # type: ignore[arg-type]
    assert not g.accepted
    assert g.reason == "objective.mismatch", g
    g = full_gate(knapsack_program(**kwargs), brute_force_knapsack())  # type: ignore[arg-type]
    assert g.reason == "structure.mismatch", g


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cardinality": False},  # dropped (redundant) constraint
        {"vtype3": "GRB.CONTINUOUS"},  # relaxed integrality of x3 (the optimum stays integral)
        {"weights": [3, 4, 2, 4]},  # wrong coefficient of x3 (x3 is not picked either way)
    ],
    ids=["dropped_constraint", "relaxed_integrality", "wrong_coefficient"],
)
def test_structural_gate_rejects_wrong_models_with_the_right_objective(kwargs: dict[str, object]) -> None:
    code = knapsack_program(**kwargs)  # type: ignore[arg-type]
    assert full_gate(code, brute_force_knapsack(), structure=False).accepted  # objective agreement alone passes
    g = full_gate(code, brute_force_knapsack())
    assert (g.accepted, g.reason) == (False, "structure.mismatch"), g


def test_structural_gate_accepts_the_instance_and_needs_a_model() -> None:
    assert full_gate(knapsack_program(), brute_force_knapsack()).accepted
    assert structural_gate(None, instance_model(knapsack_instance())).reason == "structure.no_model"
    truncated = {"lp": None, "lp_truncated": True}
    assert "cap" in structural_gate(truncated, instance_model(knapsack_instance())).detail


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import json, highspy\nh = highspy.Highs()\nh.run()\n"
         "print('TREX_RESULT ' + json.dumps({'status': 'optimal', 'objective': 23.0}))\n", "exec.solver_status"),
        ("import json, gurobipy as gp\nm = gp.Model()\nm.Params.OutputFlag = 0\nm.optimize()\n"
         "print('TREX_RESULT ' + json.dumps({'status': 'optimal', 'objective': 23.0}))\n", "structure.mismatch"),
    ],
    ids=["highspy_empty", "gurobipy_empty"],
)
def test_empty_model_with_a_printed_constant_is_rejected(code: str, reason: str) -> None:
    g = full_gate(code, brute_force_knapsack())
    assert (g.accepted, g.reason) == (False, reason), g


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (knapsack_program(extra_import="import os"), "ast.forbidden_import"),
        (knapsack_program(extra_import="from subprocess import run"), "ast.forbidden_import"),
        (knapsack_program(extra_import="import urllib.request"), "ast.forbidden_import"),
        (knapsack_program(report=False), "ast.no_protocol_output"),
        (knapsack_program().replace("m.optimize()", "pass"), "ast.no_solver_call"),
        (knapsack_program().replace("n = len(v)", "n = len(v"), "ast.syntax_error"),
        (knapsack_program() + "open('/etc/passwd').read()\n", "ast.forbidden_call"),
        (knapsack_program() + "eval('1 + 1')\n", "ast.forbidden_call"),
        (knapsack_program() + "__import__('os').system('true')\n", "ast.forbidden_call"),
        (knapsack_program() + "m.write('model.lp')\n", "ast.forbidden_call"),
        (knapsack_program() + "().__class__.__bases__[0].__subclasses__()\n", "ast.forbidden_attribute"),
    ],
    ids=["os", "subprocess", "urllib", "no_protocol", "no_solver", "syntax", "open", "eval", "dunder_import",
         "file_write", "introspection"],
)
def test_ast_gate_rejections(code: str, reason: str) -> None:
    g = ast_gate(code)
    assert (g.accepted, g.reason) == (False, reason), g


def test_ast_gate_accepts_highspy_program() -> None:
    code = textwrap.dedent("""
        import json
        import highspy
        h = highspy.Highs()
        h.silent()
        x = h.addVariable(lb=0, ub=3)
        h.maximize(2 * x)
        print("TREX_RESULT " + json.dumps({"status": "optimal", "objective": h.getInfo().objective_function_value}))
    """)
    assert ast_gate(code).accepted


def _solve(status: str, objective: float | None) -> dict[str, object]:
    return {"api": "gurobipy", "status": status, "objective": objective, "num_vars": 1, "num_constrs": 0,
            "lp": None, "lp_truncated": False}


def _result(**kw: object) -> SandboxResult:
    base: dict[str, object] = dict(stdout="", stderr="", exit_code=0, signal=None, timed_out=False, wall_s=0.1,
                                   killed_reason=None, result=None)
    base.update(kw)
    return SandboxResult(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("res", "reason"),
    [
        (_result(exit_code=None, signal=9, timed_out=True, killed_reason="timeout"), "exec.timeout"),
        (_result(exit_code=None, signal=24, killed_reason="cpu_limit"), "exec.timeout"),
        (_result(exit_code=1, killed_reason="memory_limit", stderr="MemoryError"), "exec.resource_limit"),
        (_result(exit_code=1, stderr="Traceback ...\nZeroDivisionError: division by zero"), "exec.runtime_error"),
        (_result(stdout="objective 3"), "exec.no_solver_call"),
        (_result(result={"status": "optimal", "objective": 23.0, "values": {}}), "exec.no_solver_call"),
        (_result(solves=[_solve("infeasible", None)]), "exec.solver_status"),
        (_result(solves=[_solve("optimal", None)]), "exec.no_result"),
        (_result(exit_code=1, killed_reason="disk_limit"), "exec.resource_limit"),
    ],
    ids=["timeout", "cpu", "memory", "runtime", "no_result", "printed_only", "status", "no_objective", "disk"],
)
def test_execution_gate_reasons(res: SandboxResult, reason: str) -> None:
    g = execution_gate(res)
    assert (g.accepted, g.reason) == (False, reason)


def test_execution_gate_on_real_runs() -> None:
    infeasible = knapsack_program().replace("m.optimize()", "m.addConstr(x[0] >= 2)\nm.optimize()")
    infeasible = infeasible.replace('"objective": m.ObjVal', '"objective": None').replace(
        '{f"x{i}": x[i].X for i in range(n)}', "{}")
    g = execution_gate(run_python(infeasible, limits=Limits(timeout_s=60.0)))
    assert g.reason == "exec.solver_status"
    g = execution_gate(run_python("import gurobipy\nraise RuntimeError('bad model')\n"))
    assert g.reason == "exec.runtime_error" and "bad model" in g.detail


def test_objective_gate_tolerance_is_relative_plus_one() -> None:
    assert objective_gate(100.0 + 50e-6, 100.0, 1e-6).accepted  # 50e-6 / 101 < 1e-6
    assert objective_gate(100.0 + 200e-6, 100.0, 1e-6).reason == "objective.mismatch"
    assert objective_gate(1e-7, 0.0, 1e-6).accepted  # |b| + 1 keeps zero references sane
    assert objective_gate(float("nan"), 1.0, 1e-6).reason == "objective.mismatch"
    assert objective_gate(None, 1.0, 1e-6).reason == "objective.missing"
    with pytest.raises(ValueError, match="tol"):
        objective_gate(1.0, 1.0, 0.0)


def test_cleaner_code_and_text() -> None:
    c = Cleaner()
    raw = "Text\r\n```python\r\n    x = 1\r\n    print(x)   \r\n```\r\nmore\n```py\n    y = 2\n```\n"
    assert c.clean_code(raw) == "y = 2\n"  # last python block wins, dedented
    assert c.clean_code("\n\n    a = 1\n    b = 2\n") == "a = 1\nb = 2\n"
    text = "The \ufb01rm\u00a0makes  \u201cwidgets\u201d\u200b\r\n\r\n\r\n\r\nEach costs 5\u20137 dollars.  "
    assert c.clean_text(text) == 'The firm makes "widgets"\n\nEach costs 5-7 dollars.\n'


PROBLEM = ("A bakery makes bread and cake. Bread earns 3 dollars and cake 2.5 dollars per unit. "
           "Flour is limited to 1,200 grams; bread needs 100 grams and cake 80 grams. Maximize profit.")
FORMULATION = "Decision variables: b, c >= 0\nObjective: maximize 3 b + 2.5 c\nConstraints: 100 b + 80 c <= 1200"


def test_review_gate() -> None:
    nums = [3, 2.5, 1200, 100, 80]
    assert review_gate(PROBLEM, FORMULATION, nums).accepted
    assert review_gate(PROBLEM, FORMULATION, [*nums, 42]).reason == "review.missing_number"
    assert review_gate(PROBLEM, FORMULATION, [2.55]).reason == "review.missing_number"
    assert review_gate(PROBLEM.replace("1,200", "{capacity}"), FORMULATION, [3]).reason == "review.template_marker"
    assert review_gate("Maximize 3x.", FORMULATION, [3]).reason == "review.too_short"
    assert review_gate(PROBLEM * 500, FORMULATION, []).reason == "review.too_long"
    assert review_gate(PROBLEM, "maximize 3 b + 2.5 c", nums).reason == "review.formulation_incomplete"


def test_numbers_in() -> None:
    assert gates.numbers_in("x1 costs 1,250.5 or -3 and .5; item_7") == [1250.5, -3.0, 0.5]


def test_parse_review_and_registry() -> None:
    assert gates.parse_review("ACCEPT").accepted
    r = gates.parse_review("REJECT: the demand of store 2 is never used")
    assert r.reason == "review.llm_rejected" and "store 2" in r.detail
    assert gates.parse_review("I think it is fine").reason == "review.llm_error"
    with pytest.raises(ValueError, match="unknown gate reason"):
        gates.reject("ast.made_up")
    assert all(code.split(".")[0] in {"ast", "exec", "structure", "objective", "review", "llm"} for code in REASONS)
