"""Swap optimizer on CPU: step time with optimizer states in (simulated) host memory against without.

Usage: python benchmarks/swap_optimizer.py [--steps 3] [--json out.json]

CPU has no separate device memory, so the host link is simulated: ``LatencyCopyEngine`` makes each copy
take bytes / bandwidth on its direction's lane (10, 25 and 50 GB/s injected). Two workloads:

* ``muon``: 16 Muon matrices of 256 x 256 (fp32), one per bucket: Newton-Schulz per bucket costs far more
  than its copy, the case the goal is about;
* ``adamw``: 16 AdamW tensors of 2M elements (16 MiB of state each), one per bucket: an elementwise update
  that is cheap next to its copy at low bandwidth, where the transfer cannot be hidden.

Each step runs a backward first (a small GEMM chain, and the parameters' gradients, which are fixed),
then the optimizer step. Per workload and bandwidth: optimizer step time without swap and with it (median
of ``--steps``), their ratio, the overlap ratio over the measured steps (hidden / total copy time),
exposed seconds per step with the first copy-ins started at the backward's first gradient (the default)
and without that prefetch (``exposed_s_no_prefetch``: the step then waits for its first copy-in), the
compute per bucket (no-swap step / buckets) against the copy time per bucket (in + out), and the device
bytes saved. Goal: overlap >= 0.9 and step time within 1.1x wherever compute per bucket >= copy per
bucket. The last write-back of a step runs on behind the next backward.
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


Workload = tuple[Callable[[], Optimizers], int, Callable[[], None]]


def _workload(kind: str) -> Workload:
    """(a builder of fresh optimizers over fixed parameters, bucket bytes, a backward that sets the fixed
    gradients after a GEMM chain's)."""
    torch.manual_seed(0)
    if kind == "muon":
        params = [torch.nn.Parameter(torch.randn(256, 256) * 0.02) for _ in range(16)]
        bucket = 256 * 256 * 4
    else:
        params = [torch.nn.Parameter(torch.randn(2 << 20) * 0.02) for _ in range(16)]
        bucket = 2 * (2 << 20) * 4
    grads = [torch.randn_like(p) * 1e-3 for p in params]
    init = [p.detach().clone() for p in params]
    x = torch.randn(256, 512)
    layers = [torch.nn.Parameter(torch.randn(512, 512) / 512**0.5) for _ in range(3)]

    def backward() -> None:
        for p in params:
            p.grad = None
        h = x
        for w in layers:
            h = torch.tanh(h @ w)
        # created last, so its gradients are accumulated first: the backward's GEMMs run after them
        fixed = sum((p * g).sum() for p, g in zip(params, grads, strict=True))
        torch.autograd.backward(h.square().mean() + fixed)

    def build() -> Optimizers:
        with torch.no_grad():
            for p, x in zip(params, init, strict=True):
                p.copy_(x)
        if kind == "muon":
            return Optimizers(Muon(params, lr=0.02), None)
        return Optimizers(None, torch.optim.AdamW(params, lr=1e-3))

    return build, bucket, backward


def _steps(opts: Optimizers, n: int, backward: Callable[[], None]) -> tuple[list[float], list[SwapStats]]:
    """Optimizer step times of ``n`` steps (each after a backward) after a first one (which creates the
    states), and their swap stats."""
    backward()
    opts.step()
    times, stats = [], []
    for _ in range(n):
        backward()
        t0 = time.perf_counter()
        opts.step()
        times.append(time.perf_counter() - t0)
        if isinstance(opts, SwapOptimizers) and opts.last is not None:
            stats.append(opts.last)
    return times, stats


def run(kind: str, steps: int) -> list[dict[str, Any]]:
    """One row per bandwidth for workload ``kind``."""
    build, bucket, backward = _workload(kind)
    rows = []
    for gbps in BANDWIDTHS:
        base = statistics.median(_steps(build(), steps, backward)[0])  # next to each swap run (a shared CPU drifts)
        exposed: dict[bool, float] = {}
        for prefetch in (False, True):
            engine = LatencyCopyEngine(gbps)
            swap = SwapOptimizers(build(), buffers=2, bucket_bytes=bucket, engine=engine, device_kind="cpu",
                                  prefetch=prefetch)
            times, stats = _steps(swap, steps, backward)
            swap.close()
            engine.close()
            total = summary(stats)
            exposed[prefetch] = float(total["exposedSecondsPerStep"])
        n = int(total["buckets"])
        t = statistics.median(times)
        copy = sum(s.copy_seconds for s in stats) / len(stats)
        rows.append({
            "workload": kind, "gbps": gbps, "buckets": n, "step_s_no_swap": round(base, 4), "step_s_swap": round(t, 4),
            "ratio": round(t / base, 3), "overlap": round(float(total["overlapRatio"]), 3),
            "exposed_s": round(exposed[True], 4), "exposed_s_no_prefetch": round(exposed[False], 4),
            "compute_per_bucket_ms": round(1e3 * base / n, 3), "copy_per_bucket_ms": round(1e3 * copy / n, 3),
            "device_bytes_saved": int(total["deviceBytesSaved"]),
        })
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
