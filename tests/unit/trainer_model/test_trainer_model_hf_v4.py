"""DeepSeek-V4 parity with transformers' DeepseekV4ForCausalLM (logits and loss, fp32 and float64, both
directions) and the two checkpoint layouts (transformers' names, DeepSeek's original names)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.hf_float64 import from_pretrained_float64, hf_float64
from trex.trainer.config import RoutingConfig
from trex.trainer.hf import args_from_hf_dir, load_hf, save_hf
from trex.trainer.hf_v4 import detect_v4_layout
from trex.trainer.model import ModelArgs, build_model_from_args, compute_loss

transformers = pytest.importorskip("transformers")

BASE: dict[str, Any] = dict(
    attention="csa", vocab_size=64, hidden_size=32, num_heads=4, q_lora_rank=16, qk_nope_head_dim=12,
    qk_rope_head_dim=4, v_head_dim=16, hc_mult=4, csa_compress_every=4, hca_compress_every=8, csa_top_k=3,
    csa_window=6, csa_indexer_heads=8, csa_indexer_dim=8, scoring="sqrt-softplus", n_routed_experts=4,
    experts_per_token=2, moe_intermediate_size=16, o_groups=2, o_lora_rank=8, routed_scaling_factor=1.5,
    swiglu_limit=0.3, init_std=0.1, n_dense_layers=0, n_shared_experts=1, mtp_depth=1,
)
# one tiny model per layer kind, and one mixing them (hash-routed and routed MoE in every case but "csa")
KINDS: dict[str, dict[str, Any]] = {
    "sliding": dict(num_layers=2, layer_types=["sliding", "sliding"], n_hash_layers=1),
    "csa": dict(num_layers=2, layer_types=["csa", "csa"], n_hash_layers=0, scoring="sigmoid"),
    "hca": dict(num_layers=2, layer_types=["hca", "hca"], n_hash_layers=1),
    "mixed": dict(num_layers=4, layer_types=["sliding", "hca", "csa", "csa"], n_hash_layers=2),
}
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
T = 29  # not a multiple of either compression rate: trailing partial windows are never visible


def _args(kind: str) -> ModelArgs:
    return ModelArgs(**{**BASE, **KINDS[kind]})


@torch.no_grad()
def _perturb(params: dict[str, torch.Tensor], seed: int) -> None:
    """Non-trivial values for what initialises to constants (sinks, biases, mHC gates, norm scales)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(params.items()):
        if p.is_floating_point() and any(s in name for s in ("sink", "position_bias", "ape", "base", "scale",
                                                               "norm", "e_score_correction_bias")):
            p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * 0.3)


def _ours(kind: str, dtype: torch.dtype) -> Any:
    model = build_model_from_args(_args(kind), dtype=dtype, seed=3).eval()
    _perturb(dict(model.named_parameters()) | dict(model.named_buffers()), seed=4)
    return model


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(0))


