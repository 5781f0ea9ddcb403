"""Swap optimizer on CPU: step time with optimizer states in (simulated) host memory against without.

Usage: python benchmarks/swap_optimizer.py [--steps 3] [--json out.json]

CPU has no separate device memory, so the host link is simulated: ``LatencyCopyEngine`` makes each copy
take bytes / bandwidth on its direction's lane (10, 25 and 50 GB/s injected). Two workloads:

* ``muon``: 16 Muon matrices of 256 x 196..256 (fp32, 16 shapes: 16 Newton-Schulz batches), one per
  bucket: Newton-Schulz per bucket costs far more than its copy, the case the goal is about;
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
from dataclasses import dataclass, field
from typing import Any

import torch
from trex.runtime.copy_engine import LatencyCopyEngine
from trex.trainer.optim.build import Optimizers
from trex.trainer.optim.muon import Muon
from trex.trainer.optim.swap import SwapOptimizers, SwapStats, summary

BANDWIDTHS = (10.0, 25.0, 50.0)


@dataclass
class Variant:
    """One optimizer over its own copy of the workload's parameters, and the backward that sets their grads."""

    opts: Optimizers
    backward: Callable[[], None]
    times: list[float] = field(default_factory=list)
    stats: list[SwapStats] = field(default_factory=list)

    def step(self, timed: bool) -> None:
        """A backward, then a (timed) optimizer step."""
        self.backward()
        t0 = time.perf_counter()
        self.opts.step()
        if timed:
            self.times.append(time.perf_counter() - t0)
            if isinstance(self.opts, SwapOptimizers) and self.opts.last is not None:
                self.stats.append(self.opts.last)


def _workload(kind: str) -> tuple[Callable[[Callable[[Optimizers], Optimizers]], Variant], int]:
    """(a maker of a variant over fresh copies of the fixed parameters, wrapping its optimizers; bucket bytes)."""
    torch.manual_seed(0)
    if kind == "muon":
        # 16 shapes, so 16 Newton-Schulz batches: one bucket each (a bucket is whole batches)
        init = [torch.randn(256, 196 + 4 * i) * 0.02 for i in range(16)]
        bucket = 256 * 196 * 4
    else:
        init = [torch.randn(2 << 20) * 0.02 for _ in range(16)]
        bucket = 2 * (2 << 20) * 4
    grads = [torch.randn_like(x) * 1e-3 for x in init]
    x = torch.randn(256, 512)
    layers = [torch.randn(512, 512) / 512**0.5 for _ in range(3)]

    def make(wrap: Callable[[Optimizers], Optimizers]) -> Variant:
        params = [torch.nn.Parameter(v.clone()) for v in init]
        ws = [torch.nn.Parameter(w.clone()) for w in layers]

        def backward() -> None:
            for p in params + ws:
                p.grad = None
            h = x
            for w in ws:
                h = torch.tanh(h @ w)
            # created last, so its gradients are accumulated first: the backward's GEMMs run after them
            fixed = sum((p * g).sum() for p, g in zip(params, grads, strict=True))
            torch.autograd.backward(h.square().mean() + fixed)

        opts = (Optimizers(Muon(params, lr=0.02), None) if kind == "muon"
                else Optimizers(None, torch.optim.AdamW(params, lr=1e-3)))
        return Variant(wrap(opts), backward)

    return make, bucket


def run(kind: str, steps: int) -> list[dict[str, Any]]:
    """One row per bandwidth for workload ``kind``: no swap, swap without and with prefetch, their steps
    interleaved (a shared CPU's load drifts) after a first step each that creates the states."""
    make, bucket = _workload(kind)
    rows = []
    for gbps in BANDWIDTHS:
        engines = [LatencyCopyEngine(gbps) for _ in range(2)]
        base = make(lambda o: o)
        swaps = {prefetch: make(lambda o, e=e, pf=prefetch: SwapOptimizers(  # type: ignore[misc]
            o, buffers=2, bucket_bytes=bucket, engine=e, device_kind="cpu", prefetch=pf))
            for e, prefetch in zip(engines, (False, True), strict=True)}
        variants = [base, *swaps.values()]
        for i in range(steps + 1):
            for v in variants:
                v.step(timed=i > 0)
        for v in swaps.values():
            assert isinstance(v.opts, SwapOptimizers)
            v.opts.close()
        for e in engines:
            e.close()
        on = swaps[True]
        total = summary(on.stats)
        n = int(total["buckets"])
        t, t0 = statistics.median(on.times), statistics.median(base.times)
        copy = sum(s.copy_seconds for s in on.stats) / len(on.stats)
        rows.append({
            "workload": kind, "gbps": gbps, "buckets": n, "step_s_no_swap": round(t0, 4), "step_s_swap": round(t, 4),
            "ratio": round(t / t0, 3), "overlap": round(float(total["overlapRatio"]), 3),
            "exposed_s": round(float(total["exposedSecondsPerStep"]), 4),
            "exposed_s_no_prefetch": round(float(summary(swaps[False].stats)["exposedSecondsPerStep"]), 4),
            "compute_per_bucket_ms": round(1e3 * t0 / n, 3), "copy_per_bucket_ms": round(1e3 * copy / n, 3),
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
    met = [r for r in hidden if r["overlap"] >= 0.9 and r["ratio"] <= 1.1]
    overlap = [r for r in hidden if r["overlap"] >= 0.9]
    print(f"goal (overlap >= 0.9, step <= 1.1x where compute per bucket >= copy, {len(hidden)} of {len(rows)} rows): "
          f"met on {len(met)}, overlap alone on {len(overlap)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
