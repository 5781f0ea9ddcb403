"""Fused chunked reverse KL against the naive form, and the split of one on-policy distillation step.

Usage: python benchmarks/opd_kl.py [--vocab 129280] [--tokens 4096] [--hidden 1024] [--chunk 256]
                                   [--naive-tokens N] [--reps 1] [--json out.json]

KL part (CPU, fp32): forward + backward of sum_t KL(p_s || p_t) at T tokens, V = the DeepSeek-V4 vocabulary,
hidden D for both models, (a) fused and chunked (trex.trainer.distill.kl: [chunk, V] logits at a time,
recomputed in the backward), (b) naive (both models' full [T, V] logits, log_softmax, autograd). Reported
per form: wall seconds (median of --reps) and peak allocated bytes (profiler allocation records), and the
ratios naive / fused. Goal: peak ratio >= 10 and time ratio >= 1. The naive form needs about 5 x T x V x 4
bytes; --naive-tokens runs it at fewer tokens on a small machine: both forms are compared there, the fused
form is also run at --tokens, and the naive peak at --tokens is extrapolated from naive runs at N / 2 and N
tokens (it is linear in T: the head gradient plus T-proportional logits), reported as such.

Step part: one OPD step of a tiny student and teacher (trex.trainer.distill.opd): rollout / teacher pass /
student pass seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from trex.runtime.copy_engine import ThreadCopyEngine
from trex.trainer.distill.cache import HiddenStateCache
from trex.trainer.distill.kl import reverse_kl, token_coefficients
from trex.trainer.distill.opd import opd_step
from trex.trainer.distill.peak import peak_cpu_bytes
from trex.trainer.distill.teacher import TeacherPool
from trex.trainer.hf import save_hf
from trex.trainer.model import ModelArgs, build_model_from_args
from trex.trainer.rollout import SamplingParams


def _inputs(tokens: int, vocab: int, hidden: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, hidden, generator=g), torch.randn(vocab, hidden, generator=g) * 0.02,
            torch.randn(tokens, hidden, generator=g), torch.randn(vocab, hidden, generator=g) * 0.02)


def fused(hs: torch.Tensor, ws: torch.Tensor, ht: torch.Tensor, wt: torch.Tensor, chunk: int) -> Callable[[], None]:
    coef = token_coefficients(torch.ones(hs.shape[0]))

    def run() -> None:
        h, w = hs.detach().requires_grad_(), ws.detach().requires_grad_()
        reverse_kl(h, w, ht, wt, coef, chunk_size=chunk).loss.backward()

    return run


def naive(hs: torch.Tensor, ws: torch.Tensor, ht: torch.Tensor, wt: torch.Tensor, _chunk: int) -> Callable[[], None]:
    def run() -> None:
        h, w = hs.detach().requires_grad_(), ws.detach().requires_grad_()
        lps = torch.log_softmax(h @ w.T, dim=-1)
        with torch.no_grad():
            lpt = torch.log_softmax(ht @ wt.T, dim=-1)
        ((lps.exp() * (lps - lpt)).sum(-1).mean()).backward()

    return run


def measure(form: Callable[..., Callable[[], None]], tokens: int, vocab: int, hidden: int, chunk: int,
            reps: int) -> dict[str, float]:
    """Median seconds and peak bytes of one forward + backward."""
    run = form(*_inputs(tokens, vocab, hidden), chunk)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(times), "peak_bytes": float(peak_cpu_bytes(run))}


def compare(tokens: int, vocab: int, hidden: int, chunk: int, reps: int) -> dict[str, Any]:
    f = measure(fused, tokens, vocab, hidden, chunk, reps)
    n = measure(naive, tokens, vocab, hidden, chunk, reps)
    return {"tokens": tokens, "fused": f, "naive": n, "peak_ratio": n["peak_bytes"] / f["peak_bytes"],
            "time_ratio": n["seconds"] / f["seconds"]}


def opd_split(steps: int = 3) -> dict[str, float]:
    """Mean rollout / teacher / student seconds of OPD steps on a tiny model (vocab 512, 8 prompts x 2)."""
    args = dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, kv_lora_rank=32, qk_nope_head_dim=16,
                qk_rope_head_dim=8, v_head_dim=16, intermediate_size=128, moe_intermediate_size=32, mtp_depth=0,
                max_seq_len=256)
    with tempfile.TemporaryDirectory() as tmp:
        save_hf(build_model_from_args(ModelArgs(**args), seed=1), Path(tmp) / "teacher")  # type: ignore[arg-type]
        student = build_model_from_args(ModelArgs(**args), seed=0)  # type: ignore[arg-type]
        pool = TeacherPool([("t", 1.0, Path(tmp) / "teacher")], torch.device("cpu"),
                           HiddenStateCache(1 << 30, Path(tmp) / "cache"), ThreadCopyEngine(), vocab_size=512)
        opt = torch.optim.Adam(student.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, 512, (16,), generator=g).tolist() for _ in range(8)]
        split: dict[str, list[float]] = {"rollout": [], "teacher": [], "student": []}
        for step in range(steps + 1):
            stats = opd_step(student, prompts, [["t"]] * 8, pool, SamplingParams(max_new_tokens=64),
                             samples_per_prompt=2, seed=0, step=step, estimator="full-vocab", chunk_size=1024)
            opt.step()
            opt.zero_grad()
            if step:  # the first step reads the teacher from disk
                for k in split:
                    split[k].append(stats.seconds[k])
        pool.close()
    return {k: statistics.mean(v) for k, v in split.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=129_280)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--naive-tokens", type=int, default=None, help="tokens of the naive comparison (default --tokens)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    out: dict[str, Any] = {"vocab": a.vocab, "hidden": a.hidden, "chunk": a.chunk, "threads": torch.get_num_threads()}
    small = a.naive_tokens or a.tokens
    out["compare"] = compare(small, a.vocab, a.hidden, a.chunk, a.reps)
    if small != a.tokens:
        full = measure(fused, a.tokens, a.vocab, a.hidden, a.chunk, a.reps)
        half = measure(naive, small // 2, a.vocab, a.hidden, a.chunk, 1)["peak_bytes"]
        slope = (out["compare"]["naive"]["peak_bytes"] - half) / (small - small // 2)
        naive_full = half + slope * (a.tokens - small // 2)
        out["at_tokens"] = {"tokens": a.tokens, "fused": full, "naive_peak_bytes_extrapolated": naive_full,
                            "peak_ratio_extrapolated": naive_full / full["peak_bytes"]}
    out["opd_step_seconds"] = opd_split()
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        a.json.write_text(text)
    c = out["compare"]
    print(f"T={c['tokens']} V={a.vocab} D={a.hidden}: peak naive/fused {c['peak_ratio']:.1f}x (goal >= 10), "
          f"time naive/fused {c['time_ratio']:.2f}x (goal >= 1)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
