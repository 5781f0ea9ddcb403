"""Hugging Face DeepSeek-V3 parity: our save -> transformers from_pretrained, transformers save -> our load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.hf_float64 import from_pretrained_float64, hf_float64
from trex.trainer.hf import args_from_hf_config, from_hf_state_dict, hf_config_from_args, load_hf, save_hf
from trex.trainer.model import ModelArgs, build_model_from_args

transformers = pytest.importorskip("transformers")

ARGS: dict[str, Any] = dict(vocab_size=128, hidden_size=32, num_layers=3, num_heads=2, kv_lora_rank=16, qk_nope_head_dim=8,
            qk_rope_head_dim=8, v_head_dim=8, intermediate_size=64, moe_intermediate_size=16, n_dense_layers=1,
            n_routed_experts=8, experts_per_token=2, n_groups=4, topk_groups=2, routed_scaling_factor=2.5,
            swiglu_limit=0.0, hc_mult=1, scoring="sigmoid", attention="mla", n_hash_layers=0)


@pytest.mark.slow
@pytest.mark.parametrize("q_lora_rank", [0, 16])
def test_forward_parity_with_transformers(tmp_path: Path, q_lora_rank: int) -> None:
    args = ModelArgs(**ARGS, q_lora_rank=q_lora_rank, mtp_depth=1)
    ours = build_model_from_args(args, seed=1).eval()
    with torch.no_grad():
        for _, gate in ours.moe_gates():
            gate.e_score_correction_bias.normal_(0, 0.1)  # exercised by selection on both sides
    save_hf(ours, tmp_path / "ours")
    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    hf = transformers.DeepseekV3ForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.float32).eval()
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids).logits
        mine = ours(ids).logits
    assert torch.allclose(mine, ref, atol=1e-5, rtol=1e-5)

    # the other direction: transformers writes, we read
    hf.save_pretrained(tmp_path / "theirs")
    back = load_hf(tmp_path / "theirs").eval()
    with torch.no_grad():
        assert torch.allclose(back(ids).logits, ref, atol=1e-5, rtol=1e-5)
    # the in-memory layout of this transformers version (stacked experts, gate_up_proj) maps too
    stacked = from_hf_state_dict(back, dict(hf.state_dict()))
    assert any(k.endswith("experts.gate_proj") for k in stacked)
    fresh = build_model_from_args(args, seed=5).eval()
    missing, unexpected = fresh.load_state_dict(stacked, strict=False)
    assert not unexpected and all(k.startswith("mtp.") for k in missing)
    with torch.no_grad():
        assert torch.allclose(fresh(ids).logits, ref, atol=1e-5, rtol=1e-5)
    trunk = [(n, g) for n, g in ours.moe_gates() if n.startswith("layers.")]
    loaded = dict(back.moe_gates())
    for name, gate in trunk:  # transformers drops MTP layers when it saves; the trunk routers survive
        assert torch.equal(loaded[name].e_score_correction_bias, gate.e_score_correction_bias)


def test_save_load_roundtrip_keeps_mtp(tmp_path: Path) -> None:
    args = ModelArgs(**ARGS, q_lora_rank=16, mtp_depth=1)
    ours = build_model_from_args(args, seed=2).eval()
    save_hf(ours, tmp_path, max_shard_bytes=64 * 1024)  # forces several shards + index
    assert (tmp_path / "model.safetensors.index.json").exists()
    back = load_hf(tmp_path).eval()
    for (n1, p1), (n2, p2) in zip(ours.state_dict().items(), back.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2), n1


def test_hf_config_rejects_v4_features_naming_the_field() -> None:
    for field, value in (("hc_mult", 4), ("scoring", "sqrt-softplus"), ("n_hash_layers", 1)):
        kw = {**ARGS, field: value}
        with pytest.raises(ValueError, match=field):
            hf_config_from_args(ModelArgs(**kw))
    cfg = hf_config_from_args(ModelArgs(**ARGS))
    assert cfg["q_lora_rank"] is None and cfg["first_k_dense_replace"] == 1 and cfg["n_group"] == 4
    assert args_from_hf_config(cfg).n_groups == 4
    bad = dict(cfg)
    del bad["kv_lora_rank"]
    with pytest.raises(ValueError, match="kv_lora_rank"):
        args_from_hf_config(bad)


def _hf_parity(tmp_path: Path, args: ModelArgs, dtype: torch.dtype) -> float:
    ours = build_model_from_args(args, seed=1, dtype=dtype).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "layernorm" in name or "norm.weight" in name:
                p.add_(torch.randn_like(p) * 0.3)  # so the norm eps and scales matter
        for _, gate in ours.moe_gates():
            gate.e_score_correction_bias.normal_(0, 0.1)
    save_hf(ours, tmp_path)
    cls = transformers.DeepseekV3ForCausalLM
    hf = (from_pretrained_float64(cls, tmp_path) if dtype == torch.float64
          else cls.from_pretrained(tmp_path, dtype=dtype)).eval()
    hf.config._experts_implementation = "eager"
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), hf_float64():
        ref = hf(ids).logits
    with torch.no_grad():
        mine = ours(ids).logits
    return float((mine - ref).abs().max())


@pytest.mark.parametrize("option", [{"norm_topk_prob": False}, {"rope_interleave": False},
                                    {"norm_eps": 1e-3}], ids=["norm_topk_prob", "rope_interleave", "latent_eps"])
def test_v3_options_match_transformers(tmp_path: Path, option: dict[str, Any]) -> None:
    """Each of these was silently ignored (or used the wrong eps) before; now they follow config.json."""
    args = ModelArgs(**{**ARGS, "q_lora_rank": 16, "mtp_depth": 0, "init_std": 0.2, **option})
    assert _hf_parity(tmp_path, args, torch.float32) < 1e-5
    cfg = json.loads((tmp_path / "config.json").read_text())
    back = args_from_hf_config(cfg)
    for key, value in option.items():
        assert getattr(back, key) == value


def test_v3_float64_forward_matches_transformers(tmp_path: Path) -> None:
    """A float64 model runs on CPU (no float64 grouped GEMM: the per-expert loop) and matches to 1e-10."""
    args = ModelArgs(**{**ARGS, "q_lora_rank": 16, "mtp_depth": 1, "init_std": 0.2})
    assert _hf_parity(tmp_path, args, torch.float64) < 1e-10


def test_v3_export_with_an_active_clamp_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = build_model_from_args(ModelArgs(**{**ARGS, "swiglu_limit": 10.0}))
    with caplog.at_level("WARNING"):
        save_hf(model, tmp_path)
    assert "swiglu_limit" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        save_hf(build_model_from_args(ModelArgs(**ARGS)), tmp_path / "off")
    assert "swiglu_limit" not in caplog.text
