"""Stage 1: the tiling MILP (HiGHS and Gurobi) equals brute-force enumeration of the same model, and its choices
respect every capacity, alignment and divisibility rule as the backends themselves check them; the roofline
regime agrees with closed-form arithmetic intensity."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest
from trex.kernels.backends.ascendc import SOCS, AscendCBackend, make_tiling
from trex.kernels.backends.base import DeviceFacts
from trex.kernels.roofline import classify
from trex.kernels.suite import SUITE
from trex.kernels.tiling import (
    LEVEL,
    Group,
    TilingModel,
    enumerate_configs,
    model_time,
    plan,
    solve,
    stage_time,
)

SOLVERS = ["highs", "gurobi"]


def working_set(spec: Any, shape: dict[str, int], params: dict[str, int]) -> float:
    """Bytes one cpu-c stage touches (fp32), written out independently of the model's footprint groups."""
    if spec.kclass == "gemm":
        return 4.0 * (params["MB"] * params["KB"] + params["KB"] * params["NB"] + params["MB"] * params["NB"])
    return float(spec.tile_bytes(shape, params["BLOCK"] if "BLOCK" in params else params.get("CHUNK", 1), 4))


def _brute(model: TilingModel, k: int) -> list[float]:
    """Independent reference: every configuration at every level, feasibility checked term by term."""
    out = []
    for cfg in enumerate_configs(model.space):
        if any((p, v) in model.forbid for p, v in cfg.items()):
            continue
        if any(cfg.get(a[0]) == a[1] and cfg.get(b[0]) == b[1] for a, b in model.forbid_pairs):
            continue
        times = []
        for li, (_, cap) in enumerate(model.levels):
            full = {**cfg, LEVEL: li}
            key = {id(g): tuple(full[n] for n in g.params) for g in model.groups}
            fp = sum(g.footprint.get(key[id(g)], 0.0) for g in model.groups)
            if fp > cap:
                continue
            c = sum(g.compute.get(key[id(g)], 0.0) for g in model.groups)
            m = sum(g.memory.get(key[id(g)], 0.0) for g in model.groups)
            o = sum(g.overhead.get(key[id(g)], 0.0) for g in model.groups)
            a = model.overlap[full[model.buffers]] if model.buffers else model.overlap[1]
            times.append(max(c, m) + a * min(c, m) + o + model.launch_s)
        if times:
            out.append(min(times))
    return sorted(out)[:k]


def _random_model(seed: int) -> TilingModel:
    rng = random.Random(seed)
    space = {"A": (1, 2, 4, 8), "B": (16, 32, 64), "BUF": (1, 2), "T": (1, 2, 4)}
    combos = lambda names: itertools.product(*[(range(2) if n == LEVEL else space[n]) for n in names])  # noqa: E731
    groups = (
        Group(("A", "B", "BUF"), footprint={c: float(c[0] * c[1] * c[2]) for c in combos(("A", "B", "BUF"))}),
        Group(("A", "T"), compute={c: rng.uniform(1e-6, 1e-4) / c[1] for c in combos(("A", "T"))}),
        Group((LEVEL, "T"), memory={c: rng.uniform(1e-6, 1e-4) * (1 + c[0]) for c in combos((LEVEL, "T"))}),
        Group(("B", "T"), overhead={c: rng.uniform(0, 2e-5) for c in combos(("B", "T"))}),
    )
    forbid = {("A", 8): "too long"} if seed % 2 else {}
    pairs = {(("B", 16), ("T", 4)): "fewer chunks than threads"}
    return TilingModel(space=space, levels=(("L1", 300.0), ("L2", 900.0)), groups=groups,
                       overlap={1: 1.0, 2: rng.uniform(0.0, 0.3)}, buffers="BUF", launch_s=3e-6,
                       forbid=forbid, forbid_pairs=pairs)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_milp_equals_brute_force_on_random_models(solver: str, seed: int) -> None:
    model = _random_model(seed)
    sols = solve(model, k=5, solver=solver)  # type: ignore[arg-type]
    got = [stage_time(model, s) for s in sols]
    assert got == pytest.approx(_brute(model, 5), rel=1e-9)
    for s in sols:
        fp = s["A"] * s["B"] * s["BUF"]
        assert fp <= model.levels[s[LEVEL]][1]
        assert not (s["B"] == 16 and s["T"] == 4) and (seed % 2 == 0 or s["A"] != 8)
    assert len({tuple(sorted((p, v) for p, v in s.items() if p != LEVEL)) for s in sols}) == len(sols)


