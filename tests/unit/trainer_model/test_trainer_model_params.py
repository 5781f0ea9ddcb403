"""param_roles coverage, meta-device presets vs the closed-form counts in trex.trainer.mfu, FLOPs by hand."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from trex.trainer.config import ModelConfig, ModelOverrides
from trex.trainer.mfu import (
    FLOPS_CONVENTION,
    device_peak,
    flops_per_token,
    measure_cpu_peak_flops,
    mfu,
    param_breakdown,
)
from trex.trainer.model import ModelArgs, build_model
from trex.trainer.presets import resolve_model_values

VARIANTS = [
    ("tiny", {}),
    ("tiny", {"attention": "csa", "hc_mult": 4, "n_hash_layers": 1, "q_lora_rank": 16, "n_dense_layers": 1,
              "v_head_dim": 24, "layer_types": ["sliding", "csa"]}),
    ("tiny", {"attention": "csa", "hc_mult": 2, "q_lora_rank": 16, "v_head_dim": 24, "layer_types": ["hca", "csa", "hca"]}),
    ("small-cpu", {}),
]


@pytest.mark.parametrize(("preset", "ov"), VARIANTS)
def test_param_roles_cover_every_parameter_once(preset: Any, ov: dict[str, Any]) -> None:
    model = build_model(ModelConfig(preset=preset, overrides=ModelOverrides(**ov)), device="meta")
    roles = model.param_roles()
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == len(set(names)) == len(roles)
    assert set(roles) == set(names)
    params = dict(model.named_parameters())
    assert roles["embed_tokens.weight"] == "adamw"
    assert roles["lm_head.weight"] == "adamw"
    assert roles["norm.weight"] == "adamw"
    for name, role in roles.items():
        p = params[name]
        if p.dim() == 1:
            assert role == "adamw", name
        if name.endswith(("experts.gate_proj", "experts.up_proj", "experts.down_proj")):
            assert p.dim() == 3 and role == "muon", name
        if name.endswith(("hc_attn.base", "hc_attn.scale", "layernorm.weight", "sinks", "position_bias")):
            assert role == "adamw", name
        if name.endswith(("self_attn.o_proj.weight", "mlp.gate.weight", "hc_attn.fn", "self_attn.o_a_proj.weight",
                          "compressor.indexer.q_b_proj.weight")):
            assert role == "muon", name
    assert not any("e_score_correction_bias" in n for n in roles)
    if ov.get("hc_mult"):
        assert roles["layers.0.hc_attn.fn"] == "muon" and params["layers.0.hc_attn.fn"].dim() == 2
        assert roles["hc_head.base"] == "adamw"


@pytest.mark.parametrize("preset", ["v4-flash", "v4-pro", "small-gpu"])
def test_meta_device_presets_match_closed_form_counts(preset: Any) -> None:
    model = build_model(ModelConfig(preset=preset), device="meta", dtype=torch.bfloat16)
    assert all(p.is_meta for p in model.parameters())
    numel = sum(p.numel() for p in model.parameters())
    assert numel == param_breakdown(resolve_model_values(preset, {})).total
    expected = {"v4-flash": (284e9, 13e9), "v4-pro": (1.6e12, 49e9), "small-gpu": (1.0e9, 0.21e9)}[preset]
    b = param_breakdown(resolve_model_values(preset, {}))
    # published DeepSeek-V4 totals / activated parameters, within 10 %
    assert b.total == pytest.approx(expected[0], rel=0.1)
    assert b.active == pytest.approx(expected[1], rel=0.1)


@pytest.mark.parametrize(("preset", "kinds", "published"), [
    ("v4-flash", {"sliding": 2, "csa": 21, "hca": 20}, (284e9, 1e9, 13e9)),
    ("v4-pro", {"sliding": 0, "csa": 30, "hca": 31}, (1.6e12, 1e11, 49e9)),
])
def test_v4_presets_census_matches_the_release(preset: str, kinds: dict[str, int],
                                               published: tuple[float, float, float]) -> None:
    """The released per-layer schedule (config.json compress_ratios, MTP block sliding); the MTP part of the
    count from the model itself; DeepSeek's published totals are the main model without MTP, and its
    activated counts leave out the input embedding too."""
    v = resolve_model_values(preset, {})
    trunk = v["layer_types"][: v["num_layers"]]
    assert {k: trunk.count(k) for k in kinds} == kinds and v["layer_types"][v["num_layers"]:] == ["sliding"]
    model = build_model(ModelConfig(preset=preset), device="meta", dtype=torch.bfloat16)
    params = dict(model.named_parameters())
    mtp = sum(p.numel() for n, p in params.items() if n.startswith("mtp."))
    routed = sum(p.numel() for n, p in params.items() if n.startswith("mtp.") and ".experts." in n)
    b = param_breakdown(v)
    assert b.mtp == mtp
    assert b.mtp_active == mtp - routed + routed * v["experts_per_token"] // v["n_routed_experts"]
    total, unit, activated = published
    assert round(b.main_model / unit) == round(total / unit)
    assert round(b.main_model_activated / 1e9) == round(activated / 1e9)
    assert b.main_model + b.mtp == b.total == sum(p.numel() for p in params.values())
    # a different depth drops the preset's schedule instead of failing validation
    assert resolve_model_values(preset, {"num_layers": 4})["layer_types"] is None


def test_active_params_count_topk_experts_only() -> None:
    model = build_model(ModelConfig(), device="meta")
    a = ModelArgs.from_config(ModelConfig())
    total = sum(p.numel() for p in model.parameters())
    expert_each = 3 * a.moe_intermediate_size * a.hidden_size
    inactive = a.n_moe_layers * (a.n_routed_experts - a.experts_per_token) * expert_each
    assert param_breakdown(resolve_model_values("tiny", {})).active == total - inactive


def test_flops_per_token_tiny_by_hand() -> None:
    v = resolve_model_values("tiny", {})
    # tiny: D=64, V=512, L=2 (+1 MTP), H=4, q_lora 0, kv_lora 32, nope 16, rope 8, v 16, E=8, k=2,
    # moe_inter 32, 1 shared expert, no dense layers
    d, vocab, h = 64, 512, 4
    attn = d * h * 24 + d * (32 + 8) + 32 + 32 * h * (16 + 16) + h * 16 * d
    moe_active = 8 * d + 3 * d * 32 * 1 + 2 * 3 * 32 * d
    block = attn + 2 * d + moe_active
    mtp_extra = 2 * d + 2 * d * d + d
    n_active_non_emb = 3 * block + mtp_extra + d + 2 * vocab * d  # the head runs for the trunk and the MTP module
    t = 128
    expected = 6 * n_active_non_emb + 6 * 3 * h * (24 + 16) * (t / 2)
    assert flops_per_token(v, t) == pytest.approx(expected, rel=1e-12)
    csa = resolve_model_values("tiny", {"attention": "csa", "q_lora_rank": 16, "v_head_dim": 24,
                                        "layer_types": ["sliding", "csa"]})
    # V4 layers: head_dim 24, q_lora 16, o_groups 2 x o_lora 16, sinks; MTP block is sliding
    sliding = (d * 16 + 16 + 16 * h * 24) + (d * 24 + 24) + (h * 24 * 16 + 2 * 16 * d) + h
    pool_main = 2 * d * 48 + 4 * 48 + 24
    pool_idx = 2 * d * 32 + 4 * 32 + 16
    csa_layer = sliding + pool_main + pool_idx + 16 * 2 * 16 + d * 2
    n_csa = (2 * sliding + csa_layer) + 3 * (2 * d + moe_active) + mtp_extra + d + 2 * vocab * d
    keys = 16 + (16 + min(8, t / 4)) + 16  # sliding, csa (window + top-k), MTP sliding
    exp_csa = 6 * n_csa + 6 * h * 48 * keys + 6 * 2 * 16 * t / 8
    assert flops_per_token(csa, t) == pytest.approx(exp_csa, rel=1e-12)


def test_peak_catalog_mfu_and_memory() -> None:
    assert device_peak("H100") == 989e12 == device_peak("h200")
    assert device_peak("910c") == 376e12
    assert device_peak("910b", override=300e12) == 300e12
    with pytest.raises(ValueError, match="unknown device"):
        device_peak("tpu9")
    assert mfu(1000.0, 1e9, 1e13) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="dtype"):
        measure_cpu_peak_flops(seconds=0.02, n=64, dtype="fp8")
    assert "6N" in FLOPS_CONVENTION



@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cpu_peak_is_the_best_timed_run_exactly(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a scripted clock: run 1 takes 0.2 s, run 2 0.1 s, then the 1 s deadline passes; the peak is run 2's
    4 GEMMs of 2 n^3 FLOPs each over 0.1 s, in the dtype asked for."""
    from trex.trainer import mfu as mfu_module

    ticks = iter([0.0, 0.1, 0.3, 0.3, 0.4, 0.5, 1.2])  # deadline base; (start, end, deadline check) x 2
    monkeypatch.setattr(mfu_module.time, "perf_counter", lambda: next(ticks))
    seen: list[torch.dtype] = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: seen.append(a.dtype) or real_mm(a, b))
    assert measure_cpu_peak_flops(seconds=1.0, n=8, dtype=dtype) == pytest.approx(4 * 2 * 8**3 / 0.1, rel=1e-12)
    assert seen == [torch.bfloat16 if dtype == "bf16" else torch.float32] * 9  # a warm-up GEMM, then 4 per run


