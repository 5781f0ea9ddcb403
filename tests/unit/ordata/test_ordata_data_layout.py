"""The data layout of reference answers: the program restates each number of the rendered problem exactly once,
in the problem's order and under its entity names, reproduces the solver's objective in the sandbox with the
instance's model (structural gate); the config rejects the layout where it does not exist, naming the field."""

from __future__ import annotations

import ast

import pytest
from pydantic import ValidationError
from trex.config_base import load_section
from trex.ordata.config import ORDataConfig
from trex.ordata.gates import ast_gate, instance_model, numbers_in, review_gate, structural_gate
from trex.ordata.generators import FAMILIES, derive_seed, sample_feasible
from trex.ordata.reconstruct import DATA_LAYOUT_FAMILIES, data_block, reconstruction
from trex.ordata.render import render
from trex.ordata.solve import solve
from trex.ordata.verify import objective_agrees
from trex.sandbox import Limits, run_python


def _literals(line: str) -> list[object]:
    """The numbers of one ``name = literal`` line, in source order (dict keys are names, not numbers)."""
    node = ast.parse(line).body[0]
    assert isinstance(node, ast.Assign)
    out: list[object] = []

    def walk(v: ast.expr) -> None:
        if isinstance(v, ast.Dict):
            for k, x in zip(v.keys, v.values, strict=True):
                assert isinstance(k, ast.Constant) and isinstance(k.value, str)
                walk(x)
        else:
            out.append(ast.literal_eval(v))

    walk(node.value)
    return out


@pytest.mark.parametrize("family", DATA_LAYOUT_FAMILIES)
@pytest.mark.parametrize("index", [0, 1, 2])
def test_data_block_states_each_rendered_number_once_in_problem_order(family: str, index: int) -> None:
    inst = sample_feasible(FAMILIES[family], derive_seed(3, family, index), 3)[0]
    rendered = render(inst, "formal", "concise")
    numbers = [x for line in data_block(inst) for x in _literals(line)]
    assert numbers == pytest.approx(rendered.numbers)
    # the entity names are the problem's own, in its order
    for line, p in zip(data_block(inst), inst.params.values(), strict=True):
        if isinstance(p.value, list):
            keys = [k.value for k in ast.parse(line).body[0].value.keys]  # type: ignore[attr-defined]
            assert keys == inst.sets[p.index[0]]
            assert all(f"{k} = " in rendered.text for k in keys)


@pytest.mark.parametrize("family", DATA_LAYOUT_FAMILIES)
def test_data_program_reproduces_objective_with_the_instance_model(family: str) -> None:
    inst = sample_feasible(FAMILIES[family], derive_seed(5, family, 1), 3)[0]
    ref = solve(inst, "gurobi")
    assert ref.optimal and ref.objective is not None
    form, code = reconstruction(inst, "gurobipy", "data")
    assert ast_gate(code).accepted
    problem = render(inst, "formal", "concise")
    assert review_gate(problem.text, form, problem.numbers).accepted
    assert set(numbers_in(form)) <= {0.0, 1.0}  # symbolic: no data in the formulation (only binary domains)
    res = run_python(code, limits=Limits(timeout_s=60))
    assert res.ok, res.stderr[-2000:]
    assert res.status == "optimal" and res.objective is not None
    assert objective_agrees(res.objective, ref.objective, 1e-6)
    g = structural_gate(res.solve, instance_model(inst))
    assert g.accepted, g


def test_data_layout_rejected_where_it_does_not_exist() -> None:
    base = {"families": [{"name": "knapsack"}], "reconstruction": {"layout": "data"}}
    assert load_section(ORDataConfig, base).reconstruction.layout == "data"
    with pytest.raises(ValidationError, match=r"reconstruction.layout: 'data' has no layout for diet"):
        load_section(ORDataConfig, {**base, "families": [{"name": "knapsack"}, {"name": "diet"}]})
    with pytest.raises(ValidationError, match="layout: 'data' is written for gurobipy; codeSolver"):
        load_section(ORDataConfig, {**base, "reconstruction": {"layout": "data", "codeSolver": "both"}})
    with pytest.raises(ValidationError, match="layout: 'data' is the reference reconstruction's layout"):
        load_section(ORDataConfig, {**base, "reconstruction": {
            "layout": "data", "mode": "llm", "endpoint": {"url": "http://localhost:1/v1", "model": "m"}}})
    inst = sample_feasible(FAMILIES["diet"], 1, 3)[0]
    with pytest.raises(ValueError, match="no data layout"):
        reconstruction(inst, "gurobipy", "data")
    with pytest.raises(ValueError, match="layout must be"):
        reconstruction(inst, "gurobipy", "tabular")