def test_infeasible_model_returns_nothing() -> None:
    model = _random_model(0)
    tight = TilingModel(model.space, (("L1", 10.0),), model.groups, model.overlap, model.buffers)
    assert solve(tight, k=3) == []


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("name", ["grouped_gemm", "cross_entropy", "rmsnorm_fwd", "router_topk", "mhc_pre"])
def test_cpu_plan_equals_brute_force_and_respects_constraints(cpu_backend, name: str, solver: str) -> None:  # type: ignore[no-untyped-def]
    spec = SUITE[name]
    shape = spec.default_shapes[0]
    facts = cpu_backend.facts()
    cap = 256 << 10
    p = plan(spec, shape, "fp32", cpu_backend, facts, k=4, capacity=cap, solver=solver)  # type: ignore[arg-type]
    assert p.model is not None and len(p.ranked) == 4
    assert [c.predicted for c in p.ranked] == pytest.approx(_brute(p.model, 4), rel=1e-9)
    for c in p.ranked:
        prm = c.params
        assert working_set(spec, shape, prm) <= cap
        if prm.get("VEC"):
            assert prm.get("UNROLL", 1) == 1
            for tile in ("NB", "BLOCK"):
                assert prm.get(tile, prm["VEC"]) % prm["VEC"] == 0
        if spec.kclass == "gemm":
            assert prm["NB"] <= max(16, 1 << (shape["out"] - 1).bit_length())
            assert prm["MB"] <= max(4, 1 << (shape["tokens"] // shape["experts"] - 1).bit_length())
    assert p.directions and set(p.directions) <= {"tile", "vectorise", "unroll", "multi-row", "loop-order",
                                                  "fusion", "accumulation", "threads"}


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(("name", "shape"), [("rmsnorm_fwd", {"rows": 64, "cols": 65536}),
                                             ("swiglu_clamp_fwd", {"rows": 8, "cols": 65536}),
                                             ("rope_fwd", {"tokens": 3, "heads": 2, "dim": 64})])
def test_ascend_plan_equals_brute_force_and_fits_the_ub(name: str, shape: dict[str, int], solver: str) -> None:
    be = AscendCBackend(soc="ascend910b")
    p = plan(SUITE[name], shape, "fp32", be, be.facts(), k=6, solver=solver)  # type: ignore[arg-type]
    assert p.model is not None
    assert [c.predicted for c in p.ranked] == pytest.approx(_brute(p.model, 6), rel=1e-9)
    for c in p.ranked:
        t = make_tiling(SUITE[name], shape, c.params, "ascend910b")  # raises on UB overflow or misalignment
        assert t.ub_bytes <= SOCS["ascend910b"].ub_bytes and (t.tile_len * 4) % 32 == 0
    # the big rows want long tiles; double buffering is chosen whenever the tile fits twice
    best = p.ranked[0].params
    assert best["BUFFER_NUM"] == 2 or model_time(p.model, {**best, "BUFFER_NUM": 2}) is None


@pytest.mark.parametrize("solver", SOLVERS)
def test_triton_plan_equals_brute_force_and_fits_shared_memory(solver: str) -> None:
    from trex.kernels.backends.triton import TritonBackend

    facts = DeviceFacts(name="cuda:test", peak_flops=5e13, bandwidth=3e12, caches={"SMEM": 48 << 10, "L2": 50 << 20},
                        level_bandwidth={}, cores=132, source="nominal")
    be = TritonBackend(facts=facts)
    spec, shape = SUITE["rmsnorm_fwd"], {"rows": 64, "cols": 4096}
    p = plan(spec, shape, "fp32", be, facts, k=5, solver=solver)  # type: ignore[arg-type]
    assert p.model is not None
    assert [c.predicted for c in p.ranked] == pytest.approx(_brute(p.model, 5), rel=1e-9)
    for c in p.ranked:
        assert c.params["STAGES"] * c.params["BLOCK"] * 4 * 4 <= 48 << 10  # x, w, y, rstd slices per stage
    assert model_time(p.model, {"BLOCK": 4096, "WARPS": 4, "STAGES": 3}) is None  # 192 KiB: the limit binds
    assert model_time(p.model, {"BLOCK": 512, "WARPS": 4, "STAGES": 3}) is not None


def _triton_moe_smem(name: str, shape: dict[str, int], p: dict[str, int]) -> float:
    """Bytes a Triton MoE program stages on chip, written out from the kernels' loads (fp32)."""
    def p2(n: int) -> int:
        return max(2, 1 << (n - 1).bit_length())
    if name == "router_topk":
        return 3 * 4 * p["BLOCK"] * p2(shape["experts"])  # logits, scores, selection keys
    if name == "grouped_gemm":
        return p["STAGES"] * 4 * (p["MB"] * p["KB"] + p["KB"] * p["NB"])  # x and W operand tiles
    return p["STAGES"] * 4 * p["BLOCK"] * (2 + p2(shape["streams"] ** 2))  # x, gamma, w slices


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(("name", "shape", "too_big"), [
    ("router_topk", {"tokens": 4096, "experts": 256, "k": 8, "score": 2}, {"BLOCK": 32, "WARPS": 4}),
    ("grouped_gemm", {"tokens": 4096, "experts": 16, "hidden": 1024, "out": 512},
     {"MB": 128, "NB": 128, "KB": 64, "WARPS": 4, "STAGES": 3}),
    ("mhc_pre", {"tokens": 4096, "streams": 4, "hidden": 1024, "iters": 20}, {"BLOCK": 1024, "WARPS": 4, "STAGES": 2}),
])
def test_triton_moe_plans_equal_brute_force_and_fit_shared_memory(solver: str, name: str, shape: dict[str, int],
                                                                  too_big: dict[str, int]) -> None:
    from trex.kernels.backends.triton import TritonBackend

    facts = DeviceFacts(name="cuda:test", peak_flops=5e13, bandwidth=3e12, caches={"SMEM": 48 << 10, "L2": 50 << 20},
                        level_bandwidth={}, cores=132, source="nominal")
    be = TritonBackend(facts=facts)
    p = plan(SUITE[name], shape, "fp32", be, facts, k=5, solver=solver)  # type: ignore[arg-type]
    assert p.model is not None
    assert [c.predicted for c in p.ranked] == pytest.approx(_brute(p.model, 5), rel=1e-9)
    for c in p.ranked:
        assert _triton_moe_smem(name, shape, c.params) <= 48 << 10
        assert be.predict(SUITE[name], shape, "fp32", c.params, facts) == pytest.approx(c.predicted, rel=1e-9)
    assert _triton_moe_smem(name, shape, too_big) > 48 << 10 and model_time(p.model, too_big) is None


def test_cpu_model_router_and_mhc_terms(cpu_backend) -> None:  # type: ignore[no-untyped-def]
    """The router pays two libm calls per (token, expert) for sqrt-softplus, so every libm configuration is
    modelled slower than every polynomial one; the four-stream mHC accumulates only its norm and Sinkhorn in
    double, so ACC_DOUBLE moves its model by little, while the generic path pays it on every FLOP."""
    facts = cpu_backend.facts()
    spec, shape = SUITE["router_topk"], dict(SUITE["router_topk"].default_shapes[0])
    model = cpu_backend.tiling_model(spec, shape, "fp32", facts)
    space = {**model.space, "THREADS": (1,), "CHUNK": (16,)}
    times = {(c["EXP_POLY"], tuple(sorted(c.items()))): r[0] for c in enumerate_configs(space)
             for r in [model_time(model, c)] if r is not None}
    libm = [t for (ep, _), t in times.items() if ep == 0]
    poly = [t for (ep, _), t in times.items() if ep == 1]
    assert libm and poly and min(libm) > max(poly)

    def gap(name: str, dims: dict[str, int]) -> float:
        m = cpu_backend.tiling_model(SUITE[name], dims, "fp32", facts)
        base = {"THREADS": 1, "VEC": 16, "UNROLL": 1, "CHUNK": m.space["CHUNK"][0], "FUSED": 1}
        t0, t1 = (model_time(m, {**base, "ACC_DOUBLE": a}) for a in (0, 1))
        assert t0 is not None and t1 is not None
        return t1[0] / t0[0]
    four = gap("mhc_pre", {"tokens": 256, "streams": 4, "hidden": 512, "iters": 20})
    three = gap("mhc_pre", {"tokens": 256, "streams": 3, "hidden": 512, "iters": 20})
    assert 1.0 < four < 1.1 < three


def test_double_buffering_is_a_real_tradeoff() -> None:
    """A tile length that fits only single-buffered competes with a shorter double-buffered one."""
    be = AscendCBackend(soc="ascend910b")
    spec, shape = SUITE["swiglu_clamp_fwd"], {"rows": 40, "cols": 65536}
    model = be.tiling_model(spec, shape, "fp32", be.facts())
    long1 = model_time(model, {"TILE_LEN": 8192, "BUFFER_NUM": 1, "BLOCK_DIM": 40})
    assert long1 is not None and model_time(model, {"TILE_LEN": 8192, "BUFFER_NUM": 2, "BLOCK_DIM": 40}) is None
    assert model_time(model, {"TILE_LEN": 8192, "BUFFER_NUM": 1, "BLOCK_DIM": 8}) is None  # not a BLOCK_DIM choice
    short2 = model_time(model, {"TILE_LEN": 4096, "BUFFER_NUM": 2, "BLOCK_DIM": 40})
    assert short2 is not None and short2[0] < long1[0]


def test_roofline_regimes_follow_arithmetic_intensity() -> None:
    facts = DeviceFacts(name="t", peak_flops=1e11, bandwidth=1e10, caches={"L2": 1 << 20}, level_bandwidth={}, cores=1)
    rms = SUITE["rmsnorm_fwd"]
    r = classify(rms, {"rows": 4096, "cols": 4096}, "fp32", facts)
    assert r.regime == "memory" and r.intensity == pytest.approx(4 * 4096 * 4096 / (8 * 4096 * 4096 + 4 * 4096 + 4 * 4096))
    gemm = SUITE["grouped_gemm"]
    g = classify(gemm, {"tokens": 4096, "experts": 1, "hidden": 4096, "out": 4096}, "fp32", facts)
    assert g.regime == "compute" and g.intensity > g.ridge == 10.0
    tiny = classify(rms, {"rows": 1, "cols": 64}, "fp32", facts)
    assert tiny.regime == "overhead"
    assert math.isfinite(r.t_bound)
