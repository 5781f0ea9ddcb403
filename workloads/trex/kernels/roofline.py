"""Roofline classification and the analytic cost model that ranks configurations before measuring them.

regime: memory-bound when arithmetic intensity is below the ridge point (peak / bandwidth of the level
that holds the working set), compute-bound above it, overhead-bound when the roofline time is below a
few launch overheads. ``predict`` refines the bound with the effect of each cpu-c parameter.

Fraction of measured bandwidth (``achieved_bandwidth_fraction``): compulsory bytes / median kernel time,
over the STREAM triad measured at the same working-set size in the same cache level with the same thread
count, both timed with the same protocol (medians; every sample after untimed calls of the same side).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from trex.kernels.facts import DeviceFacts
from trex.kernels.suite.base import KernelSpec, elem_bytes

Regime = Literal["memory", "compute", "overhead"]
LAUNCH_S = 3e-6
FORK_JOIN_S = 8e-6
OVERLAP = 0.25
SCALAR_EFF = 0.25
"""Fraction of the vector peak a scalar loop reaches."""
# transcendental evaluations per element (libm expf costs ~10x a vectorised polynomial)
EXP_PER_ELEM = {"elementwise": 1.0, "loss": 1.5}


def transcendentals(spec: KernelSpec, shape: Mapping[str, int], n_elem: float) -> float:
    """Transcendental evaluations of one call: the router's score needs one per (token, expert) for the
    sigmoid and two for sqrt-softplus (an exp and a log1p); other kernels ``EXP_PER_ELEM`` per element moved."""
    if spec.kclass == "routing":
        return float(shape["tokens"] * shape["experts"] * (1 if shape.get("score", 2) == 1 else 2))
    return EXP_PER_ELEM.get(spec.kclass, 0.0) * n_elem


def scalar_flops(spec: KernelSpec, shape: Mapping[str, int]) -> float:
    """FLOPs that stay scalar whatever the vector width: the router's top-k insertion into a sorted k-list
    (a compare per expert and a shift per insertion, with data-dependent branches)."""
    if spec.kclass == "routing":
        return 2.0 * shape["tokens"] * shape["experts"] * shape["k"]
    return 0.0


def double_flops(spec: KernelSpec, shape: Mapping[str, int], fl: float) -> float:
    """FLOPs that ACC_DOUBLE moves to double precision: all of them, except in the mHC pre-projection with
    four streams, whose 4 x 16 projection accumulators stay float in registers (only the mean square and
    Sinkhorn accumulate in double)."""
    if spec.kclass == "mixing" and shape["streams"] ** 2 == 16:
        f = shape["streams"] * shape["hidden"]
        return 4.0 * shape["tokens"] * f + 4.0 * shape["tokens"] * shape["iters"] * shape["streams"] ** 2
    return fl


def vector_width(spec: KernelSpec, shape: Mapping[str, int], vec: int) -> int:
    """The simd length the hot loop can use: the mHC projection's inner loop runs streams^2 iterations, so a
    longer simdlen than that (rounded down to a VEC value, at least 8) adds nothing."""
    if spec.kclass == "mixing" and vec:
        trip = max(8, shape["streams"] ** 2)
        return min(vec, max(v for v in (8, 16, 32, 64) if v <= trip))
    return vec


def unfused_flops(spec: KernelSpec, shape: Mapping[str, int]) -> float:
    """Extra FLOPs of FUSED 0: the mHC projection scales every feature by rstd (one multiply per element)
    instead of scaling the n*n logits once."""
    if spec.kclass == "mixing":
        return float(shape["tokens"] * shape["streams"] * shape["hidden"])
    return 0.0


def compute_seconds(spec: KernelSpec, shape: Mapping[str, int], fl: float, core_peak: float, eff: float,
                    acc_double: bool) -> float:
    """Arithmetic seconds on one core: vector FLOPs at ``eff`` of the peak (double accumulation at 60 % of
    that on the FLOPs it affects), the scalar ones at SCALAR_EFF."""
    sfl = scalar_flops(spec, shape)
    dfl = min(double_flops(spec, shape, fl), fl - sfl) if acc_double else 0.0
    return (fl - sfl - dfl) / (core_peak * eff) + dfl / (core_peak * eff * 0.6) + sfl / (core_peak * SCALAR_EFF)


@dataclass(frozen=True)
class Roofline:
    """Bound times and the regime of one (kernel, shape, dtype) on one device."""

    regime: Regime
    intensity: float
    ridge: float
    t_memory: float
    t_compute: float

    @property
    def t_bound(self) -> float:
        """Roofline lower bound (s)."""
        return max(self.t_memory, self.t_compute)


def classify(spec: KernelSpec, shape: Mapping[str, int], dtype: str, facts: DeviceFacts,
             overhead_s: float = 4 * FORK_JOIN_S, threads: int = 0) -> Roofline:
    """Roofline of one problem: on the whole device (``threads`` 0), or on ``threads`` cores, whose peak is
    that share of the device's and whose bandwidth is the measured triad at the working set for that thread
    count (``DeviceFacts.bandwidth_at``)."""
    moved = spec.bytes_moved(shape, elem_bytes(dtype))
    fl = spec.flops(shape)
    if threads:
        bw = facts.bandwidth_at(moved, threads)
        peak = facts.peak_flops * min(threads, max(1, facts.cores)) / max(1, facts.cores)
    else:
        bw, peak = facts.bandwidth_for(moved), facts.peak_flops
    t_mem, t_cmp = moved / bw, fl / peak
    ai, ridge = fl / max(moved, 1.0), peak / bw
    regime: Regime = "overhead" if max(t_mem, t_cmp) < overhead_s else ("memory" if ai < ridge else "compute")
    return Roofline(regime, ai, ridge, t_mem, t_cmp)


def fraction_of_roofline(spec: KernelSpec, shape: Mapping[str, int], dtype: str, facts: DeviceFacts,
                         seconds: float) -> float:
    """Roofline bound over measured time (1.0 = at the roof)."""
    return classify(spec, shape, dtype, facts).t_bound / seconds


def achieved_bandwidth_fraction(spec: KernelSpec, shape: Mapping[str, int], dtype: str, facts: DeviceFacts,
                                seconds: float, threads: int = 0) -> float:
    """Achieved over measured bandwidth: compulsory bytes (``spec.bytes_moved``) / ``seconds``, over the
    STREAM triad bandwidth measured for that working set in the level holding it, at the same thread
    count (``DeviceFacts.bandwidth_at``: the single-thread curve when ``threads`` is 1).

    Both sides are measured the same way, which is what makes the fraction meaningful: ``seconds`` is a
    median of samples that each follow untimed calls of the kernel (``interleaved(..., rewarm=REWARM_CALLS)``),
    and the reference is a median of triad samples that each follow untimed passes
    (``machine.triad_bandwidth``), bytes counted the same way on both sides (reads + writes, no
    write-allocate traffic). The curve is measured at several sizes per level because bandwidth falls with
    the working set inside one level; between measured sizes it is interpolated in log-size, and it is never
    taken from a neighbouring level."""
    moved = spec.bytes_moved(shape, elem_bytes(dtype))
    return moved / seconds / facts.bandwidth_at(moved, threads)


def predict(spec: KernelSpec, shape: Mapping[str, int], dtype: str, params: Mapping[str, int],
            facts: DeviceFacts) -> float:
    """Predicted seconds of a cpu-c configuration (roofline terms scaled by parameter effects)."""
    e = elem_bytes(dtype)
    moved = spec.bytes_moved(shape, e)
    fl = spec.flops(shape)
    cores = max(1, facts.cores)
    th = min(int(params.get("THREADS", 1)), cores)
    per_core_peak = facts.peak_flops / cores
    vec = vector_width(spec, shape, int(params.get("VEC", 0)))
    # scalar loops reach ~1/4 of the vector peak; simdlen 16 uses full 512-bit registers
    eff = {0: 0.25 + 0.05 * min(int(params.get("UNROLL", 1)), 4), 8: 0.8, 16: 1.0, 32: 1.15, 64: 1.2}.get(vec, 0.5)
    t_cmp = compute_seconds(spec, shape, fl, per_core_peak * th, eff, bool(params.get("ACC_DOUBLE", 0)))
    if not params.get("FUSED", 1):
        t_cmp += unfused_flops(spec, shape) / (per_core_peak * th * eff)
    n_elem = moved / e
    exp_cost = 1.2e-9 if not params.get("EXP_POLY", 0) else (0.15e-9 if vec else 0.6e-9)
    t_cmp += transcendentals(spec, shape, n_elem) * exp_cost / th
    passes = 1.0
    if spec.kclass in ("loss", "mixing") and not params.get("FUSED", 1):
        row_bytes = moved / max(1, shape.get("rows", shape.get("tokens", 1)))
        passes = 1.0 if row_bytes <= facts.caches.get("L2", 1 << 20) / 2 else 2.0
    bw = facts.bandwidth_for(moved) * min(1.0, 0.6 + 0.4 * th / cores)
    t_mem = passes * moved / bw
    # imperfect overlap: the smaller term still shows through (keeps compute knobs visible when memory-bound)
    t = max(t_mem, t_cmp) + OVERLAP * min(t_mem, t_cmp) + LAUNCH_S + (FORK_JOIN_S if th > 1 else 0.0)
    if "BLOCK" in params:
        rows = shape.get("rows", 1)
        blocks = rows * -(-shape.get(spec.tile_dim, 1) // params["BLOCK"])
        t += blocks * 40e-9
        if spec.tile_bytes(shape, params["BLOCK"], e) > facts.caches.get("L1", 32 << 10):
            t += 0.1 * t_mem
    if "CHUNK" in params and th > 1:
        units = shape.get(spec.tile_dim, 1)
        chunks = -(-units // params["CHUNK"])
        imbalance = (-(-chunks // th) * th) / max(chunks, 1)
        t += (imbalance - 1.0) * max(t_mem, t_cmp)
    if spec.kclass == "gemm":
        mb, nb, kb = params["MB"], params["NB"], params["KB"]
        ws = 4.0 * (mb * kb + kb * nb + mb * nb)
        reuse = {0: 1.0, 1: 1.6, 2: 2.4, 3: 3.0}.get(int(params.get("ORDER", 0)), 1.0)
        fit = 1.0 if ws <= facts.caches.get("L1", 32 << 10) else (0.8 if ws <= facts.caches.get("L2", 1 << 20) else 0.5)
        width = min(1.0, nb / (16.0 if vec >= 16 else 8.0))
        t_g = fl / (per_core_peak * th * eff * reuse * fit * width)
        tiles = shape["experts"] + shape["tokens"] / mb * -(-shape["out"] // nb)
        t = max(t_mem, t_g) + OVERLAP * min(t_mem, t_g) + LAUNCH_S + (FORK_JOIN_S if th > 1 else 0.0) + tiles * 0.3e-6
    return t