@pytest.mark.parametrize(("kw", "field"), [
    ({"experts_per_token": 9}, "experts_per_token"),
    ({"n_groups": 3}, "n_groups"),
    ({"n_groups": 4, "topk_groups": 5}, "topk_groups"),
    ({"qk_rope_head_dim": 7}, "qk_rope_head_dim"),
    ({"n_hash_layers": 3}, "n_hash_layers"),
    ({"qat": "fp4-experts", "moe_intermediate_size": 48}, "moe_intermediate_size"),
    ({"attention": "csa", "v_head_dim": 24}, "q_lora_rank"),
    ({"attention": "csa", "q_lora_rank": 8}, "v_head_dim"),
    ({"attention": "csa", "q_lora_rank": 8, "v_head_dim": 24, "o_groups": 5}, "o_groups"),
    ({"attention": "csa", "q_lora_rank": 8, "v_head_dim": 24, "layer_types": ["csa"]}, "layer_types"),
    ({"attention": "csa", "q_lora_rank": 8, "v_head_dim": 24, "layer_types": ["csa", "dense"]}, "layer_types"),
])
def test_model_args_reject_bad_shapes_naming_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ModelArgs(**kw)


def test_model_args_from_config_applies_overrides() -> None:
    a = ModelArgs.from_config(ModelConfig(preset="v4-pro", overrides=ModelOverrides(num_layers=4, hc_mult=2)))
    assert (a.num_layers, a.hc_mult, a.hidden_size, a.attention) == (4, 2, 7168, "csa")
    with pytest.raises(ValueError, match="unknown model field"):
        ModelArgs.from_values({"hidden_size": 8, "bogus": 1})
