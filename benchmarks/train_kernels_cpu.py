"""The small-cpu trainer step with the tuned cpu-c kernels against without, same process, interleaved.

1. Tune the kernels the trainer dispatches (RMSNorm, clamped SwiGLU, router top-k, grouped GEMM; half-split
   RoPE where the model uses it) on exactly the shape classes this run calls (``trex.trainer.kernels.trainer_kernel_shapes``), with `trex kernels tune`.
2. Build two trainers from the same config and seed, one with ``kernels.registry`` set to that registry, and
   alternate their optimizer steps (ABBA), switching the process's kernel dispatch before each.
3. Print per-arm median tokens/s and MFU (same FLOPs-per-token convention and measured peak for both), their
   ratio (goal >= 1.15x), the kernels that were active and how often each ran, and the tuning's per-kernel
   MILP Spearman correlation (predicted vs measured over the measured candidates).
4. Per op: every dispatch call one tuned step makes (shape, count), its forward + backward timed eager against
   tuned (interleaved, paired medians), and the step ratio those savings bound (Amdahl: eager step time over
   eager step time less the savings), which says how far the covered ops can move a whole step.

The trainer runs cpu-c kernels on one thread (``trex.trainer.kernels.training_params``), so they are tuned
with ``threads: 1``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    import torch
    from trex.config_base import load_section
    from trex.kernels.config import KernelTuneConfig
    from trex.kernels.tune import run as tune
    from trex.trainer import kernels as tk
    from trex.trainer.config import TrainerConfig, resolved_model_values
    from trex.trainer.loop import Trainer
    from trex.trainer.model import layers

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="small-cpu")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12, help="timed steps per arm (after 2 warm-up steps each)")
    ap.add_argument("--trials", type=int, default=6, help="tuning trials per kernel shape")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--registry", help="reuse this registry instead of tuning")
    ap.add_argument("--torch-threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    args = ap.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="trex-train-kernels-"))
    data: dict[str, Any] = {"model": {"preset": args.preset}, "maxSteps": 10_000,
                            "data": {"seqLen": args.seq_len, "microBatchSize": args.micro_batch,
                                     "globalBatchSize": args.micro_batch},
                            "optimizer": {"schedule": {"warmupSteps": 2}},
                            "checkpoint": {"dir": str(work / "ckpt"), "intervalSteps": 1_000_000, "resume": False}}
    base = load_section(TrainerConfig, data)
    shapes = tk.trainer_kernel_shapes(resolved_model_values(base.model), args.micro_batch, [args.seq_len], "cpu")
    registry = Path(args.registry) if args.registry else work / "tune" / "registry.json"
    rhos: dict[str, list[float]] = {}
    if not args.registry:
        kernels = sorted({k for k, _ in shapes})
        cfg = load_section(KernelTuneConfig, {
            "suite": "none", "kernels": kernels, "output": str(work / "tune"), "compareCompile": False, "threads": 1,
            "shapes": [{"kernel": k, "dims": d} for k, d in shapes],
            "budget": {"trials": args.trials * len(shapes), "seconds": 3600.0, "samples": args.samples}})
        tune(cfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        import json

        for r in json.loads((work / "tune" / "results.json").read_text())["results"]:
            if r.get("spearman_milp") is not None:
                rhos.setdefault(r["kernel"], []).append(float(r["spearman_milp"]))
    eager = Trainer(base, work / "eager", log=lambda m: print(m, file=sys.stderr))
    tuned_cfg = load_section(TrainerConfig, {**data, "kernels": {"registry": str(registry)}})
    tuned = Trainer(tuned_cfg, work / "tuned", log=lambda m: print(m, file=sys.stderr), measure_peak=False)
    assert eager.telemetry is not None and tuned.telemetry is not None
    peak, fpt = eager.telemetry.peak_flops, eager.telemetry.flops_per_token  # one MFU denominator for both arms
    state = tuned.kernels
    arms: dict[str, tuple[Trainer, Any]] = {"eager": (eager, None), "tuned": (tuned, state)}
    rows: dict[str, list[tuple[float, float]]] = {"eager": [], "tuned": []}
    order = ["eager", "tuned"]
    eager_records: list[Any] = []
    for i in range(args.steps + 2):
        for name in (order if i % 2 == 0 else order[::-1]):
            tr, st = arms[name]
            layers.TUNED.clear()
            if st is not None:
                tk.STATE = st
                layers.TUNED.update(tk.DISPATCH)
            rec = tr.train_step()
            if i >= 2 and name == "eager":
                eager_records.append(rec)
            if i >= 2:
                tps = rec.tokens / rec.seconds
                rows[name].append((tps, fpt * tps / peak))
    med = {n: (statistics.median(t for t, _ in r), statistics.median(m for _, m in r)) for n, r in rows.items()}
    print(f"preset {args.preset}, seq {args.seq_len}, micro-batch {args.micro_batch}, torch threads "
          f"{torch.get_num_threads()}, {args.steps} interleaved steps per arm; MFU over the measured GEMM peak "
          f"{peak / 1e12:.3f} TFLOP/s at {fpt / 1e6:.2f} MFLOP/token")
    for n, (tps, mfu) in med.items():
        print(f"  {n:6s} {tps:10.1f} tokens/s  MFU {100 * mfu:.3f} %")
    from trex.kernels.profile import summarize

    paired = summarize([1 / t for t, _ in rows["tuned"]], [1 / t for t, _ in rows["eager"]])  # s/token, paired steps
    print(f"tuned / eager tokens/s: {med['tuned'][0] / med['eager'][0]:.3f}x (goal >= 1.15x); per interleaved pair "
          f"{paired.gain:.3f}x, 95% CI [{paired.ci_low:.3f}, {paired.ci_high:.3f}]")
    print(f"active kernels: {', '.join(state.active) or 'none'}; refused: {state.refused or 'none'}")
    print(f"tuned launches: {dict(state.calls)}")
    if rhos:
        print("MILP Spearman (predicted vs measured candidates) per kernel: "
              + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in sorted(rhos.items())))
    per_op(tuned, state, statistics.median(r.seconds for r in eager_records), args.samples)
    print(f"registry {registry}; wall time {time.monotonic() - t0:.0f} s")
    return 0


def per_op(trainer: Any, state: Any, step_s: float, samples: int) -> None:
    """Forward + backward of every dispatch call one tuned step makes (its recorded arguments, replayed through the
    model's own entry point with and without layers.TUNED), eager against tuned, and the step ratio the savings
    bound. Router calls are counted, not timed (their entry point is the whole gate)."""
    from collections import Counter

    import torch
    from trex.kernels.profile import interleaved
    from trex.trainer import kernels as tk
    from trex.trainer.model import layers, moe

    def norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        mod = layers.RMSNorm(x.shape[-1], eps=eps)
        mod.weight = torch.nn.Parameter(w.detach().clone())
        out: torch.Tensor = mod(x)
        return out
    entry: dict[str, Any] = {"rmsnorm": norm, "swiglu": layers.swiglu, "grouped_gemm": moe.grouped_linear,
                             "rope": lambda x, c, s: layers.apply_rope(x, c, s, interleave=False)}
    calls: Counter[tuple[str, str]] = Counter()
    args: dict[tuple[str, str], tuple[Any, ...]] = {}

    def copy(a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        c = a.detach().clone()
        return c.requires_grad_() if a.requires_grad and c.is_floating_point() else c

    def recording(name: str) -> Any:
        def f(*a: Any) -> Any:
            key = (name, " ".join("x".join(map(str, t.shape)) if isinstance(t, torch.Tensor) else str(t) for t in a))
            calls[key] += 1
            args.setdefault(key, tuple(copy(t) for t in a))
            return tk.DISPATCH[name](*a)
        return f
    tk.STATE = state
    layers.TUNED.clear()
    layers.TUNED.update({n: recording(n) for n in tk.DISPATCH})
    trainer.train_step()

    def arm(tuned: bool, name: str, a: tuple[Any, ...], dy: torch.Tensor) -> Any:
        def run() -> None:
            layers.TUNED.clear()
            if tuned:
                layers.TUNED.update(tk.DISPATCH)
            entry[name](*a).backward(dy)
        return run
    saved = 0.0
    print("per op (forward + backward, one call; interleaved paired medians):")
    for key, n in sorted(calls.items()):
        name = key[0]
        if name not in entry:
            print(f"  {name:12s} {key[1]:28s} {n:3d}/step  (counted only)")
            continue
        a = args[key]
        dy = torch.randn(entry[name](*a).shape, generator=torch.Generator().manual_seed(0))
        before = sum(state.calls.values())
        arm(True, name, a, dy)()
        if sum(state.calls.values()) == before:
            print(f"  {name:12s} {key[1]:28s} {n:3d}/step  (no accepted kernel for this call: eager)")
            continue
        t = interleaved(arm(True, name, a, dy), arm(False, name, a, dy), samples=samples)
        saved += n * (t.median_base - t.median_cand)
        print(f"  {name:12s} {key[1]:28s} {n:3d}/step  eager {1e6 * t.median_base:9.1f} us  "
              f"tuned {1e6 * t.median_cand:9.1f} us  gain {t.gain:.2f} (95% CI [{t.ci_low:.2f}, {t.ci_high:.2f}])")
    layers.TUNED.clear()
    print(f"covered ops: {1e3 * saved:.1f} ms saved per step of {step_s:.3f} s (eager median) -> these kernels bound "
          f"the step ratio at {step_s / max(step_s - saved, 1e-9):.3f}x")


if __name__ == "__main__":
    sys.exit(main())
