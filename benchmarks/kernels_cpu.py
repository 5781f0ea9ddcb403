"""Tuned cpu-c suite against eager PyTorch and torch.compile (default mode) on this CPU.

Runs a modest `trex kernels tune` (or re-times the registry of a previous run with --from DIR) with the
same shapes and threads for every side, then prints per-kernel medians, the geometric-mean speedups,
KernelBench's fast_1 / fast_1.5, and memory-bound kernels' achieved fraction of the measured bandwidth.
Timings on a shared host are noisy; every figure is a median of >= 30 interleaved samples.

Bandwidth is reported against two references, both real measured STREAM-triad bandwidths at the same thread
count, and every side is timed the same way: a median of >= 30 samples, each sample preceded by untimed calls
of the same side (``profile.REWARM_CALLS``), so no side is timed on a cache the other side's temporaries left
(eager PyTorch's temporaries used to evict the kernel's inputs from L3, the triad was a hot best-of).

BW(level): compulsory bytes / tuned median over the machine facts' single-thread triad curve at the kernel's
working set, inside the cache level holding it (``DeviceFacts.bandwidth_at``; measured once per machine by
``machine.measure`` at several sizes per level with the same rewarm-and-median protocol, interpolated in
log-size within the level). BW(triad): the like-for-like figure, a triad over the kernel's own compulsory
byte count timed interleaved (ABBA) with the tuned kernel by the profiler, same rewarm, medians on both
sides. BW(DRAM) divides by the DRAM triad (values above 1 mean the data lives in a cache). The goal is
>= 0.60 of measured bandwidth for memory-bound kernels: those whose arithmetic intensity is below the ridge
point at the benchmark's thread count (``roofline.classify(..., threads=...)``), short ones included.

Spread: after the table, the registry is re-timed in ``--processes`` (default 3) separate Python processes
(fresh allocator, fresh torch.compile, a new time slice on a shared host), and the per-kernel and geomean
speedups are printed as min / median / max over them, so a figure that moves from 3.7x to 1.9x between runs
shows as such.

The real-hardware skills comparison lives in benchmarks/kernels_skills.py.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _geo(xs: list[float]) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def retime(src: Path, samples: int, threads: int) -> list[dict[str, Any]]:
    """Re-time the registry of a previous run (gate re-checked) against eager and torch.compile."""
    from trex.kernels import registry
    from trex.kernels.backends.cpu_c import CpuCBackend
    from trex.kernels.harness import KernelEvaluator, baselines
    from trex.kernels.roofline import achieved_bandwidth_fraction, classify
    from trex.kernels.suite import get
    from trex.kernels.suite.base import elem_bytes

    reg = registry.load(src / "registry.json")
    be = CpuCBackend()
    facts = be.facts()
    out = []
    for kernel, buckets in reg["kernels"].items():
        for by_dtype in buckets.values():
            for dtype, e in by_dtype.items():
                spec, shape = get(kernel), e["shape"]
                ev = KernelEvaluator(spec, shape, dtype, be, facts, samples=samples)
                if ev.gate(e["params"]):
                    out.append({"kernel": kernel, "dtype": dtype, "correct": False})
                    continue
                bl = baselines(ev, e["params"], samples=samples, threads=threads)
                out.append({"kernel": kernel, "dtype": dtype, "correct": True, "shape": shape, "params": e["params"],
                            "regime": classify(spec, shape, dtype, facts).regime, "tuned_s": bl.tuned_s,
                            "eager_s": bl.eager_s, "compiled_s": bl.compiled_s, "speedup_eager": bl.eager_speedup,
                            "speedup_compile": bl.compiled_speedup, "compile_time_s": bl.compile_time_s,
                            "bandwidth_fraction": achieved_bandwidth_fraction(spec, shape, dtype, facts, bl.tuned_s,
                                                                              threads),
                            "dram_fraction": spec.bytes_moved(shape, elem_bytes(dtype)) / bl.tuned_s
                            / facts.bandwidth_for(float("inf"), threads),
                            "level_bw": facts.bandwidth_at(spec.bytes_moved(shape, elem_bytes(dtype)), threads)})
    return out


def triad_fraction(kernel: str, dtype: str, shape: dict[str, int], params: dict[str, int], threads: int,
                   samples: int) -> tuple[float, float]:
    """Like-for-like bandwidth reference: the STREAM triad over the kernel's own compulsory byte count, with
    the same thread count, timed interleaved (ABBA) with the tuned kernel by the profiler, medians on both
    sides, each sample after REWARM_CALLS untimed calls of its own side. Returns (triad B/s, kernel's
    achieved fraction of it)."""
    import cffi
    import torch
    from trex.kernels.backends.base import source_hash
    from trex.kernels.backends.cpu_c import CpuCBackend
    from trex.kernels.harness import KernelEvaluator
    from trex.kernels.machine import TRIAD_SRC
    from trex.kernels.profile import REWARM_CALLS, interleaved
    from trex.kernels.suite import get
    from trex.kernels.suite.base import elem_bytes

    be = CpuCBackend()
    spec = get(kernel)
    moved = spec.bytes_moved(shape, elem_bytes(dtype))
    n = max(1024, int(moved / 12))
    ffi = cffi.FFI()
    ffi.cdef("void trex_kernel(void **p, const int64_t *d, const double *s);")
    lib = ffi.dlopen(str(be.build(TRIAD_SRC, source_hash(TRIAD_SRC))))
    a, b, c = torch.zeros(n), torch.rand(n), torch.rand(n)
    ptrs = ffi.new("void *[]", [ffi.cast("void *", t.data_ptr()) for t in (a, b, c)])
    dims = ffi.new("int64_t[]", [n, 1, max(1, threads or be.cores)])
    sc = ffi.new("double[]", [0.5])

    def triad() -> None:
        lib.trex_kernel(ptrs, dims, sc)
    launch = KernelEvaluator(spec, shape, dtype, be, be.facts(), samples=samples).launcher(params)
    t = interleaved(launch, triad, samples=samples, rewarm=REWARM_CALLS)
    triad_bw = 12.0 * n / t.median_base
    return triad_bw, moved / t.median_cand / triad_bw


def spread(src: Path, processes: int, samples: int, threads: int) -> None:
    """Re-time the registry in ``processes`` separate processes, one after another; print min/median/max."""
    import statistics
    import subprocess

    runs: list[list[dict[str, Any]]] = []
    for i in range(processes):
        dest = Path(tempfile.mkdtemp(prefix="trex-kernels-spread-")) / f"run{i}.json"
        subprocess.run([sys.executable, __file__, "--from", str(src), "--samples", str(samples), "--threads",
                        str(threads), "--json", str(dest)], check=True)
        runs.append(json.loads(dest.read_text(encoding="utf-8")))
    print(f"\nspread over {processes} separate processes (min / median / max):")
    keys = sorted({(r["kernel"], r["dtype"]) for run in runs for r in run})
    for base in ("speedup_eager", "speedup_compile"):
        for kernel, dtype in keys:
            vals = [r[base] for run in runs for r in run
                    if (r["kernel"], r["dtype"]) == (kernel, dtype) and r["correct"] and r.get(base)]
            if vals:
                print(f"  {kernel:18s} {dtype:5s} {base:15s} {min(vals):6.2f} {statistics.median(vals):6.2f} "
                      f"{max(vals):6.2f}")
        geos = [_geo([r[base] for r in run if r["correct"] and r.get(base)]) for run in runs]
        print(f"  geomean {base}: {min(geos):.2f} / {statistics.median(geos):.2f} / {max(geos):.2f}"
              f" (max/min {max(geos) / min(geos):.2f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--from", dest="src", help="output directory of a previous `trex kernels tune` to re-time")
    ap.add_argument("--out", help="output directory for the tuning run (default: a temporary directory)")
    ap.add_argument("--trials-per-kernel", type=int, default=10)
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1,
                    help="threads for every side (default 1: the 2 cores are shared, so a second thread mostly "
                         "measures scheduler latency; 0 = all cores)")
    ap.add_argument("--kernels", default="", help="comma-separated subset")
    ap.add_argument("--processes", type=int, default=3,
                    help="separate processes re-timing the registry for the spread (0 = none)")
    ap.add_argument("--json", help="write the re-timed rows here and stop (what each spread process does)")
    args = ap.parse_args(argv)
    if args.json:
        rows = retime(Path(args.src), args.samples, args.threads)
        Path(args.json).write_text(json.dumps(rows), encoding="utf-8")
        return 0
    t0 = time.monotonic()
    from trex.kernels.roofline import classify
    from trex.kernels.suite import get

    if args.src:
        from trex.kernels.backends.cpu_c import CpuCBackend

        rows = retime(Path(args.src), args.samples, args.threads)
        facts = CpuCBackend().facts()
    else:
        from trex.config_base import load_section
        from trex.kernels.config import KernelTuneConfig
        from trex.kernels.machine import facts_from_json
        from trex.kernels.suite import SUITE
        from trex.kernels.suite.base import elem_bytes
        from trex.kernels.tune import run

        names = [k for k in args.kernels.split(",") if k] or list(SUITE)
        out = Path(args.out or tempfile.mkdtemp(prefix="trex-kernels-bench-"))
        cfg = load_section(KernelTuneConfig, {
            "suite": "none", "kernels": names, "output": str(out), "threads": args.threads,
            "budget": {"trials": args.trials_per_kernel * len(names), "seconds": 3600.0, "samples": args.samples}})
        run(cfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        data = json.loads((out / "results.json").read_text())
        facts = facts_from_json(data["facts"])
        bw = facts.bandwidth_for(float("inf"), args.threads)
        rows = []
        for r in data["results"]:
            spec = SUITE[r["kernel"]]
            moved = spec.bytes_moved(r["shape"], elem_bytes(r["dtype"]))
            r["correct"] = True
            r["dram_fraction"] = moved / r["tuned_s"] / bw
            r["level_bw"] = facts.bandwidth_at(moved, int(r["params"].get("THREADS", args.threads)))
            rows.append(r)
        print(f"results in {out}", file=sys.stderr)
    for r in rows:
        if r["correct"]:
            # memory-bound at the benchmark's thread count: intensity below the ridge point of that many cores
            # (their share of the peak over the triad at the working set), whatever the whole-device label
            roof = classify(get(r["kernel"]), r["shape"], r["dtype"], facts, threads=args.threads or facts.cores)
            r["regime"] = "memory" if roof.intensity < roof.ridge else roof.regime
    for r in rows:
        if r["correct"] and r["regime"] == "memory":
            r["triad_bw"], r["triad_fraction"] = triad_fraction(r["kernel"], r["dtype"], r["shape"], r["params"],
                                                                args.threads, args.samples)
    print(f"{'kernel':18s} {'dtype':5s} {'bound':8s} {'tuned ms':>9s} {'eager ms':>9s} {'compile ms':>10s} "
          f"{'x eager':>8s} {'x compile':>9s} {'BW(level)':>9s} {'BW(DRAM)':>8s} {'BW(triad)':>9s}")
    for r in rows:
        if not r["correct"]:
            print(f"{r['kernel']:18s} {r['dtype']:5s} INCORRECT")
            continue
        comp = f"{r['compiled_s'] * 1e3:10.3f}" if r.get("compiled_s") else f"{'-':>10s}"
        xc = f"{r['speedup_compile']:9.2f}" if r.get("speedup_compile") else f"{'-':>9s}"
        print(f"{r['kernel']:18s} {r['dtype']:5s} {r['regime']:8s} {r['tuned_s'] * 1e3:9.3f} {r['eager_s'] * 1e3:9.3f} "
              f"{comp} {r['speedup_eager']:8.2f} {xc} {r['bandwidth_fraction']:9.2f} {r['dram_fraction']:8.2f}"
              + (f" {r['triad_fraction']:9.2f}" if "triad_fraction" in r else ""))
    ok = [r for r in rows if r["correct"]]
    ge = _geo([r["speedup_eager"] for r in ok])
    gc = _geo([r["speedup_compile"] for r in ok if r.get("speedup_compile")])
    fast1 = sum(r["speedup_eager"] > 1.0 for r in ok) / max(1, len(rows))
    fast15 = sum(r["speedup_eager"] > 1.5 for r in ok) / max(1, len(rows))
    fast1c = sum((r.get("speedup_compile") or 0) > 1.0 for r in ok) / max(1, len(rows))
    mem = [r for r in ok if r["regime"] == "memory"]
    print(f"\ngeomean speedup: {ge:.2f}x over eager (goal 2.0), {gc:.2f}x over torch.compile (goal 1.2)")
    print(f"fast_1 = {fast1:.2f}, fast_1.5 = {fast15:.2f} (vs eager); fast_1 vs torch.compile = {fast1c:.2f}")
    if mem:
        print("memory-bound kernels, achieved / measured triad bandwidth at their working set in the level holding "
              "it (machine facts, same threads, rewarm + medians): " +
              ", ".join(f"{r['kernel']}/{r['dtype']} {r['bandwidth_fraction']:.2f} of {r['level_bw'] / 1e9:.0f} GB/s"
                        for r in mem) + " (goal >= 0.60)")
        print("like for like, against a same-size, same-thread-count triad timed interleaved with the kernel "
              "(rewarm + medians): " + ", ".join(f"{r['kernel']}/{r['dtype']} {r['triad_fraction']:.2f} of "
                                        f"{r['triad_bw'] / 1e9:.0f} GB/s" for r in mem) + " (goal >= 0.60)")
    if args.processes > 0:
        spread(Path(args.src) if args.src else out, args.processes, args.samples, args.threads)
    print(f"wall time {time.monotonic() - t0:.0f} s; shared 2-core host: timings are noisy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
