"""`python -m trex.kernels.gpu_check`: on a CUDA machine, gate and time every Triton kernel against eager
PyTorch and torch.compile (default mode) and print a table. Exits 2 without CUDA, 1 if any kernel fails."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

GPU_SHAPES: dict[str, dict[str, int]] = {
    "rmsnorm_fwd": {"rows": 8192, "cols": 4096}, "swiglu_clamp_fwd": {"rows": 8192, "cols": 4096},
    "swiglu_clamp_bwd": {"rows": 8192, "cols": 4096}, "rope_fwd": {"tokens": 8192, "heads": 32, "dim": 128},
    "rope_inv": {"tokens": 8192, "heads": 32, "dim": 128}, "cross_entropy": {"rows": 4096, "vocab": 32000},
    "kl_div": {"rows": 2048, "vocab": 32000}, "router_topk": {"tokens": 16384, "experts": 256, "k": 8, "score": 2},
    "grouped_gemm": {"tokens": 8192, "experts": 16, "hidden": 2048, "out": 1024},
    "mhc_pre": {"tokens": 8192, "streams": 4, "hidden": 4096, "iters": 20},
}
CONFIGS = ({"BLOCK": 1024, "WARPS": 4, "STAGES": 2}, {"BLOCK": 4096, "WARPS": 8, "STAGES": 2},
           {"BLOCK": 256, "WARPS": 2, "STAGES": 1})
MOE_CONFIGS: dict[str, tuple[dict[str, int], ...]] = {
    "router_topk": ({"BLOCK": 16, "WARPS": 4}, {"BLOCK": 4, "WARPS": 2}, {"BLOCK": 32, "WARPS": 8}),
    "grouped_gemm": ({"MB": 32, "NB": 64, "KB": 32, "WARPS": 4, "STAGES": 2},
                     {"MB": 64, "NB": 128, "KB": 32, "WARPS": 8, "STAGES": 3},
                     {"MB": 16, "NB": 64, "KB": 64, "WARPS": 4, "STAGES": 2}),
    "mhc_pre": ({"BLOCK": 256, "WARPS": 4, "STAGES": 2}, {"BLOCK": 1024, "WARPS": 8, "STAGES": 2},
                {"BLOCK": 128, "WARPS": 2, "STAGES": 1}),
}


def check_one(be: Any, facts: Any, spec: Any, shape: dict[str, int], dtype: str, samples: int,
              with_compile: bool) -> tuple[bool, float]:
    """Gate the configurations, time the fastest against eager and torch.compile, print one row.
    Returns (correct, seconds spent compiling)."""
    import torch

    from trex.kernels.backends.base import alloc_outputs
    from trex.kernels.profile import interleaved
    from trex.kernels.roofline import achieved_bandwidth_fraction
    from trex.kernels.verify import verify

    sync = torch.cuda.synchronize
    name = spec.name
    inputs = {k: v.cuda() for k, v in spec.make_inputs(shape, dtype, 0).items()}
    best: tuple[float, dict[str, int]] | None = None
    why = ""
    for cfg in MOE_CONFIGS.get(name, CONFIGS):
        comp = be.compile(spec, cfg, dtype)
        v = verify(spec, comp, dtype, seeds=5, shapes=[*spec.tail_shapes, shape], device="cuda")
        if not v.ok:
            why = v.reason
            continue
        f = comp.bind(inputs, alloc_outputs(spec, shape, dtype, "cuda"), shape)
        t = interleaved(f, f, samples=10, sync=sync).median_cand
        if best is None or t < best[0]:
            best = (t, cfg)
    if best is None:
        print(f"{name:18s} {dtype:5s} NO  {why[:100]}")
        return False, 0.0
    cfg = best[1]
    f = be.compile(spec, cfg, dtype).bind(inputs, alloc_outputs(spec, shape, dtype, "cuda"), shape)
    te = interleaved(f, lambda: spec.eager(inputs, shape, spec.scalars), samples=samples, sync=sync)
    tc_ms, xc, spent = "-", "-", 0.0
    if with_compile:
        torch.compiler.reset()
        fn = torch.compile(lambda t: spec.eager(t, shape, spec.scalars))
        t0 = time.perf_counter()
        fn(inputs)
        sync()
        spent = time.perf_counter() - t0
        tc = interleaved(f, lambda: fn(inputs), samples=samples, sync=sync)
        tc_ms, xc = f"{tc.median_base * 1e3:.3f}", f"{tc.gain:.2f}"
    frac = achieved_bandwidth_fraction(spec, shape, dtype, facts, te.median_cand)
    cs = ",".join(f"{k}={v}" for k, v in cfg.items())
    print(f"{name:18s} {dtype:5s} yes {cs:26s} {te.median_cand * 1e3:9.3f} {te.median_base * 1e3:9.3f} "
          f"{tc_ms:>10s} {te.gain:8.2f} {xc:>9s} {frac:7.2f}", flush=True)
    return True, spent


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m trex.kernels.gpu_check")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--compile-budget-s", type=float, default=100.0,
                    help="stop timing torch.compile once this much compile time has been spent")
    args = ap.parse_args(list(argv) if argv is not None else None)
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device visible (torch.cuda.is_available() is False); this check needs an NVIDIA GPU",
              file=sys.stderr)
        return 2
    from trex.kernels.backends.triton import TRITON_KERNELS, TritonBackend
    from trex.kernels.suite import get

    be = TritonBackend()
    facts = be.facts()
    print(f"device {facts.name}: measured {facts.bandwidth / 1e9:.0f} GB/s, {facts.peak_flops / 1e12:.1f} TFLOP/s fp32")
    compile_spent = 0.0
    failures = 0
    head = f"{'kernel':18s} {'dtype':5s} {'ok':3s} {'config':26s} {'triton ms':>9s} {'eager ms':>9s} {'compile ms':>10s} " \
           f"{'x eager':>8s} {'x compile':>9s} {'BW frac':>7s}"
    print(head)
    for name in TRITON_KERNELS:
        spec = get(name)
        for dtype in [d for d in args.dtypes.split(",") if d in spec.dtypes]:
            ok, spent = check_one(be, facts, spec, GPU_SHAPES[name], dtype, args.samples,
                                  compile_spent < args.compile_budget_s)
            compile_spent += spent
            failures += 0 if ok else 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
