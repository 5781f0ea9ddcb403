"""Swap optimizer on CPU: step time with optimizer states in (simulated) host memory against without.

Usage: python benchmarks/swap_optimizer.py [--steps 3] [--json out.json]

CPU has no separate device memory, so the host link is simulated: ``LatencyCopyEngine`` makes each copy
take bytes / bandwidth on its direction's lane (10, 25 and 50 GB/s injected). Two workloads:

* ``muon``: 16 Muon matrices of 256 x 256 (fp32), one per bucket: Newton-Schulz per bucket costs far more
  than its copy, the case the goal is about;
* ``adamw``: 16 AdamW tensors of 2M elements (16 MiB of state each), one per bucket: an elementwise update
  that is cheap next to its copy at low bandwidth, where the transfer cannot be hidden.

Per workload and bandwidth: step time without swap and with it (median of ``--steps``), their ratio, the
overlap ratio over the measured steps (hidden / total copy time), exposed seconds per step, the compute per bucket (no-swap step
/ buckets) against the copy time per bucket (in + out), and the device bytes saved. Goal: overlap >= 0.9
and step time within 1.1x wherever compute per bucket >= copy per bucket. The first copy-in and the last
write-back of a step have nothing to hide behind, so with N buckets the overlap is at most about 1 - 1/N.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from trex.runtime.copy_engine import LatencyCopyEngine
from trex.trainer.optim.build import Optimizers
from trex.trainer.optim.muon import Muon
from trex.trainer.optim.swap import SwapOptimizers, SwapStats, summary

BANDWIDTHS = (10.0, 25.0, 50.0)


def _workload(kind: str) -> tuple[Callable[[], Optimizers], int]:
    """(a builder of fresh optimizers over fixed parameters and gradients, bucket bytes)."""
    torch.manual_seed(0)
    if kind == "muon":
        params = [torch.nn.Parameter(torch.randn(256, 256) * 0.02) for _ in range(16)]
        bucket = 256 * 256 * 4
    else:
        params = [torch.nn.Parameter(torch.randn(2 << 20) * 0.02) for _ in range(16)]
        bucket = 2 * (2 << 20) * 4
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    init = [p.detach().clone() for p in params]

    def build() -> Optimizers:
        with torch.no_grad():
            for p, x in zip(params, init, strict=True):
                p.copy_(x)
        if kind == "muon":
            return Optimizers(Muon(params, lr=0.02), None)
        return Optimizers(None, torch.optim.AdamW(params, lr=1e-3))

    return build, bucket


def _steps(opts: Optimizers, n: int) -> tuple[list[float], list[SwapStats]]:
    """Step times of ``n`` steps after a first one (which creates the states), and their swap stats."""
    opts.step()
    times, stats = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        opts.step()
        times.append(time.perf_counter() - t0)
        if isinstance(opts, SwapOptimizers) and opts.last is not None:
            stats.append(opts.last)
    if isinstance(opts, SwapOptimizers):
        opts.settle()
    return times, stats


def run(kind: str, steps: int) -> list[dict[str, Any]]:
    """One row per bandwidth for workload ``kind``."""
    build, bucket = _workload(kind)
    rows = []
    for gbps in BANDWIDTHS:
        base = statistics.median(_steps(build(), steps)[0])  # measured next to each swap run (a shared CPU drifts)
        engine = LatencyCopyEngine(gbps)
        swap = SwapOptimizers(build(), buffers=2, bucket_bytes=bucket, engine=engine, device_kind="cpu")
        times, stats = _steps(swap, steps)
        total = summary(stats)
        n = int(total["buckets"])
        t = statistics.median(times)
        copy = sum(s.copy_seconds for s in stats) / len(stats)
        rows.append({
            "workload": kind, "gbps": gbps, "buckets": n, "step_s_no_swap": round(base, 4), "step_s_swap": round(t, 4),
            "ratio": round(t / base, 3), "overlap": round(float(total["overlapRatio"]), 3),
            "exposed_s": round(float(total["exposedSecondsPerStep"]), 4),
            "compute_per_bucket_ms": round(1e3 * base / n, 3), "copy_per_bucket_ms": round(1e3 * copy / n, 3),
            "device_bytes_saved": int(total["deviceBytesSaved"]),
        })
        engine.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the table (and write it as JSON with --json)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [r for kind in ("muon", "adamw") for r in run(kind, args.steps)]
    cols = list(rows[0])
    print(" ".join(f"{c:>21}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]!s:>21}" for c in cols))
    hidden = [r for r in rows if r["compute_per_bucket_ms"] >= r["copy_per_bucket_ms"]]
    met = all(r["overlap"] >= 0.9 and r["ratio"] <= 1.1 for r in hidden)
    print(f"goal (overlap >= 0.9, step <= 1.1x where compute per bucket >= copy): "
          f"{'met' if met else 'missed'} on {len(hidden)} of {len(rows)} rows")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
