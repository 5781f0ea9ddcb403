"""The bandwidth reference and the kernel timings are measured the same way: every timed sample follows
untimed calls of the same side (so one side never inherits the cache the other side's temporaries left),
the triad curve is a median per working-set size, and a kernel is compared with the curve of the level
that holds its working set."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from trex.kernels import profile
from trex.kernels.backends.base import DeviceFacts
from trex.kernels.machine import CURVE_FILLS, curve_sizes, facts_from_json, facts_to_json
from trex.kernels.roofline import achieved_bandwidth_fraction, classify
from trex.kernels.suite import SUITE

CACHES = {"L1": 32 << 10, "L2": 1 << 20, "L3": 32 << 20}


class FakeClock:
    """perf_counter replacement advanced only by the launchers: timings become exact and host-independent."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    c = FakeClock()
    monkeypatch.setattr(profile.time, "perf_counter", c)
    yield c


def _side_runs(calls: list[str]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for c in calls:
        if out and out[-1][0] == c:
            out[-1] = (c, out[-1][1] + 1)
        else:
            out.append((c, 1))
    return out


@pytest.mark.parametrize("rewarm", [1, 3])
def test_rewarm_precedes_every_timed_sample_with_calls_of_the_same_side(clock: FakeClock, rewarm: int) -> None:
    calls: list[str] = []

    def side(name: str, cost: float):  # type: ignore[no-untyped-def]
        def f() -> None:
            calls.append(name)
            clock.now += cost
        return f

    # each call costs more than min_sample_s, so a timed sample is one call
    t = profile.interleaved(side("c", 1e-3), side("b", 2e-3), samples=8, warmup=2, rewarm=rewarm)
    timed_phase = calls[2 * 2 + 1:]  # after the warm-up pairs and the one calibration call of the baseline
    k = rewarm + 1
    chunks = [timed_phase[i:i + k] for i in range(0, len(timed_phase), k)]
    assert len(chunks) == 16 and all(len(set(ch)) == 1 and len(ch) == k for ch in chunks)
    assert [ch[0] for ch in chunks] == ["c", "b", "b", "c"] * 4  # ABBA order kept
    assert t.median_cand == pytest.approx(1e-3) and t.median_base == pytest.approx(2e-3)


def test_without_rewarm_the_timed_calls_alternate(clock: FakeClock) -> None:
    calls: list[str] = []

    def side(name: str):  # type: ignore[no-untyped-def]
        def f() -> None:
            calls.append(name)
            clock.now += 1e-3
        return f

    profile.interleaved(side("c"), side("b"), samples=4, warmup=1)
    assert _side_runs(calls[3:]) == [("c", 1), ("b", 2), ("c", 2), ("b", 2), ("c", 1)]


def test_steady_median_times_only_the_timed_units_after_rewarm(clock: FakeClock) -> None:
    seen: list[int] = []
    timed = iter([7e-6, 3e-6, 4e-6, 7e-6, 3e-6])

    def f(reps: int) -> None:
        i = len(seen)
        seen.append(reps)
        # warm-up and calibration: 5 us a unit; then rewarm calls (slow: they must not count) and timed calls
        unit = 5e-6 if i < 2 else (1e-3 if i % 2 == 0 else next(timed))
        clock.now += reps * unit

    m = profile.steady_median(f, samples=5, min_sample_s=1e-4, rewarm=2)
    assert seen[:2] == [1, 1]
    assert seen[2::2] == [2] * 5 and seen[3::2] == [20] * 5  # reps sized to last min_sample_s
    assert m == pytest.approx(4e-6)  # median of 7, 3, 4, 7, 3 us per unit


def _facts(curve_1t: dict[int, float]) -> DeviceFacts:
    return DeviceFacts(name="t", peak_flops=1e11, bandwidth=2e10, caches=dict(CACHES),
                       level_bandwidth={"L1": 3e11, "L2": 2e11, "L3": 1e11},
                       level_bandwidth_1t={"L1": 2e11, "L2": 1e11, "L3": 6e10, "DRAM": 2e10},
                       cores=2, triad_curve_1t=curve_1t)


def test_bandwidth_at_interpolates_within_the_level_and_never_borrows_a_neighbour() -> None:
    mb = 1 << 20
    f = _facts({512 << 10: 110e9, 4 * mb: 90e9, 16 * mb: 60e9, 24 * mb: 40e9, 128 * mb: 20e9})
    assert f.bandwidth_at(4 * mb, 1) == pytest.approx(90e9)
    assert f.bandwidth_at(8 * mb, 1) == pytest.approx(75e9)  # halfway in log-size between 4 and 16 MiB
    assert f.bandwidth_at(2 * mb, 1) == pytest.approx(90e9)  # below L3's smallest point: clamp, not L2's 110
    assert f.bandwidth_at(30 * mb, 1) == pytest.approx(40e9)  # above L3's largest point: clamp, not DRAM's 20
    assert f.bandwidth_at(40 * mb, 1) == pytest.approx(20e9)
    assert f.bandwidth_at(700 << 10, 1) == pytest.approx(110e9)
    assert f.bandwidth_at(8 << 10, 1) == pytest.approx(2e11)  # no L1 point: the per-level figure
    assert f.bandwidth_at(8 * mb, 2) == f.bandwidth_for(8 * mb, 2) == pytest.approx(1e11)  # no all-core curve


def test_fraction_divides_compulsory_bytes_by_the_curve_at_the_working_set() -> None:
    spec = SUITE["rmsnorm_bwd"]
    shape = {"rows": 512, "cols": 2048}
    moved = spec.bytes_moved(shape, 4)
    mb = 1 << 20
    f = _facts({4 * mb: 90e9, 16 * mb: 60e9})
    ref = 90e9 + math.log(moved / (4 * mb)) / math.log(4) * (60e9 - 90e9)
    assert achieved_bandwidth_fraction(spec, shape, "fp32", f, moved / 40e9, 1) == pytest.approx(40e9 / ref)


def test_curve_sizes_cover_every_level_and_dram() -> None:
    sizes = curve_sizes(CACHES)
    f = _facts({})
    assert sizes == sorted(set(sizes)) and all(s % 12 == 0 for s in sizes)
    for level, cap in CACHES.items():
        inside = [s for s in sizes if f.level_of(s) == level]
        assert inside and max(inside) <= cap
    assert sum(f.level_of(s) == "L3" for s in sizes) == len(CURVE_FILLS)
    assert f.level_of(sizes[-1]) == "DRAM" and sizes[-1] >= 96 << 20


def test_facts_json_round_trip_keeps_the_curves() -> None:
    f = DeviceFacts(name="t", peak_flops=1e11, bandwidth=2e10, caches=dict(CACHES), cores=2,
                    triad_curve={4 << 20: 1.5e11}, triad_curve_1t={4 << 20: 9e10, 128 << 20: 2e10})
    g = facts_from_json(facts_to_json(f))
    assert g == f


def test_classify_at_one_thread_uses_one_core_and_the_single_thread_curve() -> None:
    mb = 1 << 20
    f = _facts({4 * mb: 90e9, 16 * mb: 60e9})
    spec = SUITE["swiglu_clamp_fwd"]
    shape = {"rows": 512, "cols": 2048}
    one, dev = classify(spec, shape, "fp32", f, threads=1), classify(spec, shape, "fp32", f)
    moved = spec.bytes_moved(shape, 4)
    assert one.ridge == pytest.approx((1e11 / 2) / f.bandwidth_at(moved, 1))
    assert dev.ridge == pytest.approx(1e11 / f.bandwidth_for(moved))
    assert one.intensity == dev.intensity
