"""IR: JSON round-trip, canonical hashing, validation and LP/MPS export read back by both solvers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from trex.ordata.generators import FAMILIES, derive_seed, sample_feasible
from trex.ordata.ir import Constraint, Instance, Objective, Variable, instance_from_json
from trex.ordata.solve import solve_gurobi, solve_highs, write_model


def _inst(family: str, index: int = 0, size: int = 4) -> Instance:
    return sample_feasible(FAMILIES[family], derive_seed(7, family, index), size)[0]


@pytest.mark.parametrize("family", ["diet", "portfolio", "vrp", "facility_location"])
def test_json_round_trip_preserves_instance_and_hash(family: str) -> None:
    inst = _inst(family)
    back = instance_from_json(inst.to_json())
    assert back == inst
    assert back.content_hash() == inst.content_hash()


def test_hash_ignores_ordering_but_not_data() -> None:
    inst = _inst("transportation")
    shuffled = dataclasses.replace(
        inst,
        variables=tuple(reversed(inst.variables)),
        constraints=tuple(dataclasses.replace(c, coeffs=dict(reversed(list(c.coeffs.items()))))
                          for c in reversed(inst.constraints)),
        objective=dataclasses.replace(inst.objective, linear=dict(reversed(list(inst.objective.linear.items())))),
    )
    assert shuffled.content_hash() == inst.content_hash()
    c0 = inst.constraints[0]
    changed = dataclasses.replace(inst, constraints=(dataclasses.replace(c0, rhs=c0.rhs + 1), *inst.constraints[1:]))
    assert changed.content_hash() != inst.content_hash()
    # float noise below 12 significant digits does not change the hash
    noisy = dataclasses.replace(inst, constraints=(dataclasses.replace(c0, rhs=c0.rhs * (1 + 1e-15)),
                                                   *inst.constraints[1:]))
    assert noisy.content_hash() == inst.content_hash()


def test_validate_names_the_problem() -> None:
    inst = Instance("x", "d", "t", 0, {}, {}, (Variable("a"),),
                    (Constraint("c", {"b": 1.0}, "<=", 1.0),), Objective("min", {"a": 1.0}))
    with pytest.raises(ValueError, match="unknown variable b"):
        inst.validate()
    inst2 = dataclasses.replace(inst, variables=(Variable("a", lb=2.0, ub=1.0),), constraints=())
    with pytest.raises(ValueError, match="ub < lb"):
        inst2.validate()


@pytest.mark.parametrize("family", ["blending", "knapsack", "tsp", "portfolio"])
@pytest.mark.parametrize("suffix", [".lp", ".mps"])
def test_export_read_back_by_both_solvers(family: str, suffix: str, tmp_path: Path) -> None:
    import gurobipy as gp
    import highspy

    inst = _inst(family, index=3)
    path = write_model(inst, tmp_path / f"model{suffix}")
    reference = solve_highs(inst) if inst.is_quadratic else solve_gurobi(inst)
    assert reference.optimal and reference.objective is not None
    env = gp.Env(empty=True)
    env.setParam("OutputFlag", 0)
    env.start()
    m = gp.read(str(path), env=env)
    m.Params.MIPGap = 1e-9
    m.optimize()
    assert m.Status == gp.GRB.OPTIMAL
    assert m.NumVars == len(inst.variables)
    assert abs(m.ObjVal - reference.objective) <= 1e-6 * (1 + abs(reference.objective))
    h = highspy.Highs()
    h.silent()
    h.setOptionValue("mip_rel_gap", 1e-9)
    h.readModel(str(path))
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    assert abs(h.getInfo().objective_function_value - reference.objective) <= 1e-6 * (1 + abs(reference.objective))


def test_write_model_rejects_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="suffix"):
        write_model(_inst("diet"), tmp_path / "m.txt")
