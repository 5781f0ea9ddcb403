"""Hugging Face DeepSeek-V3 parity: our save -> transformers from_pretrained, transformers save -> our load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
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
    for field, value in (("attention", "csa"), ("hc_mult", 4), ("scoring", "sqrt-softplus"), ("n_hash_layers", 1)):
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
