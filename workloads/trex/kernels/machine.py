"""Measure the host once: cache sizes (sysfs, else lscpu), STREAM-style triad bandwidth per memory level
(a C kernel built by the cpu-c backend, timed the way kernels are timed: medians of samples that each follow
untimed passes, at one thread and at all cores, several working-set sizes per level), and fp32 GEMM peak
(torch.matmul). Cached as JSON."""

from __future__ import annotations

import json
import platform
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trex.fsio import atomic_write_bytes
from trex.kernels.facts import DeviceFacts, source_hash
from trex.kernels.profile import steady_median

if TYPE_CHECKING:
    from trex.kernels.backends.cpu_c import CpuCBackend

TRIAD_SRC = r"""
#include <stdint.h>
#include <omp.h>
/* a = b + s * c over n floats, `reps` times; one parallel region so fork/join is paid once, and each
   thread streams its own contiguous share (no per-pass barrier: the passes are independent). */
void trex_kernel(void **p, const int64_t *d, const double *s) {
  float *a = p[0]; const float *b = p[1], *c = p[2];
  const int64_t n = d[0], reps = d[1], threads = d[2]; const float sc = (float)s[0];
  #pragma omp parallel num_threads(threads) if(threads > 1)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    for (int64_t r = 0; r < reps; ++r) {
      #pragma omp simd
      for (int64_t i = lo; i < hi; ++i) a[i] = b[i] + sc * c[i];
      __asm__ __volatile__("" ::: "memory");
    }
  }
}
"""


FMA_SRC = r"""
#include <stdint.h>
#include <omp.h>
/* 8 independent 16-wide FMA chains per thread: the core's fp32 FMA throughput (2 FLOPs per lane). */
void trex_kernel(void **p, const int64_t *d, const double *s) {
  float *out = p[0]; const int64_t iters = d[0], threads = d[1]; (void)s;
  #pragma omp parallel num_threads(threads)
  {
    float a[8][16];
    for (int j = 0; j < 8; ++j) for (int l = 0; l < 16; ++l) a[j][l] = (float)(j + l) * 1e-3f;
    for (int64_t it = 0; it < iters; ++it)
      for (int j = 0; j < 8; ++j)
        #pragma omp simd
        for (int l = 0; l < 16; ++l) a[j][l] = a[j][l] * 0.999999f + 1e-6f;
    float acc = 0.0f;
    for (int j = 0; j < 8; ++j) for (int l = 0; l < 16; ++l) acc += a[j][l];
    out[omp_get_thread_num()] = acc;
  }
}
"""


def cache_sizes() -> dict[str, int]:
    """Data/unified cache capacity per level in bytes: L1 (data), L2, L3."""
    out: dict[str, int] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")) if base.exists() else []:
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        m = re.match(r"(\d+)([KMG]?)", size)
        if m:
            mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]
            out[f"L{level}"] = int(m.group(1)) * mult
    if not out:
        try:
            text = subprocess.run(["lscpu", "-B"], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            text = ""
        for key, name in (("L1d cache", "L1"), ("L2 cache", "L2"), ("L3 cache", "L3")):
            m = re.search(rf"^{key}:\s+(\d+)", text, re.M)
            if m:
                out[name] = int(m.group(1))
    return out or {"L1": 32 << 10, "L2": 1 << 20, "L3": 32 << 20}


def triad_runner(backend: CpuCBackend, n: int, threads: int) -> Callable[[int], None]:
    """``run(reps)``: ``reps`` triad passes over n floats on ``threads`` threads in one call (one parallel
    region; the arrays are allocated once and kept alive by the closure)."""
    import cffi
    import torch

    so = backend.build(TRIAD_SRC, source_hash(TRIAD_SRC))
    ffi = cffi.FFI()
    ffi.cdef("void trex_kernel(void **p, const int64_t *d, const double *s);")
    lib = ffi.dlopen(str(so))
    a, b, c = torch.zeros(n), torch.rand(n), torch.rand(n)
    ptrs = ffi.new("void *[]", [ffi.cast("void *", t.data_ptr()) for t in (a, b, c)])
    sc = ffi.new("double[]", [0.5])
    keep = (a, b, c, ptrs, sc)

    def run(reps: int) -> None:
        lib.trex_kernel(keep[3], ffi.new("int64_t[]", [n, reps, threads]), keep[4])
    return run


def triad_bandwidth(backend: CpuCBackend, n: int, threads: int, samples: int = 31) -> float:
    """Median bandwidth (B/s, 12 compulsory bytes per element, as the suite counts bytes) of the triad over
    n floats on ``threads`` threads, timed as kernels are (``profile.steady_median``): each sample follows
    untimed passes, so the arrays are as resident as their size allows, exactly like a kernel timed with
    ``interleaved(..., rewarm=REWARM_CALLS)``."""
    return 12.0 * n / steady_median(triad_runner(backend, n, threads), samples=samples)


def _fma_peak(backend: CpuCBackend, threads: int) -> float:
    """FLOP/s of the FMA-throughput kernel on ``threads`` threads (best of 5)."""
    import cffi
    import torch

    so = backend.build(FMA_SRC, source_hash(FMA_SRC))
    ffi = cffi.FFI()
    ffi.cdef("void trex_kernel(void **p, const int64_t *d, const double *s);")
    lib = ffi.dlopen(str(so))
    out = torch.zeros(max(threads, 1) * 2)
    ptrs = ffi.new("void *[]", [ffi.cast("void *", out.data_ptr())])
    iters = 2_000_000
    dims = ffi.new("int64_t[]", [iters, threads])
    sc = ffi.new("double[]", [0.0])
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        lib.trex_kernel(ptrs, dims, sc)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * 8 * 16 * iters * threads / best


def _gemm_peak(threads: int) -> float:
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = 512
        a, b = torch.rand(n, n), torch.rand(n, n)
        torch.matmul(a, b)
        best = float("inf")
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(4):
                torch.matmul(a, b)
            best = min(best, (time.perf_counter() - t0) / 4)
        return 2.0 * n ** 3 / best
    finally:
        torch.set_num_threads(old)


def cpu_model() -> str:
    """CPU model name (for the cache key and the report)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


LEVEL_FILL = 0.5
"""A level's single figure (``level_bandwidth``) is the triad over this fraction of its capacity."""
CURVE_FILLS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75)
"""Fractions of each level's capacity at which the triad curve is measured (sizes inside the previous
level are skipped): bandwidth falls with the working set inside one level (a victim L3 serves 4 MiB at
about 1.5x the rate it serves 16 MiB), so a kernel is compared with the curve at its own size."""
DRAM_FILL = 4.0
"""DRAM is measured over this multiple of the largest cache (at least 96 MiB)."""


