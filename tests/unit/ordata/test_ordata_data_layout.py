"""The data layout of reference answers: the program restates each number of the rendered problem exactly once,
in the problem's order, as positional lists after the entity names; it reproduces the solver's objective (and a
brute-force optimum) in the sandbox with the instance's model (structural gate), and a repeated entity name
cannot merge two entries; the config rejects the layout where it does not exist, naming the field."""

from __future__ import annotations

import ast
import itertools
import json

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


def _assignment(line: str) -> tuple[str, object]:
    """(name, value) of one ``name = literal`` line."""
    node = ast.parse(line).body[0]
    assert isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    return node.targets[0].id, ast.literal_eval(node.value)


def _flat(v: object) -> list[object]:
    """The scalars of a literal (a number, a list, or a list of lists), in source order."""
    return [x for item in v for x in _flat(item)] if isinstance(v, list) else [v]


@pytest.mark.parametrize("family", DATA_LAYOUT_FAMILIES)
@pytest.mark.parametrize("index", [0, 1, 2])
def test_data_block_states_each_rendered_number_once_in_problem_order(family: str, index: int) -> None:
    inst = sample_feasible(FAMILIES[family], derive_seed(3, family, index), 3)[0]
    rendered = render(inst, "formal", "concise")
    lines = dict(_assignment(line) for line in data_block(inst))
    names = {k: v for k, v in lines.items() if k in inst.sets}
    # the entity names come first, as the problem's own, in its order; then one list per parameter, no names
    assert list(lines) == [*names, *inst.params]
    for k, v in names.items():
        assert v == inst.sets[k]
        assert all(f"{e} = " in rendered.text for e in v)  # type: ignore[attr-defined]
    numbers = [x for p in inst.params for x in _flat(lines[p])]
    assert all(isinstance(x, int | float) for x in numbers)
    assert numbers == pytest.approx(rendered.numbers)
    for p in inst.params.values():  # positional: entry k is the value of entity k of the parameter's set
        if isinstance(p.value, list):
            assert len(lines[p.name]) == len(inst.sets[p.index[0]])  # type: ignore[arg-type]


def _knapsack_optimum(weight: list[float], value: list[float], capacity: float) -> float:
    """Best total value over every subset within capacity (brute force, independent of any solver)."""
    return max(sum(v for v, t in zip(value, take, strict=True) if t)
               for take in itertools.product((0, 1), repeat=len(weight))
               if sum(w for w, t in zip(weight, take, strict=True) if t) <= capacity)


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
    if family == "knapsack":
        data = dict(_assignment(line) for line in data_block(inst))
        best = _knapsack_optimum(data["weight"], data["value"], data["capacity"])  # type: ignore[arg-type]
        assert res.objective == pytest.approx(best)


def test_repeated_entity_name_keeps_both_entries() -> None:
    """Two entities written with one name (a model's slip) stay two positions: the objective is unchanged."""
    inst = sample_feasible(FAMILIES["knapsack"], derive_seed(5, "knapsack", 2), 3)[0]
    _, code = reconstruction(inst, "gurobipy", "data")
    items = inst.sets["items"]
    line = "items = " + json.dumps(items)
    assert line in code
    twice = "items = " + json.dumps([items[0], items[0], *items[2:]])
    res_ref = run_python(code, limits=Limits(timeout_s=60))
    res_twice = run_python(code.replace(line, twice), limits=Limits(timeout_s=60))
    assert res_ref.ok and res_twice.ok, res_twice.stderr[-2000:]
    assert res_ref.objective is not None and res_twice.objective == pytest.approx(res_ref.objective)
    g = structural_gate(res_twice.solve, instance_model(inst))  # the same model: one variable per entity
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
