"""Statistics before claims: no-op 'speedups' and results above the hardware ceiling are refused.

A kernel timed against itself on this host is a wall-clock measurement: benchmarks/kernels_profile_self.py."""

from __future__ import annotations

import pytest
from trex.kernels.backends.base import DeviceFacts
from trex.kernels.profile import accept, bootstrap_ci, ceiling_violation, summarize
from trex.kernels.suite import SUITE


def test_load_shared_by_both_sides_of_a_pair_cancels() -> None:
    """Host load that slows both sides of a pair (3x, on 19 of 40 pairs) is no gain even where a burst that
    begins between the two sides of 2 pairs moves the baseline's median to the slow mode (ratio of medians
    3x); a real 1.25x under the same load is found."""
    from statistics import median

    load = [3.0 if (i * 7) % 40 < 19 else 1.0 for i in range(40)]
    base = [3.0 if i in (3, 4) else x for i, x in enumerate(load)]  # pairs 3, 4: fast cand, slow base
    assert median(base) / median(load) == 3.0
    t = summarize(load, base)
    assert t.gain == 1.0 and not accept(t)[0]
    t = summarize([x / 1.25 for x in load], base)
    assert abs(t.gain - 1.25) < 1e-12 and accept(t)[0]
    with pytest.raises(ValueError, match="paired"):
        summarize(load, base[:-1])


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
