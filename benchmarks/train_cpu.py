"""CPU training benchmark (not a test): our trainer step vs Hugging Face DeepseekV3ForCausalLM + AdamW,
our MFU against the measured CPU GEMM peak, and Muon (10 Newton-Schulz steps) vs torch.optim.Muon (5).

    .venv/bin/python benchmarks/train_cpu.py [--rounds 5] [--seq-len 128] [--batch 4] [--accum 1,8,32] [--threads 1]

Same small-cpu shape, micro-batch and sequence length on every side. For each global batch (``--accum``
micro-batches per optimizer step, so Muon's fixed per-step cost is amortised as in real training) it
times, interleaved, medians of ``--rounds``:

- trex with the default numerics (fp32 forward/backward) and with ``model.autocast: bf16`` (bf16 GEMMs,
  fp32 parameters, gradients and optimizer states), each with the preset's MTP module (``mtpDepth`` 1)
  and without it (``mtpDepth: 0``: the same computation as HF's forward, which has no MTP);
- HF in fp32 (its default) and under the same bf16 autocast, so precision is compared like for like.
  HF reads the same token ids as our trainer; it attends across the packed documents (its forward has no
  per-document mask), while ours masks them, so our side does slightly more attention work.

MFU divides by the calibration-GEMM peak of the row's GEMM dtype (fp32 or bf16), never the lower one.
Muon: our default (``nsDtype: auto``: bf16 leading stages and an fp32 cleanup stage where bf16 GEMMs are
fast, as on CPUs with AVX512-BF16) and all-fp32, against torch.optim.Muon (5 bf16 steps).
Goals: >= 2x HF tokens/s; MFU >= 30 % of the measured GEMM peak; Muon 10-step cost <= 2.2x torch's 5-step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@dataclass(frozen=True)
class Side:
    """One timed configuration: whose step, GEMM dtype, MTP on or off."""

    who: str  # "trex" or "HF"
    dtype: str  # "fp32" or "bf16" (autocast)
    mtp: bool

    @property
    def label(self) -> str:
        return f"{self.who} {self.dtype}{' +MTP' if self.mtp else ''}"


def ours(seq_len: int, batch: int, accum: int, out_dir: str, mtp: bool = True, autocast: bool = False,
         ns_dtype: str = "auto") -> tuple[Callable[[], Any], Any]:
    """Our Trainer (small-cpu preset), one optimizer step per call (data, fwd/bwd, clip, Muon+AdamW, bias update)."""
    from trex.config_base import load_section
    from trex.trainer.config import TrainerConfig
    from trex.trainer.loop import Trainer

    cfg = load_section(TrainerConfig, {
        "model": {"preset": "small-cpu", "overrides": {} if mtp else {"mtpDepth": 0},
                  "autocast": "bf16" if autocast else "off"}, "device": "cpu",
        "maxSteps": 1000,
        "data": {"seqLen": seq_len, "microBatchSize": batch, "globalBatchSize": batch * accum},
        "checkpoint": {"dir": f"{out_dir}/ckpt", "resume": False}, "stability": {"enabled": False},
        "optimizer": {"muon": {"nsDtype": ns_dtype}},
    })
    tr = Trainer(cfg, out_dir, measure_peak=False, log=lambda _m: None)
    return tr.train_step, tr


def ours_inputs(seq_len: int, batch: int, out_dir: str, n: int = 64) -> list[torch.Tensor]:
    """The first ``n`` micro-batches of token ids our trainer's data loader produces (packed documents)."""
    _step, tr = ours(seq_len, batch, 1, out_dir, mtp=False)
    return [tr.loader.next_batch(batch, seq_len, 0, 1)["input_ids"] for _ in range(n)]


