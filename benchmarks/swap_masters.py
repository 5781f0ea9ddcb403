"""Swap optimizer with fp32 masters in host memory: a bf16 model at dp2 (2 processes, gloo, CPU).

Usage: python benchmarks/swap_masters.py [--preset small-cpu] [--steps 6] [--bucket-mb 4] [--json out.json]

Three runs of the same job: swap off, swap with the optimizer states only in host memory (the masters left
on the device, as FSDP2 keeps them), and swap with the masters in host memory too (the default). Per run:
median step seconds over the steps after the first, and from the last step rank 0's host bytes (states and
masters), bucket buffer bytes, the masters' bf16 device copies and the device bytes saved (host bytes minus
buffers and bf16 copies; 0 when the buffers are the larger), the overlap ratio and the exposed seconds; and
whether the final parameters equal swap off's bit for bit. Then the memory plan's figures for the job at 2
ranks (params on the device, masters, device bytes saved). CPU is a simulation: the host copies and the
"device" are the same RAM, so the bytes are what a device would save and the times are not a device's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import trex.trainer.build as build_mod
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer
from trex.trainer.optim import swap
from trex.trainer.optim.swap import SwapOptimizers

RUNS = ("off", "states", "masters")


def _cfg(root: Path, preset: str, steps: int, bucket_mb: int, enabled: bool) -> TrainerConfig:
    return load_section(TrainerConfig, {
        "model": {"preset": preset, "dtype": "bf16"}, "maxSteps": steps,
        "data": {"seqLen": 64, "microBatchSize": 1, "globalBatchSize": 2},
        "optimizer": {"schedule": {"warmupSteps": 1}, "swap": {"enabled": enabled, "bucketMb": bucket_mb}},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(root / "ckpt"), "intervalSteps": 10**6, "exportHf": False},
    })


def _worker(rank: int, out: str, preset: str, steps: int, bucket_mb: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    original = build_mod.with_swap
    rows: dict[str, Any] = {}
    finals: dict[str, dict[str, torch.Tensor]] = {}
    try:
        for name in RUNS:
            # "states": the swap optimizer without the model, so it finds no masters to hold
            build_mod.with_swap = (lambda o, c, k, **kw: swap.with_swap(o, c, k)) if name == "states" else original
            root = Path(out) / name
            tr = Trainer(_cfg(root, preset, steps, bucket_mb, name != "off"), root, group=dist.group.WORLD,
                         measure_peak=False, log=lambda _m: None)
            times: list[float] = []
            tr.prepare()
            for _ in range(steps):
                t0 = time.perf_counter()
                tr.train_step()
                times.append(time.perf_counter() - t0)
            row: dict[str, Any] = {"run": name, "step_s": round(statistics.median(times[1:]), 4)}
            if isinstance(tr.opts, SwapOptimizers) and tr.opts.last is not None:
                s = tr.opts.last
                row |= {"host_bytes": s.host_bytes, "buffer_bytes": s.buffer_bytes, "bf16_copy_bytes": s.compute_bytes,
                        "device_bytes_saved": s.bytes_saved, "buckets": s.buckets,
                        "overlap": round(s.overlap_ratio, 3), "exposed_s": round(s.exposed_seconds, 4)}
                tr.opts.settle()
            finals[name] = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                            for n, p in tr.model.named_parameters()}
            rows[name] = row
        for name in RUNS:
            rows[name]["equals_off"] = all(torch.equal(v, finals[name][k]) for k, v in finals["off"].items())
        if rank == 0:
            (Path(out) / "rows.json").write_text(json.dumps([rows[n] for n in RUNS]))
    finally:
        build_mod.with_swap = original
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Print the rows and the plan (and write them as JSON with --json)."""
    from trex.trainer.mfu import DEVICES
    from trex.trainer.plan import plan_memory

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small-cpu")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--bucket-mb", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(out, args.preset, args.steps, args.bucket_mb), nprocs=2,  # type: ignore[attr-defined,no-untyped-call]
                 join=True)
        rows: list[dict[str, Any]] = json.loads((Path(out) / "rows.json").read_text())
        plan = plan_memory(_cfg(Path(out), args.preset, args.steps, args.bucket_mb, True), 2, DEVICES["cpu"],
                           capacity=1 << 40)
    cols = sorted({c for r in rows for c in r}, key=lambda c: (c != "run", c))
    print(" ".join(f"{c:>18}" for c in cols))
    for r in rows:
        print(" ".join(f"{r.get(c, '')!s:>18}" for c in cols))
    planned = {"params": plan.params, "device_params": plan.device_params, "masters": plan.masters,
               "swap_buffers": plan.swap_buffers, "device_bytes_saved": plan.swap_saved}
    print("plan at 2 ranks:", " ".join(f"{k}={v}" for k, v in planned.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "plan": planned}, f, indent=1)
    return 0 if all(r["equals_off"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
