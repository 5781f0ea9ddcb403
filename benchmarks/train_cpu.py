"""CPU training benchmark (not a test): our trainer step vs Hugging Face DeepseekV3ForCausalLM + AdamW,
our MFU against the measured CPU GEMM peak, and Muon (10 Newton-Schulz steps) vs torch.optim.Muon (5).

    .venv/bin/python benchmarks/train_cpu.py [--rounds 5] [--seq-len 128] [--batch 4] [--accum 8] [--threads 1]

Prints a table and ratios (medians of interleaved runs), with one micro-batch per optimizer step and
with ``--accum`` micro-batches (gradient accumulation, so the optimizer cost is amortised), each with
Muon's default fp32 Newton-Schulz and with the opt-in bf16 quintic (``optimizer.muon.nsDtype: bf16``).
Our step includes the MTP module (default ``mtpDepth`` 1; HF's forward has none); one extra row runs
with ``mtpDepth: 0`` to show what MTP costs, and the last row adds the opt-in bf16 autocast
(``model.autocast: bf16``) to the bf16 quintic. Goals: >= 2x HF tokens/s; MFU >= 30 % of the measured
GEMM peak; Muon 10-step cost <= 2.2x torch.optim.Muon's 5-step cost.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def ours(seq_len: int, batch: int, accum: int, out_dir: str, ns_dtype: str = "fp32",
         mtp: bool = True, autocast: bool = False) -> tuple[Callable[[], Any], Any]:
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


def hf(seq_len: int, batch: int, accum: int, vocab: int) -> Callable[[], Any]:
    """HF DeepseekV3ForCausalLM with the same shape as small-cpu, torch.optim.AdamW, clip 1.0."""
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
    gen = torch.Generator().manual_seed(0)

    def step() -> None:
        for _ in range(accum):
            ids = torch.randint(0, vocab, (batch, seq_len), generator=gen)
            out = model(input_ids=ids, labels=ids)
            (out.loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def muon_trio(model: torch.nn.Module) -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
    """Our Muon (hybrid 8+2 NS in fp32; and bf16 quintic + fp32 cleanup) vs torch.optim.Muon (5 NS, bf16)."""
    from trex.trainer.optim.muon import Muon

    roles = model.param_roles()  # type: ignore[operator]
    named = dict(model.named_parameters())
    mats = [named[n].detach().clone() for n, r in roles.items() if r == "muon"]
    ours_p = [torch.nn.Parameter(m.clone()) for m in mats]
    mixed_p = [torch.nn.Parameter(m.clone()) for m in mats]
    # torch.optim.Muon takes 2-D parameters only: stacked experts become one parameter per expert.
    theirs_p = [torch.nn.Parameter(x.clone()) for m in mats for x in (m.unbind(0) if m.ndim == 3 else [m])]
    gen = torch.Generator().manual_seed(1)
    for p, q in zip(ours_p, mixed_p, strict=True):
        p.grad = torch.randn(p.shape, generator=gen)
        q.grad = p.grad.clone()
    for p in theirs_p:
        p.grad = torch.randn(p.shape, generator=gen)
    a = Muon(ours_p, lr=0.02)
    mixed = Muon(mixed_p, lr=0.02, ns_dtype=torch.bfloat16, final_dtype=torch.float32)
    b = torch.optim.Muon(theirs_p, lr=0.02, adjust_lr_fn="match_rms_adamw")
    return a.step, mixed.step, b.step


def compare(seq_len: int, batch: int, accum: int, rounds: int, peak: float, tmp: str,
            ns_dtype: str = "fp32", mtp: bool = True, autocast: bool = False) -> dict[str, Any]:
    """Interleaved medians of our step and the HF step at one global batch; our MFU."""
    from trex.trainer import mfu as mfu_mod

    our_step, trainer = ours(seq_len, batch, accum, tmp, ns_dtype, mtp, autocast)
    hf_step = hf(seq_len, batch, accum, int(trainer.model.args.vocab_size))
    for _ in range(2):  # warm-up
        our_step()
        hf_step()
    t_ours, t_hf, t_comp, t_opt = [], [], [], []
    for _ in range(rounds):
        rec = our_step()
        t_ours.append(rec.seconds)
        t_comp.append(rec.compute_seconds)
        t_opt.append(rec.optimizer_seconds)
        t_hf.append(_timed(hf_step))
    tokens = seq_len * batch * accum
    so, sh = statistics.median(t_ours), statistics.median(t_hf)
    fpt = trainer._fpt(seq_len)
    return {"tokens": tokens, "ours_s": so, "hf_s": sh, "ours_tps": tokens / so, "hf_tps": tokens / sh,
            "compute_s": statistics.median(t_comp), "optim_s": statistics.median(t_opt), "fpt": fpt,
            "mfu": mfu_mod.mfu(tokens / so, fpt, peak), "model": trainer.model}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4, help="micro-batch (sequences)")
    ap.add_argument("--accum", type=int, default=8, help="micro-batches per step in the second comparison")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 keeps shared machines steady)")
    args = ap.parse_args()
    from trex.trainer import mfu as mfu_mod

    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); small-cpu preset; "
          f"micro-batch {args.batch} x seq {args.seq_len}; medians of {args.rounds} interleaved rounds")
    peak = mfu_mod.measure_cpu_peak_flops(seconds=2.0)
    # (micro-batches per step, Newton-Schulz dtype, MTP on, bf16 autocast): defaults first, then the opt-ins.
    runs = ((1, "fp32", True, False), (1, "bf16", True, False), (1, "fp32", False, False),
            (args.accum, "fp32", True, False), (args.accum, "bf16", True, True))
    results: dict[tuple[int, str, bool, bool], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            accum, ns, mtp, autocast = run
            results[run] = compare(args.seq_len, args.batch, accum, args.rounds, peak,
                                   f"{tmp}/a{accum}{ns}{mtp}{autocast}", ns, mtp, autocast)
        fns = muon_trio(results[1, "fp32", True, False]["model"])
        times: list[list[float]] = [[], [], []]
        for f in fns:
            f()
        for _ in range(args.rounds):
            for f, ts in zip(fns, times, strict=True):
                ts.append(_timed(f))
    mo, mm, mt = (statistics.median(ts) for ts in times)

    def ok(c: bool) -> str:
        return "met" if c else "NOT met"

    print(f"\ncalibration GEMM peak (fp32): {peak / 1e9:.1f} GFLOP/s; model FLOPs/token "
          f"({mfu_mod.FLOPS_CONVENTION}): {results[1, 'fp32', True, False]['fpt'] / 1e6:.2f} M\n")
    print(f"{'global batch':>14} {'NS dtype':>9} {'MTP':>4} {'autocast':>9} {'trex step':>11} {'(fwd+bwd':>9} {'optim)':>8} "
          f"{'HF step':>10} {'trex tok/s':>11} {'HF tok/s':>9} {'ratio':>7} {'trex MFU':>9}")
    for (accum, ns, mtp, ac), r in results.items():
        print(f"{args.batch * accum:>9} seqs {ns:>9} {'on' if mtp else 'off':>4} {'bf16' if ac else 'off':>9} "
              f"{r['ours_s'] * 1e3:>9.0f}ms "
              f"{r['compute_s'] * 1e3:>7.0f}ms "
              f"{r['optim_s'] * 1e3:>6.0f}ms {r['hf_s'] * 1e3:>8.0f}ms {r['ours_tps']:>11.0f} {r['hf_tps']:>9.0f} "
              f"{r['ours_tps'] / r['hf_tps']:>6.2f}x {100 * r['mfu']:>8.1f}%")
    print(f"\nMuon 8+2 NS steps (trex, fp32, batched)   {mo * 1e3:8.1f} ms")
    print(f"Muon 8 bf16 + 2 fp32 NS steps (trex)       {mm * 1e3:8.1f} ms")
    print(f"torch.optim.Muon 5 NS steps (bf16)         {mt * 1e3:8.1f} ms")
    print("\nratios vs goals")
    for (accum, ns, mtp, ac), r in results.items():
        what = f"global {args.batch * accum:>3}, NS {ns}, MTP {'on' if mtp else 'off'}{', autocast bf16' if ac else ''}"
        print(f"  tokens/s trex / HF ({what})   "
              f"{r['ours_tps'] / r['hf_tps']:6.2f}x   (goal >= 2x: {ok(r['ours_tps'] / r['hf_tps'] >= 2)})")
    for (accum, ns, mtp, ac), r in results.items():
        what = f"global {args.batch * accum:>3}, NS {ns}, MTP {'on' if mtp else 'off'}{', autocast bf16' if ac else ''}"
        print(f"  MFU vs measured GEMM peak ({what})  "
              f"{100 * r['mfu']:6.1f} %  (goal >= 30 %: {ok(r['mfu'] >= 0.30)})")
    on, off = results[1, "fp32", True, False], results[1, "fp32", False, False]
    print(f"  MTP cost (global {args.batch}): fwd+bwd {on['compute_s'] * 1e3:.0f} ms with, {off['compute_s'] * 1e3:.0f} ms "
          f"without ({100 * (on['compute_s'] / off['compute_s'] - 1):.0f} % more; each row's MFU uses its own FLOPs/token)")
    print(f"  Muon 10-step fp32 / torch 5-step      {mo / mt:6.2f}x   (goal <= 2.2x: {ok(mo / mt <= 2.2)})")
    print(f"  Muon 10-step mixed / torch 5-step     {mm / mt:6.2f}x   (goal <= 2.2x: {ok(mm / mt <= 2.2)})")


if __name__ == "__main__":
    main()
