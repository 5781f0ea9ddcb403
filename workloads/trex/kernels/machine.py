"""Measure the host once: cache sizes (sysfs, else lscpu), STREAM-style triad bandwidth per memory level
(a C kernel built by the cpu-c backend), and fp32 GEMM peak (torch.matmul). Cached as JSON."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trex.kernels.backends.base import DeviceFacts, source_hash

if TYPE_CHECKING:
    from trex.kernels.backends.cpu_c import CpuCBackend

TRIAD_SRC = r"""
#include <stdint.h>
#include <omp.h>
/* a = b + s * c over n floats, `reps` times; one parallel region so fork/join is paid once. */
void trex_kernel(void **p, const int64_t *d, const double *s) {
  float *a = p[0]; const float *b = p[1], *c = p[2];
  const int64_t n = d[0], reps = d[1], threads = d[2]; const float sc = (float)s[0];
  #pragma omp parallel num_threads(threads)
  for (int64_t r = 0; r < reps; ++r) {
    #pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + sc * c[i];
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


def _triad(backend: CpuCBackend, n: int, threads: int, target_s: float = 0.02) -> float:
    """Best-of bandwidth (B/s, 12 bytes per element) of the triad over n floats."""
    import cffi
    import torch

    digest = source_hash(TRIAD_SRC)
    so = backend.build(TRIAD_SRC, digest)
    ffi = cffi.FFI()
    ffi.cdef("void trex_kernel(void **p, const int64_t *d, const double *s);")
    lib = ffi.dlopen(str(so))
    a, b, c = torch.zeros(n), torch.rand(n), torch.rand(n)
    ptrs = ffi.new("void *[]", [ffi.cast("void *", t.data_ptr()) for t in (a, b, c)])
    sc = ffi.new("double[]", [0.5])

    def run(reps: int) -> float:
        dims = ffi.new("int64_t[]", [n, reps, threads])
        t0 = time.perf_counter()
        lib.trex_kernel(ptrs, dims, sc)
        return time.perf_counter() - t0

    one = max(run(1), 1e-7)
    reps = max(1, int(target_s / one))
    best = min(run(reps) for _ in range(5)) / reps
    return 12.0 * n / best


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


def measure(backend: CpuCBackend) -> DeviceFacts:
    """Run the measurements (a few seconds)."""
    caches = cache_sizes()
    cores = backend.cores
    levels: dict[str, float] = {}
    single: dict[str, float] = {}
    for level, cap in caches.items():
        n = max(1024, int(cap * (0.5 if level != "L3" else 0.25) / 12))
        single[level] = _triad(backend, n, 1)
        # private levels scale with cores; the shared L3 and DRAM: the better of one thread and all threads
        levels[level] = single[level] * cores if level != "L3" else max(single[level], _triad(backend, n, cores))
    n = max(max(caches.values()) * 4 // 12, 8 << 20)
    single["DRAM"] = _triad(backend, n, 1, target_s=0.1)
    dram = max(single["DRAM"], _triad(backend, n, cores, target_s=0.1))
    return DeviceFacts(name=f"cpu:{cpu_model()} x{cores}", peak_flops=max(_gemm_peak(cores), _fma_peak(backend, 1) * cores), bandwidth=dram,
                       caches=caches, level_bandwidth=levels, cores=cores, source="measured",
                       level_bandwidth_1t=single)


def facts_to_json(f: DeviceFacts) -> dict[str, Any]:
    """JSON form of DeviceFacts."""
    return {"name": f.name, "peak_flops": f.peak_flops, "bandwidth": f.bandwidth, "caches": f.caches,
            "level_bandwidth": f.level_bandwidth, "cores": f.cores, "source": f.source,
            "level_bandwidth_1t": f.level_bandwidth_1t}


def facts_from_json(d: dict[str, Any]) -> DeviceFacts:
    """Inverse of facts_to_json."""
    return DeviceFacts(name=d["name"], peak_flops=float(d["peak_flops"]), bandwidth=float(d["bandwidth"]),
                       caches={k: int(v) for k, v in d["caches"].items()},
                       level_bandwidth={k: float(v) for k, v in d.get("level_bandwidth", {}).items()},
                       cores=int(d.get("cores", 1)), source=d.get("source", "measured"),
                       level_bandwidth_1t={k: float(v) for k, v in d.get("level_bandwidth_1t", {}).items()})


def measure_cached(cache_dir: str | Path, backend: CpuCBackend, refresh: bool = False) -> DeviceFacts:
    """Measured facts from <cache_dir>/machine-<key>.json, measuring (and writing atomically) when absent."""
    key = source_hash(f"{cpu_model()}|{backend.cores}|v2")[:12]
    path = Path(cache_dir) / f"machine-{key}.json"
    if path.exists() and not refresh:
        return facts_from_json(json.loads(path.read_text(encoding="utf-8")))
    facts = measure(backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**facts_to_json(facts), "measured_at": time.time()}, indent=1), encoding="utf-8")
    os.replace(tmp, path)
    return facts
