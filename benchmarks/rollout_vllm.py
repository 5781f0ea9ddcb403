"""Rollout tokens/s of a vLLM server (CPU build, .venv-vllm) against trex's in-process engine at equal batch,
prompt and response length; the weight push's seconds per GB (Hugging Face export + reload_weights); and the
log-prob mismatch of the two engines on the same tokens.

Usage: python benchmarks/rollout_vllm.py [--preset tiny-vllm] [--overrides '{"hiddenSize": 1024}'] [--batch 16]
       [--prompt 32] [--new 64] [--repeats 3] [--json out.json]

Both engines sample the same batch (temperature 1, no stop token, so every sample has exactly --new tokens) from the
same random weights in fp32; the in-process engine runs in this process (OMP_NUM_THREADS as set), vLLM in its own.
The two are timed in turn, --repeats times, once the server is up (this machine is noisy): the medians count;
the in-process engine is also timed once before the server starts (inprocess_alone), since an idle server's
processes still take CPU time from it on a small machine.
--overrides (model overrides, the TrainJob's camelCase names) scales the model, e.g. to where decoding is
compute-bound rather than bound by per-step overheads.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from trex.config_base import load_section
from trex.prompt_contract import BOS, END, EOS, PAD
from trex.trainer.config import TrainerConfig
from trex.trainer.export import export_hf
from trex.trainer.model import build_model
from trex.trainer.rollout.engine import generate
from trex.trainer.rollout.sampling import SamplingParams
from trex.trainer.rollout.vllm_engine import VLLMEngine
from trex.trainer.rollout.vllm_server import VLLMServer

REPO = Path(__file__).resolve().parents[1]


def tokenizer(vocab_size: int) -> Tokenizer:
    """A word-level tokenizer with the chat layout's special tokens last (the export needs one)."""
    vocab = {f"t{i}": i for i in range(vocab_size - 4)}
    for j, t in enumerate((BOS, EOS, END, PAD)):
        vocab[t] = vocab_size - 4 + j
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny-vllm")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--overrides", default="{}", help="model overrides as JSON (camelCase)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--venv", default=str(REPO / ".venv-vllm"))
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    overrides = json.loads(a.overrides)
    cfg = load_section(TrainerConfig, {"model": {"preset": a.preset, "overrides": overrides}, "device": "cpu"})
    model = build_model(cfg.model, device="cpu", dtype=torch.float32, seed=0).eval()
    vocab = model.args.vocab_size
    tok = tokenizer(vocab)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab - 4, (a.prompt,), generator=g).tolist() for _ in range(a.batch)]
    params = SamplingParams(temperature=1.0, max_new_tokens=a.new)
    tokens = a.batch * a.new
    out: dict[str, float | int | str] = {"preset": a.preset, "overrides": json.dumps(overrides), "batch": a.batch,
                                         "prompt": a.prompt, "new": a.new,
                                         "parameters": sum(p.numel() for p in model.parameters())}

    generate(model, prompts[:2], SamplingParams(temperature=1.0, max_new_tokens=2), 0)  # warm-up
    t0 = time.perf_counter()
    ref = generate(model, prompts, params, 0)
    out["inprocess_alone_tokens_per_s"] = tokens / (time.perf_counter() - t0)  # before any server runs

    root = Path(tempfile.mkdtemp(prefix="rollout-vllm-"))
    try:
        folder = export_hf(model, tok, root / "initial")
        server = VLLMServer(folder, venv=Path(a.venv), max_model_len=a.prompt + a.new + 8,
                            log_path=root / "server.log").start()
        try:
            out["server_start_seconds"] = server.wait_ready(600)
            engine = VLLMEngine([server.url], root / "weights")
            pushes = [engine.push(lambda d: export_hf(model, tok, d), v) for v in range(3)]
            best = min(pushes[1:], key=lambda p: p.export_seconds + p.reload_seconds)
            gb = best.bytes / 1e9
            out.update(push_bytes=best.bytes, push_export_seconds=best.export_seconds,
                       push_reload_seconds=best.reload_seconds,
                       push_seconds_per_gb=(best.export_seconds + best.reload_seconds) / gb)
            engine.generate(prompts[:2], SamplingParams(temperature=1.0, max_new_tokens=2), 0)  # warm-up
            inproc, vllm = [], []
            for _ in range(a.repeats):  # in turn, so both see the same machine
                t0 = time.perf_counter()
                generate(model, prompts, params, 0)
                inproc.append(tokens / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                got = engine.generate(prompts, params, 0)
                vllm.append(sum(len(r.tokens) for r in got) / (time.perf_counter() - t0))
            out["inprocess_tokens_per_s"] = statistics.median(inproc)
            out["vllm_tokens_per_s"] = statistics.median(vllm)
            vllm_lp = torch.tensor([x for p, r in zip(prompts, ref, strict=True) for x in engine.score(p, r.tokens)],
                                   dtype=torch.float64)
            trex_lp = torch.tensor([x for r in ref for x in r.logprobs], dtype=torch.float64)
            d = (vllm_lp - trex_lp).abs()
            out.update(mismatch_mean=float(d.mean()), mismatch_max=float(d.max()),
                       mismatch_corr=float(torch.corrcoef(torch.stack([vllm_lp, trex_lp]))[0, 1]))
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["speedup"] = float(out["vllm_tokens_per_s"]) / float(out["inprocess_tokens_per_s"])
    out["speedup_vs_alone"] = float(out["vllm_tokens_per_s"]) / float(out["inprocess_alone_tokens_per_s"])
    for k, v in out.items():
        print(f"{k:24s} {v:.4g}" if isinstance(v, float) else f"{k:24s} {v}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
