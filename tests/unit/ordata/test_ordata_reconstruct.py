"""Reference reconstruction: the generated gurobipy and highspy programs reproduce the solver's objective in the
sandbox, for every family, and the model the sandbox records from them is the instance's model (structural
gate); the formulation lists every variable and constraint."""

from __future__ import annotations

import pytest
from trex.ordata.config import FAMILY_NAMES, ToleranceConfig
from trex.ordata.gates import instance_model, structural_gate
from trex.ordata.generators import FAMILIES, derive_seed, sample_feasible
from trex.ordata.reconstruct import formulation, linear_text, reference_code
from trex.ordata.solve import solve
from trex.ordata.verify import objective_agrees, verify_solution
from trex.sandbox import Limits, run_python


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_reference_code_reproduces_objective_in_sandbox(family: str) -> None:
    inst = sample_feasible(FAMILIES[family], derive_seed(5, family, 1), 4)[0]
    ref = solve(inst, "gurobi")
    assert ref.optimal and ref.objective is not None
    for library in ("gurobipy", "highspy"):
        res = run_python(reference_code(inst, library), limits=Limits(timeout_s=60))
        assert res.ok, res.stderr[-2000:]
        assert res.status == "optimal"
        assert res.objective is not None
        assert objective_agrees(res.objective, ref.objective, 1e-6), (library, res.objective, ref.objective)
        # the program's own solution is feasible for the IR (checked independently of the program)
        assert res.result is not None
        values = {k: float(v) for k, v in res.result["values"].items()}
        assert verify_solution(inst, values, res.objective, ToleranceConfig(feasibility=1e-5)).ok
        g = structural_gate(res.solve, instance_model(inst))
        assert g.accepted, (library, g)


def test_formulation_lists_every_variable_and_constraint() -> None:
    inst = sample_feasible(FAMILIES["facility_location"], 9, 4)[0]
    text = formulation(inst)
    for v in inst.variables:
        assert v.name in text
    for c in inst.constraints:
        assert f"{c.name}:" in text
    assert ("minimize" if inst.objective.sense == "min" else "maximize") in text


def test_linear_text_signs_and_unit_coefficients() -> None:
    assert linear_text({"a": 1.0, "b": -1.0, "c": 2.5, "d": -0.5}) == "a - b + 2.5 * c - 0.5 * d"
    assert linear_text({"a": -3.0}) == "-3 * a"
    assert linear_text({}) == "0"


def test_reference_code_rejects_unknown_library() -> None:
    with pytest.raises(ValueError, match="library"):
        reference_code(sample_feasible(FAMILIES["diet"], 1, 3)[0], "pulp")