def hf(seq_len: int, batch: int, accum: int, vocab: int, inputs: list[torch.Tensor],
       autocast: bool = False) -> Callable[[], Any]:
    """HF DeepseekV3ForCausalLM with the same shape as small-cpu, torch.optim.AdamW, clip 1.0, fed the
    token ids our trainer reads (``inputs``, cycled), so routing sees the same data on both sides."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    from trex.trainer.presets import PRESET_VALUES

    v = PRESET_VALUES["small-cpu"]
    cfg = DeepseekV3Config(
        vocab_size=vocab, hidden_size=v["hidden_size"], intermediate_size=v["intermediate_size"],
        moe_intermediate_size=v["moe_intermediate_size"], num_hidden_layers=v["num_layers"],
        num_attention_heads=v["num_heads"], num_key_value_heads=v["num_heads"], n_shared_experts=v["n_shared_experts"],
        n_routed_experts=v["n_routed_experts"], num_experts_per_tok=v["experts_per_token"],
        routed_scaling_factor=v["routed_scaling_factor"], kv_lora_rank=v["kv_lora_rank"], q_lora_rank=v["q_lora_rank"],
        qk_rope_head_dim=v["qk_rope_head_dim"], qk_nope_head_dim=v["qk_nope_head_dim"], v_head_dim=v["v_head_dim"],
        n_group=v["n_groups"], topk_group=v["topk_groups"], first_k_dense_replace=v["n_dense_layers"],
        max_position_embeddings=v["max_seq_len"], use_cache=False,
    )
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), eps=1e-20, weight_decay=0.1)
    pos = [0]

    def step() -> None:
        for _ in range(accum):
            ids = inputs[pos[0] % len(inputs)]
            pos[0] += 1
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = model(input_ids=ids, labels=ids)
            (out.loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def muon_trio(model: torch.nn.Module) -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
    """Our Muon as the trainer builds it by default (auto), our all-fp32 Muon, torch.optim.Muon (5 NS, bf16)."""
    from trex.runtime.device import fast_bf16
    from trex.trainer.optim.build import resolve_ns_dtype
    from trex.trainer.optim.muon import Muon

    roles = model.param_roles()  # type: ignore[operator]
    named = dict(model.named_parameters())
    mats = [named[n].detach().clone() for n, r in roles.items() if r == "muon"]
    auto_p = [torch.nn.Parameter(m.clone()) for m in mats]
    fp32_p = [torch.nn.Parameter(m.clone()) for m in mats]
    # torch.optim.Muon takes 2-D parameters only: stacked experts become one parameter per expert.
    theirs_p = [torch.nn.Parameter(x.clone()) for m in mats for x in (m.unbind(0) if m.ndim == 3 else [m])]
    gen = torch.Generator().manual_seed(1)
    for p, q in zip(auto_p, fp32_p, strict=True):
        p.grad = torch.randn(p.shape, generator=gen)
        q.grad = p.grad.clone()
    for p in theirs_p:
        p.grad = torch.randn(p.shape, generator=gen)
    auto = Muon(auto_p, lr=0.02, ns_dtype=resolve_ns_dtype("auto", fast_bf16("cpu")), final_dtype=torch.float32)
    fp32 = Muon(fp32_p, lr=0.02)
    theirs = torch.optim.Muon(theirs_p, lr=0.02, adjust_lr_fn="match_rms_adamw")
    return auto.step, fp32.step, theirs.step


def compare(sides: list[Side], seq_len: int, batch: int, accum: int, rounds: int, tmp: str
            ) -> tuple[dict[Side, float], dict[Side, float], dict[bool, float], Any]:
    """Interleaved median step seconds of every side at one global batch; our compute/optimizer split
    (median seconds per side) and FLOPs/token with and without MTP; a trex model for the Muon section."""
    inputs = ours_inputs(seq_len, batch, f"{tmp}/data{accum}")
    steps: dict[Side, Callable[[], float]] = {}
    split: dict[Side, list[float]] = {}
    fpt: dict[bool, float] = {}
    model = None
    for side in sides:
        if side.who == "trex":
            step, tr = ours(seq_len, batch, accum, f"{tmp}/{accum}{side.dtype}{side.mtp}", side.mtp,
                            side.dtype == "bf16")
            fpt[side.mtp] = tr._fpt(seq_len)
            model = model or tr.model
            split[side] = []

            def run(step: Callable[[], Any] = step, side: Side = side) -> float:
                rec = step()
                split[side].append(rec.optimizer_seconds)
                return float(rec.seconds)
            steps[side] = run
        else:
            hstep = hf(seq_len, batch, accum, 8192, inputs, side.dtype == "bf16")
            steps[side] = lambda hstep=hstep: _timed(hstep)  # type: ignore[misc]
    for fn in steps.values():  # warm-up
        fn()
    for s in split.values():
        s.clear()
    times: dict[Side, list[float]] = {s: [] for s in sides}
    for _ in range(rounds):
        for side, fn in steps.items():
            times[side].append(fn())
    return ({s: statistics.median(t) for s, t in times.items()},
            {s: statistics.median(t) for s, t in split.items()}, fpt, model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4, help="micro-batch (sequences)")
    ap.add_argument("--accum", default="1,8,32", help="micro-batches per optimizer step, comma-separated")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 keeps shared machines steady)")
    args = ap.parse_args()
    from trex.runtime.device import fast_bf16
    from trex.trainer import mfu as mfu_mod

    torch.set_num_threads(args.threads)
    accums = [int(a) for a in args.accum.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); small-cpu preset; "
          f"micro-batch {args.batch} x seq {args.seq_len}; medians of {args.rounds} interleaved rounds; "
          f"fast bf16 GEMMs on this CPU: {fast_bf16('cpu')}")
    peak = {d: mfu_mod.measure_cpu_peak_flops(seconds=2.0, dtype=d) for d in ("fp32", "bf16")}
    sides = [Side("trex", d, m) for d in ("fp32", "bf16") for m in (True, False)]
    sides += [Side("HF", "fp32", False), Side("HF", "bf16", False)]
    table: dict[int, tuple[dict[Side, float], dict[Side, float]]] = {}
    fpt: dict[bool, float] = {}
    model = None
    with tempfile.TemporaryDirectory() as tmp:
        for accum in accums:
            med, opt_s, fpt, m = compare(sides, args.seq_len, args.batch, accum, args.rounds, tmp)
            model = model or m
            table[accum] = (med, opt_s)
            print(f"  global batch {args.batch * accum} done", flush=True)
        fns = muon_trio(model)  # type: ignore[arg-type]
        mt: list[list[float]] = [[], [], []]
        for f in fns:
            f()
        for _ in range(args.rounds):
            for f, ts in zip(fns, mt, strict=True):
                ts.append(_timed(f))
    m_auto, m_fp32, m_torch = (statistics.median(ts) for ts in mt)

    def ok(c: bool) -> str:
        return "met" if c else "NOT met"

    print(f"\ncalibration GEMM peak: fp32 {peak['fp32'] / 1e9:.1f} GFLOP/s, bf16 {peak['bf16'] / 1e9:.1f} GFLOP/s; "
          f"FLOPs/token ({mfu_mod.FLOPS_CONVENTION}): {fpt[False] / 1e6:.2f} M, with MTP {fpt[True] / 1e6:.2f} M\n")
    print(f"{'global batch':>12} {'side':>16} {'step':>9} {'(optim)':>8} {'tok/s':>8} {'MFU':>6} "
          f"{'x HF fp32':>9} {'x HF bf16':>9}")
    for accum, (med, opt_s) in table.items():
        tokens = args.seq_len * args.batch * accum
        for side, s in med.items():
            tps = tokens / s
            mfu = mfu_mod.mfu(tps, fpt[side.mtp], peak[side.dtype])
            optim = f"{opt_s[side] * 1e3:6.0f}ms" if side in opt_s else " " * 8
            print(f"{args.batch * accum:>7} seqs {side.label:>16} {s * 1e3:7.0f}ms {optim} {tps:8.0f} "
                  f"{100 * mfu:5.1f}% {med[Side('HF', 'fp32', False)] / s:8.2f}x {med[Side('HF', 'bf16', False)] / s:8.2f}x")
    print(f"\nMuon, trex default (nsDtype auto)     {m_auto * 1e3:8.1f} ms")
    print(f"Muon, trex all-fp32                   {m_fp32 * 1e3:8.1f} ms")
    print(f"torch.optim.Muon 5 NS steps (bf16)    {m_torch * 1e3:8.1f} ms")
    print("\nratios vs goals (trex rows without MTP compute what HF computes)")
    for accum, (med, _o) in table.items():
        for dt in ("fp32", "bf16"):
            s = med[Side("trex", dt, False)]
            print(f"  tokens/s, global {args.batch * accum:>3}, trex {dt}: {med[Side('HF', 'fp32', False)] / s:5.2f}x HF fp32, "
                  f"{med[Side('HF', dt, False)] / s:5.2f}x HF {dt} (goal >= 2x: "
                  f"{ok(med[Side('HF', dt, False)] / s >= 2)} like for like)")
    for accum, (med, _o) in table.items():
        tokens = args.seq_len * args.batch * accum
        for dt in ("fp32", "bf16"):
            mfu = mfu_mod.mfu(tokens / med[Side("trex", dt, True)], fpt[True], peak[dt])
            print(f"  MFU, global {args.batch * accum:>3}, trex {dt} +MTP vs the {dt} peak: {100 * mfu:5.1f} % "
                  f"(goal >= 30 %: {ok(mfu >= 0.30)})")
    print(f"  Muon 10-step default / torch 5-step   {m_auto / m_torch:5.2f}x (goal <= 2.2x: {ok(m_auto / m_torch <= 2.2)})")
    print(f"  Muon 10-step all-fp32 / torch 5-step  {m_fp32 / m_torch:5.2f}x")


if __name__ == "__main__":
    main()
