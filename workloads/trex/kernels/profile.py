"""Statistics before claims: interleaved timing of candidate and baseline, bootstrap confidence interval of
the gain (median of the per-pair ratios), acceptance rule, and the hardware-ceiling sanity check."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trex.kernels.facts import DeviceFacts
from trex.kernels.suite.base import KernelSpec, elem_bytes

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

MIN_GAIN = 1.03
CEILING_MARGIN = 1.5
REWARM_CALLS = 3
"""Untimed calls before each timed sample when comparing against a baseline with other temporaries: on a
CPU with a victim L3 (AMD Zen 4) a 12 MiB kernel re-timed after eager PyTorch takes 2.2x, 1.5x, 1.2x and
1.08x its back-to-back time after 0, 1, 2 and 3 warming calls."""


@dataclass(frozen=True)
class Timing:
    """Per-call seconds of the two interleaved series (paired: sample i of each timed back to back) and the
    gain statistics: ``gain`` is the median of base[i] / cand[i], [ci_low, ci_high] its 95 % bootstrap CI."""

    cand: tuple[float, ...]
    base: tuple[float, ...]
    median_cand: float
    median_base: float
    gain: float
    ci_low: float
    ci_high: float


def bootstrap_ci(cand: list[float], base: list[float], n_boot: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the median of the per-pair ratios base[i] / cand[i], resampling pairs.

    Sample i of each series is timed back to back (``interleaved``), so host load that slows one pair slows
    both of its sides and cancels in their ratio; resampling the two series independently instead treats a
    load burst on one side's samples as a difference between the kernels (a kernel timed against itself on
    a loaded 2-core host once showed 1.21x, 95 % CI [1.013, 1.491])."""
    import numpy as np

    r = _pair_ratios(cand, base)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(r), (n_boot, len(r)))
    lo, hi = np.quantile(np.median(r[idx], axis=1), [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def _pair_ratios(cand: list[float], base: list[float]) -> NDArray[np.float64]:
    """base[i] / cand[i] as a numpy array; the series must be paired (same length, timed alternately)."""
    import numpy as np

    if len(cand) != len(base) or not cand:
        raise ValueError(f"paired series expected, got {len(cand)} candidate and {len(base)} baseline samples")
    ratios: NDArray[np.float64] = np.asarray(base, dtype=np.float64) / np.asarray(cand, dtype=np.float64)
    return ratios


def summarize(cand: list[float], base: list[float], seed: int = 0) -> Timing:
    """Medians of both series, the gain (median per-pair ratio) and its bootstrap CI."""
    import numpy as np

    mc, mb = float(np.median(cand)), float(np.median(base))
    lo, hi = bootstrap_ci(cand, base, seed=seed)
    return Timing(tuple(cand), tuple(base), mc, mb, float(np.median(_pair_ratios(cand, base))), lo, hi)


def interleaved(cand: Callable[[], None], base: Callable[[], None], samples: int = 30, warmup: int = 3,
                sync: Callable[[], None] | None = None, min_sample_s: float = 2e-4, seed: int = 0,
                max_samples: int = 0, rewarm: int = 0) -> Timing:
    """Time both launchers alternately (ABBA order) for ``samples`` samples each; per-call seconds.

    When ``max_samples`` > ``samples``, a gain >= MIN_GAIN whose CI still includes 1 is re-measured with
    ``samples`` more samples at a time, up to ``max_samples``. With ``rewarm`` = k > 0 every timed sample is
    preceded by k untimed calls of the same launcher, so each side is timed in the cache state its own
    back-to-back calls leave (its inputs as resident as they fit), not in the state the other side's
    temporaries leave: the condition under which ``steady_median`` measures the bandwidth references.
    One call is not enough on a victim-cache L3 (AMD Zen): lines re-enter L3 only as L2 evicts them and
    compete with the other side's, so an L3-sized working set needs a few passes (REWARM_CALLS).
    """
    s = sync or (lambda: None)
    for _ in range(warmup):
        cand()
        base()
    s()
    t0 = time.perf_counter()
    base()
    s()
    one = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, min(1000, int(min_sample_s / one)))

    def run(f: Callable[[], None]) -> float:
        for _ in range(rewarm):
            f()
        if rewarm:
            s()
        return _timed(f, reps, s)

    tc: list[float] = []
    tb: list[float] = []

    def collect(n: int) -> None:
        for _ in range(n):
            if len(tc) % 2 == 0:  # ABBA: the side that goes first alternates per sample
                tc.append(run(cand))
                tb.append(run(base))
            else:
                tb.append(run(base))
                tc.append(run(cand))

    collect(samples)
    t = summarize(tc, tb, seed=seed)
    # sequential extension: a promising but not yet significant gain earns more samples (noisy hosts)
    while len(tc) < max_samples and t.gain >= MIN_GAIN and t.ci_low <= 1.0:
        collect(samples)
        t = summarize(tc, tb, seed=seed)
    return t


def _timed(f: Callable[[], None], reps: int, sync: Callable[[], None]) -> float:
    """Per-call seconds of ``reps`` back-to-back calls."""
    t = time.perf_counter()
    for _ in range(reps):
        f()
    sync()
    return (time.perf_counter() - t) / reps


def steady_median(f: Callable[[int], None], samples: int = 31, min_sample_s: float = 2e-4,
                  rewarm: int = REWARM_CALLS) -> float:
    """Median seconds per unit of work of ``f(reps)`` (which performs ``reps`` units in one call), timed the
    way ``interleaved(..., rewarm=REWARM_CALLS)`` times kernels: warm-up, then per sample ``rewarm`` untimed
    units followed by one timed call whose ``reps`` is sized to last about ``min_sample_s`` (amortising
    call overhead for tiny working sets, as ``interleaved`` does with repeated calls); the median over
    ``samples``."""
    f(1)
    t0 = time.perf_counter()
    f(1)
    one = max(time.perf_counter() - t0, 1e-8)
    reps = max(1, min(100_000, int(min_sample_s / one)))
    ts = []
    for _ in range(samples):
        f(rewarm)
        t = time.perf_counter()
        f(reps)
        ts.append((time.perf_counter() - t) / reps)
    ts.sort()
    return ts[len(ts) // 2] if len(ts) % 2 else 0.5 * (ts[len(ts) // 2 - 1] + ts[len(ts) // 2])


def accept(t: Timing, min_gain: float = MIN_GAIN) -> tuple[bool, str]:
    """Accept only a gain >= min_gain whose 95 % CI lies entirely above 1.0."""
    if t.ci_low <= 1.0:
        return False, f"no significant gain: {t.gain:.3f} (95% CI [{t.ci_low:.3f}, {t.ci_high:.3f}] not above 1)"
    if t.gain < min_gain:
        return False, f"gain {t.gain:.3f} below the {min_gain:.2f} threshold"
    return True, f"gain {t.gain:.3f} (95% CI [{t.ci_low:.3f}, {t.ci_high:.3f}])"


def ceiling_violation(spec: KernelSpec, shape: Mapping[str, int], dtype: str, seconds: float,
                      facts: DeviceFacts, margin: float = CEILING_MARGIN) -> str | None:
    """A time implying more than ``margin`` x the measured bandwidth or FLOP/s is a measurement or
    correctness artefact (e.g. skipped work), never a speedup."""
    if seconds <= 0:
        return "non-positive time"
    moved = spec.bytes_moved(shape, elem_bytes(dtype))
    bw = moved / seconds
    cap = facts.bandwidth_for(moved)
    if bw > margin * cap:
        return f"implies {bw / 1e9:.1f} GB/s, above {margin} x the measured {cap / 1e9:.1f} GB/s"
    fl = spec.flops(shape) / seconds
    if fl > margin * facts.peak_flops:
        return f"implies {fl / 1e9:.1f} GFLOP/s, above {margin} x the measured peak {facts.peak_flops / 1e9:.1f}"
    return None
