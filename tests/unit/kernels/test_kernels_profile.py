"""Statistics before claims: no-op 'speedups' and results above the hardware ceiling are refused."""

from __future__ import annotations

from trex.kernels.backends.base import DeviceFacts
from trex.kernels.profile import accept, bootstrap_ci, ceiling_violation, interleaved, summarize
from trex.kernels.suite import SUITE


def test_same_kernel_against_itself_is_not_a_speedup(cpu_backend) -> None:  # type: ignore[no-untyped-def]
    from trex.kernels.backends.base import alloc_outputs

    spec = SUITE["rmsnorm_fwd"]
    shape = {"rows": 64, "cols": 1024}
    comp = cpu_backend.compile(spec, cpu_backend.default_params(spec, shape), "fp32")
    t = spec.make_inputs(shape, "fp32", 0)
    outs = alloc_outputs(spec, shape, "fp32")
    a = comp.bind(t, outs, shape)
    b = comp.bind(t, outs, shape)
    timing = interleaved(a, b, samples=30, max_samples=120)
    ok, why = accept(timing)
    assert not ok, why
    assert len(timing.cand) >= 30 and len(timing.base) >= 30


def test_bootstrap_ci_matches_known_ratio() -> None:
    cand = [1.0 + 0.01 * (i % 5) for i in range(40)]
    base = [2.0 * c for c in cand]
    t = summarize(cand, base)
    assert abs(t.gain - 2.0) < 1e-12
    assert 1.9 < t.ci_low <= 2.0 <= t.ci_high < 2.1
    ok, _ = accept(t)
    assert ok
    lo, hi = bootstrap_ci(cand, cand)
    assert lo <= 1.0 <= hi


def test_small_gain_is_refused_even_if_significant() -> None:
    cand = [1.0] * 30
    base = [1.02] * 30
    ok, why = accept(summarize(cand, base))
    assert not ok and "threshold" in why


def test_result_above_hardware_ceiling_is_refused() -> None:
    facts = DeviceFacts(name="t", peak_flops=1e11, bandwidth=1e10, caches={"L2": 1 << 20},
                        level_bandwidth={"L2": 5e10}, cores=1)
    spec = SUITE["swiglu_clamp_fwd"]
    shape = {"rows": 1024, "cols": 4096}  # 48 MiB moved: DRAM-resident
    moved = spec.bytes_moved(shape, 4)
    assert ceiling_violation(spec, shape, "fp32", moved / 1e10, facts) is None
    msg = ceiling_violation(spec, shape, "fp32", moved / 1e10 / 3.0, facts)
    assert msg is not None and "GB/s" in msg
    gemm = SUITE["grouped_gemm"]
    gshape = {"tokens": 4096, "experts": 1, "hidden": 4096, "out": 4096}
    assert "GFLOP/s" in (ceiling_violation(gemm, gshape, "fp32", gemm.flops(gshape) / 1e12, facts) or "")
