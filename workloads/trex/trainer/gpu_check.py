"""`python -m trex.trainer.gpu_check --swap`: on a CUDA GPU, train the small-gpu preset with and without the
swap optimizer (real side streams, pinned host memory) and print the step times, their ratio, the overlap
ratio, the exposed copy seconds and the device bytes saved. Exits 2 without the device, 1 when the
swap run ends with different parameters (beyond TOLERANCE) than the run without it."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trex.trainer.config import TrainerConfig

TOLERANCE = 1e-3
"""Largest parameter difference between the runs, relative to the largest parameter: buckets change how
many matrices share one batched Newton-Schulz call, which can move the last bits of a GEMM; a missing
wait (a stale or unfinished state) moves whole values."""


def trainer_config(ckpt: Path, preset: str, device: str, steps: int, swap: bool, bucket_mb: int) -> TrainerConfig:
    """The run both sides share: ``preset`` in bf16 (fp32 on CPU) on ``device``, synthetic data."""
    from trex.config_base import load_section

    return load_section(TrainerConfig, {
        "model": {"preset": preset, "dtype": "bf16" if device != "cpu" else "fp32"}, "device": device,
        "maxSteps": steps, "data": {"seqLen": 256 if device != "cpu" else 16, "microBatchSize": 2, "globalBatchSize": 2},
        "optimizer": {"schedule": {"warmupSteps": 1}, "swap": {"enabled": swap, "bucketMb": bucket_mb}},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(ckpt), "intervalSteps": 1_000_000, "exportHf": False},
    })


def compare(off: Sequence[Any], on: Sequence[Any], skip: int = 1) -> dict[str, float]:
    """Step records of the two runs (the first ``skip`` steps left out: allocation, state creation) ->
    median step seconds of each, their ratio, and the swap run's overlap ratio (hidden / total copy time
    over the measured steps), exposed seconds per step and device bytes saved."""
    off, on = list(off)[skip:], list(on)[skip:]
    if not off or not on:
        raise ValueError(f"need more than {skip} steps per run")
    swaps = [r.swap for r in on if r.swap is not None]
    if not swaps:
        raise ValueError("the swap run recorded no transfers")
    t_off = statistics.median(r.seconds for r in off)
    t_on = statistics.median(r.seconds for r in on)
    copy = sum(s.copy_seconds for s in swaps)
    exposed = sum(s.exposed_seconds for s in swaps)
    return {"step_s_no_swap": t_off, "step_s_swap": t_on, "ratio": t_on / t_off,
            "overlap": 1.0 if copy <= 0 else min(1.0, max(0.0, 1 - exposed / copy)),
            "exposed_s": exposed / len(swaps), "device_bytes_saved": float(swaps[-1].bytes_saved)}


def run_pair(preset: str, device: str, steps: int, bucket_mb: int) -> dict[str, float]:
    """Train without and with swap: the comparison, plus ``param_diff`` (the largest parameter difference
    relative to the largest parameter)."""

    from trex.trainer.loop import Trainer

    finals = []
    records = []
    for swap in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            tr = Trainer(trainer_config(Path(tmp) / "ckpt", preset, device, steps, swap, bucket_mb), tmp,
                         measure_peak=False, log=lambda _m: None)
            records.append(tr.run(steps).history)
            finals.append({n: p.detach().float().cpu() for n, p in tr.model.named_parameters()})
    diff = max(float((finals[0][n] - finals[1][n]).abs().max()) for n in finals[0])
    scale = max(float(p.abs().max()) for p in finals[0].values())
    return {**compare(records[0], records[1]), "param_diff": diff / max(scale, 1e-30)}


def main(argv: list[str] | None = None) -> int:
    """Print the comparison table."""
    ap = argparse.ArgumentParser(prog="python -m trex.trainer.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--swap", action="store_true", help="check the swap optimizer (the only check)")
    ap.add_argument("--preset", default="small-gpu")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--bucket-mb", type=int, default=16)
    ap.add_argument("--device", default="cuda", choices=["cuda", "npu", "cpu"],
                    help="cpu runs the same comparison on the thread copy engine (no device memory)")
    args = ap.parse_args(argv)
    if not args.swap:
        ap.error("nothing to check: pass --swap")
    from trex.runtime.device import cuda_available, npu_available

    present = cuda_available() if args.device == "cuda" else npu_available() if args.device == "npu" else True
    if not present:
        print(f"gpu_check: no {args.device} device here", file=sys.stderr)
        return 2
    result = run_pair(args.preset, args.device, args.steps, args.bucket_mb)
    for key, val in result.items():
        print(f"{key:20s} {val:.4g}")
    ok = result["param_diff"] <= TOLERANCE
    print(f"{'parameters agree':20s} {'yes' if ok else 'NO'} (tolerance {TOLERANCE:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
