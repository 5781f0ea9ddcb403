"""ORGEval: renamed/reordered models are equivalent; changed coefficients, senses, types or a scaled
row are not; verdicts agree with networkx's Weisfeiler-Lehman hash; LP files from gurobipy and
HiGHS are read alike."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import networkx as nx
import pytest
from trex.verify.orgeval import canonical_graph, equivalent_lp, read_lp_text, solve_lp_text, to_networkx

gp = pytest.importorskip("gurobipy")
SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "benchmarks"

# Base model: max 3x + 2y - z  s.t.  x + 2y <= 14,  3x - y >= 0,  x + y + z = 5,  x in [0, 10], y int, z bin.
BASE: dict[str, Any] = {
    "vars": [("x", "C", 0.0, 10.0, 3.0), ("y", "I", 0.0, float("inf"), 2.0), ("z", "B", 0.0, 1.0, -1.0)],
    "cons": [("c1", {"x": 1.0, "y": 2.0}, "<", 14.0), ("c2", {"x": 3.0, "y": -1.0}, ">", 0.0),
             ("c3", {"x": 1.0, "y": 1.0, "z": 1.0}, "=", 5.0)],
    "sense": "max",
}


def lp_of(spec: dict[str, Any], tmp: Path, *, rename: bool = False, shuffle: int | None = None) -> str:
    env = gp.Env(empty=True)
    env.setParam("OutputFlag", 0)
    env.start()
    m = gp.Model(env=env)
    rng = random.Random(shuffle)
    vars_ = list(spec["vars"])
    cons = list(spec["cons"])
    if shuffle is not None:
        rng.shuffle(vars_)
        rng.shuffle(cons)
    names = {v[0]: (f"w_{i}_{v[0]}q" if rename else v[0]) for i, v in enumerate(spec["vars"])}
    vtype = {"C": gp.GRB.CONTINUOUS, "I": gp.GRB.INTEGER, "B": gp.GRB.BINARY}
    v = {n: m.addVar(lb=lb, ub=ub, obj=obj, vtype=vtype[t], name=names[n]) for n, t, lb, ub, obj in vars_}
    for name, coeffs, sense, rhs in cons:
        terms = list(coeffs.items())
        if shuffle is not None:
            rng.shuffle(terms)
        expr = gp.quicksum(a * v[n] for n, a in terms)
        cname = f"row{rng.randint(0, 10**6)}" if rename else name
        m.addConstr(expr <= rhs if sense == "<" else expr >= rhs if sense == ">" else expr == rhs, name=cname)
    m.ModelSense = gp.GRB.MAXIMIZE if spec["sense"] == "max" else gp.GRB.MINIMIZE
    m.ObjCon = spec.get("const", 0.0)
    path = tmp / f"m{random.random()}.lp"
    m.write(str(path))
    m.dispose()
    env.dispose()
    return path.read_text()


def variant(**changes: Any) -> dict[str, Any]:
    spec = {"vars": list(BASE["vars"]), "cons": [(n, dict(c), s, r) for n, c, s, r in BASE["cons"]], "sense": "max"}
    for key, fn in changes.items():
        spec[key] = fn(spec[key])
    return spec


def nx_same(a: str, b: str) -> bool:
    ga, gb = to_networkx(read_lp_text(a)), to_networkx(read_lp_text(b))
    ha = nx.weisfeiler_lehman_graph_hash(ga, node_attr="label", edge_attr="w", iterations=6)
    hb = nx.weisfeiler_lehman_graph_hash(gb, node_attr="label", edge_attr="w", iterations=6)
    return bool(ha == hb) and ga.graph["label"] == gb.graph["label"]


def test_renamed_and_reordered_models_are_equivalent(tmp_path: Path) -> None:
    ref = lp_of(BASE, tmp_path)
    for seed in range(4):
        cand = lp_of(BASE, tmp_path, rename=True, shuffle=seed)
        assert "w_0_xq" in cand and cand != ref
        eq = equivalent_lp(cand, ref)
        assert eq.equivalent, eq.reason
        assert nx_same(cand, ref)


def test_exact_rewrites_are_equivalent(tmp_path: Path) -> None:
    ref = lp_of(BASE, tmp_path)
    # min of the negated objective; ">=" row written as "<=" with negated coefficients.
    neg_obj = variant(vars=lambda vs: [(n, t, lb, ub, -o) for n, t, lb, ub, o in vs], sense=lambda s: "min")
    flipped = variant(cons=lambda cs: [(n, {k: -a for k, a in c.items()}, "<", -r) if s == ">" else (n, c, s, r)
                                       for n, c, s, r in cs])
    for spec in (neg_obj, flipped):
        cand = lp_of(spec, tmp_path, rename=True, shuffle=7)
        assert equivalent_lp(cand, ref).equivalent
        assert nx_same(cand, ref)


@pytest.mark.parametrize("change", ["coefficient", "sense", "rhs", "vtype", "bound", "objective", "scaled", "extra_row"])
def test_changed_models_are_not_equivalent(tmp_path: Path, change: str) -> None:
    ref = lp_of(BASE, tmp_path)
    specs = {
        "coefficient": variant(cons=lambda cs: [(n, {**c, "y": 2.5} if n == "c1" else c, s, r) for n, c, s, r in cs]),
        "sense": variant(cons=lambda cs: [(n, c, ">" if n == "c1" else s, r) for n, c, s, r in cs]),
        "rhs": variant(cons=lambda cs: [(n, c, s, 15.0 if n == "c1" else r) for n, c, s, r in cs]),
        "vtype": variant(vars=lambda vs: [(n, "C" if n == "y" else t, lb, ub, o) for n, t, lb, ub, o in vs]),
        "bound": variant(vars=lambda vs: [(n, t, lb, 9.0 if n == "x" else ub, o) for n, t, lb, ub, o in vs]),
        "objective": variant(sense=lambda s: "min"),
        # Decided: a row multiplied by a constant is a different formulation (see trex.verify.orgeval).
        "scaled": variant(cons=lambda cs: [(n, {k: 2 * a for k, a in c.items()} if n == "c1" else c, s,
                                            2 * r if n == "c1" else r) for n, c, s, r in cs]),
        "extra_row": variant(cons=lambda cs: [*cs, ("c4", {"x": 1.0}, "<", 10.0)]),
    }
    cand = lp_of(specs[change], tmp_path, rename=True, shuffle=3)
    eq = equivalent_lp(cand, ref)
    assert not eq.equivalent
    assert not nx_same(cand, ref)


def test_wl_needs_refinement_not_just_label_counts(tmp_path: Path) -> None:
    # Same multiset of variable and row labels and of coefficients; only the incidence differs.
    a = {"vars": [("x", "C", 0.0, 1.0, 1.0), ("y", "C", 0.0, 1.0, 1.0)],
         "cons": [("r1", {"x": 1.0, "y": 2.0}, "<", 3.0), ("r2", {"x": 2.0, "y": 1.0}, "<", 3.0)], "sense": "max"}
    b = {"vars": a["vars"],
         "cons": [("r1", {"x": 1.0, "y": 2.0}, "<", 3.0), ("r2", {"x": 1.0, "y": 2.0}, "<", 3.0)], "sense": "max"}
    eq = equivalent_lp(lp_of(b, tmp_path), lp_of(a, tmp_path))
    assert not eq.equivalent and eq.rounds >= 1
    assert sorted(canonical_graph(read_lp_text(lp_of(a, tmp_path))).labels) == \
        sorted(canonical_graph(read_lp_text(lp_of(b, tmp_path))).labels)


def test_highs_written_lp_reads_like_gurobi(tmp_path: Path) -> None:
    highspy = pytest.importorskip("highspy")
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    inf = highspy.kHighsInf
    # Same model as BASE, built column by column in HiGHS.
    h.addVar(0.0, 10.0)
    h.addVar(0.0, inf)
    h.addVar(0.0, 1.0)
    h.changeColsCost(3, [0, 1, 2], [3.0, 2.0, -1.0])
    h.changeColsIntegrality(2, [1, 2], [highspy.HighsVarType.kInteger, highspy.HighsVarType.kInteger])
    h.addRow(-inf, 14.0, 2, [0, 1], [1.0, 2.0])
    h.addRow(0.0, inf, 2, [0, 1], [3.0, -1.0])
    h.addRow(5.0, 5.0, 3, [0, 1, 2], [1.0, 1.0, 1.0])
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    out = tmp_path / "highs.lp"
    h.writeModel(str(out))
    eq = equivalent_lp(out.read_text(), lp_of(BASE, tmp_path))
    assert eq.equivalent, eq.reason
    # Both solvers agree on the optimum of the LP file either wrote.
    st, val = solve_lp_text(out.read_text())
    h.run()
    assert st == "optimal" and val == pytest.approx(h.getInfo().objective_function_value, rel=1e-9)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/benchmarks not present")
def test_bench4opt_reference_models_permuted_and_perturbed(tmp_path: Path) -> None:
    from trex.evaluation.benchmarks import load_benchmark

    ds = load_benchmark("bench4opt", SHARED / "bench4opt")
    picked: dict[str, Any] = {}
    for it in ds.items:
        picked.setdefault(it.category, it)
    for it in list(picked.values())[:8]:
        assert it.reference_lp is not None
        model = read_lp_text(it.reference_lp)
        spec: dict[str, Any] = {"vars": [(f"v{j}", v.vtype, v.lb, min(v.ub, float("inf")), v.obj) for j, v in enumerate(model.variables)],
                "cons": [(c.name, {f"v{j}": a for j, a in c.coeffs}, c.sense, c.rhs) for c in model.constraints],
                "sense": model.sense, "const": model.obj_constant}
        assert equivalent_lp(lp_of(spec, tmp_path, rename=True, shuffle=1), it.reference_lp).equivalent, it.id
        row = next(i for i, c in enumerate(spec["cons"]) if c[1])
        n, c, s, r = spec["cons"][row]
        k = next(iter(c))
        spec["cons"][row] = (n, {**c, k: c[k] * 1.5 + 1.0}, s, r)
        assert not equivalent_lp(lp_of(spec, tmp_path, rename=True, shuffle=1), it.reference_lp).equivalent, it.id


def qp_lp(tmp: Path, coefs: dict[tuple[int, int], float], order: list[int], names: str) -> str:
    env = gp.Env(empty=True)
    env.setParam("OutputFlag", 0)
    env.start()
    m = gp.Model(env=env)
    xs = {i: m.addVar(ub=5.0, obj=float(i + 1), name=f"{names}[{i}]") for i in order}
    m.addConstr(gp.quicksum(xs[i] for i in order) <= 4.0, name=f"{names}_budget")
    quad = gp.QuadExpr()
    for (i, j), c in coefs.items():
        quad.add(xs[i] * xs[j], c)
    m.setObjective(gp.quicksum(float(i + 1) * xs[i] for i in order) - quad, gp.GRB.MAXIMIZE)
    path = tmp / f"qp{random.random()}.lp"
    m.write(str(path))
    env.dispose()
    return path.read_text()


def test_quadratic_objective_terms_are_part_of_the_structure(tmp_path: Path) -> None:
    q = {(0, 0): 1.0, (0, 1): 0.5, (1, 2): 0.25, (2, 2): 2.0}
    ref = qp_lp(tmp_path, q, [0, 1, 2], "x")
    assert equivalent_lp(qp_lp(tmp_path, q, [2, 0, 1], "w"), ref).equivalent
    assert not equivalent_lp(qp_lp(tmp_path, {**q, (1, 2): 0.3}, [0, 1, 2], "x"), ref).equivalent
    assert not equivalent_lp(qp_lp(tmp_path, {**q, (0, 2): 0.25, (1, 2): 0.0}, [0, 1, 2], "x"), ref).equivalent


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/benchmarks not present")
def test_gurobi_and_highs_readers_agree_on_bench4opt() -> None:
    from trex.evaluation.benchmarks import load_benchmark
    from trex.verify.orgeval import _read_gurobi, _read_highs, equivalent_models

    ds = load_benchmark("bench4opt", SHARED / "bench4opt")
    checked = 0
    for it in ds.items[::4]:  # every 4th instance: all 16 families, LP and MILP, objective constants, QPs
        assert it.reference_lp is not None
        try:
            highs = _read_highs(it.reference_lp)
        except ValueError:
            continue  # a few published files use LP syntax HiGHS's reader rejects; gurobipy is the reader
        eq = equivalent_models(_read_gurobi(it.reference_lp), highs)
        assert eq.equivalent, (it.id, eq.reason)
        checked += 1
    assert checked >= 100