def _hf_logits_loss(hf: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hf.config._experts_implementation = "eager"  # the grouped-GEMM path has no float64 kernel
    with torch.no_grad(), hf_float64():
        out = hf(input_ids=ids, labels=ids)
    return out.logits, out.loss


def _our_logits_loss(model: Any, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    with torch.no_grad():
        out = model(ids)
        _, parts = compute_loss(out, labels, None, RoutingConfig(), step=0)
    return out.logits, parts["lm"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_parity_trex_to_transformers(tmp_path: Path, kind: str, dtype: torch.dtype) -> None:
    ours = _ours(kind, dtype)
    save_hf(ours, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV4ForCausalLM"]
    cls = transformers.AutoModelForCausalLM
    hf = (from_pretrained_float64(cls, tmp_path) if dtype == torch.float64
          else cls.from_pretrained(tmp_path, dtype=dtype)).eval()
    ids = _ids()
    ref, ref_loss = _hf_logits_loss(hf, ids)
    mine, loss = _our_logits_loss(ours, ids)
    assert ref.abs().max() > 0.1  # the test model is far from trivial
    assert (mine - ref).abs().max().item() < TOL[dtype]
    assert abs(loss - ref_loss.item()) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("kind", ["mixed", "csa"])
def test_parity_transformers_to_trex(tmp_path: Path, kind: str, dtype: torch.dtype) -> None:
    from trex.trainer.hf import hf_config_from_args

    cfg = {k: v for k, v in hf_config_from_args(_args(kind)).items() if k not in ("architectures", "torch_dtype")}
    cfg.pop("model_type")
    torch.manual_seed(7)
    hf = transformers.DeepseekV4ForCausalLM(transformers.DeepseekV4Config(**cfg)).to(dtype).eval()
    _perturb(dict(hf.named_parameters()), seed=8)
    with torch.no_grad():
        for name, buf in hf.named_buffers():
            if name.endswith("tid2eid"):  # a real table: distinct experts per token
                buf.copy_(torch.rand(buf.shape[0], 4, generator=torch.Generator().manual_seed(9)).argsort(-1)[:, :2])
    hf.save_pretrained(tmp_path)
    back = load_hf(tmp_path, dtype=dtype).eval()
    ids = _ids()
    ref, ref_loss = _hf_logits_loss(hf, ids)
    mine, loss = _our_logits_loss(back, ids)
    assert (mine - ref).abs().max().item() < TOL[dtype]
    assert abs(loss - ref_loss.item()) < TOL[dtype]


def test_original_names_load_equals_hf_names_load(tmp_path: Path) -> None:
    ours = _ours("mixed", torch.float32)
    save_hf(ours, tmp_path / "hf")
    save_hf(ours, tmp_path / "orig", layout="original")
    from safetensors.torch import load_file

    hf_keys = set(load_file(tmp_path / "hf" / "model.safetensors"))
    orig_keys = set(load_file(tmp_path / "orig" / "model.safetensors"))
    assert detect_v4_layout(hf_keys) == "hf" and detect_v4_layout(orig_keys) == "original"
    for name in ("embed.weight", "head.weight", "hc_head_fn", "layers.0.attn.attn_sink", "layers.0.attn.wq_a.weight",
                 "layers.0.hc_attn_fn", "layers.0.ffn.gate.tid2eid", "layers.0.ffn.experts.3.w2.weight",
                 "layers.1.attn.compressor.ape", "layers.1.attn.compressor.norm.weight",
                 "layers.2.attn.indexer.compressor.wkv.weight", "layers.2.attn.indexer.wq_b.weight",
                 "layers.2.attn.indexer.weights_proj.weight", "layers.3.ffn.gate.bias",
                 "layers.3.ffn.shared_experts.w3.weight", "mtp.0.e_proj.weight", "mtp.0.h_proj.weight",
                 "mtp.0.hc_head_fn", "mtp.0.norm.weight", "mtp.0.attn.wo_b.weight"):
        assert name in orig_keys, name
    assert args_from_hf_dir(tmp_path / "orig") == args_from_hf_dir(tmp_path / "hf")
    a, b = load_hf(tmp_path / "hf").eval(), load_hf(tmp_path / "orig").eval()
    ids = _ids()
    with torch.no_grad():
        out_a, out_b, out_ref = a(ids), b(ids), ours(ids)
    assert torch.equal(out_a.logits, out_b.logits) and torch.equal(out_a.logits, out_ref.logits)
    assert torch.equal(out_b.mtp_logits[0], out_ref.mtp_logits[0])  # MTP round-trips under its stored names
    bad = {**load_file(tmp_path / "orig" / "model.safetensors"), "layers.0.attn.bogus.weight": torch.zeros(1)}
    from safetensors.torch import save_file

    save_file(bad, tmp_path / "orig" / "model.safetensors")
    with pytest.raises(ValueError, match="bogus"):
        load_hf(tmp_path / "orig")


def test_v4_config_round_trip_and_rejections() -> None:
    from trex.trainer.hf import args_from_hf_config, hf_config_from_args

    args = _args("mixed")
    back = args_from_hf_config(hf_config_from_args(args))
    assert back == ModelArgs(**{**BASE, **KINDS["mixed"], "init_std": 0.02})
    legacy = {**hf_config_from_args(args), "compress_ratios": [0, 8, 4, 4], "num_hash_layers": 2}
    del legacy["layer_types"], legacy["mlp_layer_types"]
    assert args_from_hf_config(legacy).layer_types == ["sliding", "hca", "csa", "csa"]
    assert args_from_hf_config(legacy).n_hash_layers == 2
    for field, value in (("hc_mult", 1), ("n_dense_layers", 1), ("n_groups", 2), ("norm_topk_prob", False),
                         ("swiglu_limit", 0.0)):
        with pytest.raises(ValueError, match=field):
            hf_config_from_args(ModelArgs(**{**BASE, **KINDS["mixed"], field: value,
                                             **({"topk_groups": 1} if field == "n_groups" else {})}))
    with pytest.raises(ValueError, match="yarn"):
        args_from_hf_config({**hf_config_from_args(args),
                             "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 1e4},
                                                 "compress": {"rope_type": "yarn", "factor": 16}}})


def test_export_serves_through_the_trex_checkpoint_model(tmp_path: Path) -> None:
    """export_hf of a V4 model: transformers loads it with equal logits and the trex-checkpoint
    evaluation model generates from it (transformers' V4 cache path)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from trex.evaluation.models.checkpoint import load_checkpoint_model
    from trex.trainer.export import export_hf, export_problem

    words = ["<|bos|>", "<|eos|>", "<|end|>", "<|pad|>", "<|user|>", "<|assistant|>", "[UNK]"] + [
        f"w{i}" for i in range(40)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    ours = _ours("mixed", torch.float32)
    assert export_problem(ours) is None
    out = export_hf(ours, tok, tmp_path / "ckpt" / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = _ids()
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids).logits).abs().max() < 1e-5
    model = load_checkpoint_model(tmp_path / "ckpt", max_new_tokens=5, device="cpu")
    res = model.generate_sync([{"role": "user", "content": "w1 w2 w3"}])
    assert 1 <= res.usage.completion_tokens <= 5