def curve_sizes(caches: dict[str, int]) -> list[int]:
    """Working-set bytes (multiples of 12 bytes = one triad element) of the measured triad curve."""
    out: list[int] = []
    prev = 0
    for cap in caches.values():
        out += [int(cap * f) // 12 * 12 for f in CURVE_FILLS if cap * f > prev]
        prev = cap
    out.append(max(int(max(caches.values()) * DRAM_FILL), 96 << 20) // 12 * 12)
    return sorted(set(out))


def measure(backend: CpuCBackend) -> DeviceFacts:
    """Run the measurements (a few seconds).

    The bandwidth references are ``triad_bandwidth`` curves over ``curve_sizes`` at one thread
    (``triad_curve_1t``) and at all cores (``triad_curve``): medians of single-pass samples, each after
    untimed passes. Kernels are timed the same way (``interleaved(..., rewarm=REWARM_CALLS)``), so
    achieved bytes / time over the curve at the kernel's working set compares like with like. The
    per-level figures are the curve at LEVEL_FILL of each capacity.
    """
    caches = cache_sizes()
    cores = backend.cores
    sizes = curve_sizes(caches)
    c1 = {sz: triad_bandwidth(backend, sz // 12, 1) for sz in sizes}
    # all cores, never below one thread: on a shared host a descheduled second thread can stall a whole pass,
    # and the all-core figure must not fall under what one of its threads achieves alone
    cn = {sz: max(c1[sz], triad_bandwidth(backend, sz // 12, cores)) for sz in sizes} if cores > 1 else dict(c1)
    probe = DeviceFacts(name="", peak_flops=0.0, bandwidth=0.0, caches=caches, triad_curve=cn, triad_curve_1t=c1)
    single: dict[str, float] = {}
    levels: dict[str, float] = {}
    for level, cap in caches.items():
        single[level] = probe.bandwidth_at(cap * LEVEL_FILL, 1)
        multi = probe.bandwidth_at(cap * LEVEL_FILL * (cores if level in ("L1", "L2") else 1), cores)
        levels[level] = max(single[level], multi)
    single["DRAM"] = c1[sizes[-1]]
    dram = cn[sizes[-1]]
    return DeviceFacts(name=f"cpu:{cpu_model()} x{cores}", peak_flops=max(_gemm_peak(cores), _fma_peak(backend, 1) * cores), bandwidth=dram,
                       caches=caches, level_bandwidth=levels, cores=cores, source="measured",
                       level_bandwidth_1t=single, triad_curve=cn, triad_curve_1t=c1)


def facts_to_json(f: DeviceFacts) -> dict[str, Any]:
    """JSON form of DeviceFacts."""
    return {"name": f.name, "peak_flops": f.peak_flops, "bandwidth": f.bandwidth, "caches": f.caches,
            "level_bandwidth": f.level_bandwidth, "cores": f.cores, "source": f.source,
            "level_bandwidth_1t": f.level_bandwidth_1t, "triad_curve": {str(k): v for k, v in f.triad_curve.items()},
            "triad_curve_1t": {str(k): v for k, v in f.triad_curve_1t.items()}}


def facts_from_json(d: dict[str, Any]) -> DeviceFacts:
    """Inverse of facts_to_json."""
    return DeviceFacts(name=d["name"], peak_flops=float(d["peak_flops"]), bandwidth=float(d["bandwidth"]),
                       caches={k: int(v) for k, v in d["caches"].items()},
                       level_bandwidth={k: float(v) for k, v in d.get("level_bandwidth", {}).items()},
                       cores=int(d.get("cores", 1)), source=d.get("source", "measured"),
                       level_bandwidth_1t={k: float(v) for k, v in d.get("level_bandwidth_1t", {}).items()},
                       triad_curve={int(k): float(v) for k, v in d.get("triad_curve", {}).items()},
                       triad_curve_1t={int(k): float(v) for k, v in d.get("triad_curve_1t", {}).items()})


def measure_cached(cache_dir: str | Path, backend: CpuCBackend, refresh: bool = False) -> DeviceFacts:
    """Measured facts from <cache_dir>/machine-<key>.json, measuring (and writing atomically) when absent."""
    key = source_hash(f"{cpu_model()}|{backend.cores}|v4")[:12]
    path = Path(cache_dir) / f"machine-{key}.json"
    if path.exists() and not refresh:
        return facts_from_json(json.loads(path.read_text(encoding="utf-8")))
    facts = measure(backend)
    atomic_write_bytes(path, json.dumps({**facts_to_json(facts), "measured_at": time.time()}, indent=1).encode())
    return facts
