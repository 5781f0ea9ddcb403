"""Block-quantized weights: FP8 / FP4 dequantization against element-by-element references written
here, quantized checkpoints round-trip exactly, FP4 QAT forward = quantize-dequantize, STE gradients."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from trex.trainer.hf import load_hf, save_hf
from trex.trainer.model import ModelArgs, build_model_from_args
from trex.trainer.model.quant import (
    fp4_dequantize,
    fp4_fake_quant,
    fp4_quantize,
    fp4_round_trip,
    fp8_dequantize,
    fp8_quantize,
)


def _e2m1_reference(nibble: int) -> float:
    """An e2m1 code by its bit fields: sign (bit 3), exponent (bits 2-1, bias 1), mantissa (bit 0)."""
    sign = -1.0 if nibble & 0b1000 else 1.0
    exp, man = (nibble >> 1) & 0b11, nibble & 1
    mag = man * 0.5 if exp == 0 else 2.0 ** (exp - 1) * (1 + man / 2)
    return sign * mag


def test_fp8_block_dequantization_matches_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    rows, cols = 130, 260  # ragged last blocks in both directions
    q = (torch.randn(rows, cols, generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = torch.rand(math.ceil(rows / 128), math.ceil(cols / 128), generator=gen) + 0.01
    got = fp8_dequantize(q, scale)
    qf = q.to(torch.float32)
    for i in range(0, rows, 17):
        for j in range(0, cols, 13):
            assert got[i, j].item() == (qf[i, j] * scale[i // 128, j // 128]).item()  # one fp32 product
    # the quantizer: every block's amax lands on 448 and the error is within e4m3's half-ulp
    w = torch.randn(200, 300, generator=gen)
    q8, s8 = fp8_quantize(w)
    assert q8.dtype == torch.float8_e4m3fn and s8.shape == (2, 3)
    back = fp8_dequantize(q8, s8)
    assert ((back - w).abs() <= w.abs() * 2**-4 + s8.max() * 2**-9).all()


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float8_e8m0fnu], ids=["fp32", "ue8m0"])
def test_fp4_dequantization_matches_reference(scale_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    rows, cols = 6, 64
    packed = torch.randint(-128, 128, (rows, cols // 2), generator=gen, dtype=torch.int8)
    scale = torch.exp2(torch.randint(-4, 4, (rows, cols // 32), generator=gen).float()).to(scale_dtype)
    got = fp4_dequantize(packed, scale)
    u8 = packed.view(torch.uint8)
    for i in range(rows):
        for j in range(cols):
            byte = int(u8[i, j // 2])
            nibble = byte & 0xF if j % 2 == 0 else byte >> 4  # element 2k in the low nibble
            assert got[i, j].item() == _e2m1_reference(nibble) * scale[i, j // 32].float().item()


def test_fp4_quantizer_picks_the_nearest_code() -> None:
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(4, 64, generator=gen)
    packed, scale = fp4_quantize(w)
    assert packed.dtype == torch.int8 and packed.shape == (4, 32) and scale.shape == (4, 2)
    back = fp4_dequantize(packed, scale)
    grid = torch.tensor(sorted({_e2m1_reference(n) for n in range(16)}))
    for i in range(4):
        for b in range(2):
            s = float(scale[i, b])
            assert w[i, b * 32:(b + 1) * 32].abs().max() <= 6 * s  # the block's amax fits
            for j in range(b * 32, (b + 1) * 32):
                nearest = (grid * s - w[i, j]).abs().min()
                assert abs(float(back[i, j] - w[i, j])) == pytest.approx(float(nearest), abs=1e-7)
    assert torch.equal(fp4_quantize(back)[0], packed)  # representable values quantize to themselves
    with pytest.raises(ValueError, match="multiple of 32"):
        fp4_quantize(torch.zeros(2, 48))


def test_fp4_round_trip_is_exact_in_fp8() -> None:
    """FP4 values with power-of-two scales survive the FP8 stage of V4's QAT recipe unchanged."""
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(3)) * 0.05
    packed, scale = fp4_quantize(w)
    assert torch.equal(fp4_round_trip(w), fp4_dequantize(packed, scale))


QAT = dict(attention="csa", vocab_size=64, hidden_size=64, num_heads=2, q_lora_rank=16, qk_nope_head_dim=24,
           qk_rope_head_dim=8, v_head_dim=32, hc_mult=2, num_layers=2, layer_types=["csa", "hca"],
           csa_compress_every=4, hca_compress_every=8, csa_top_k=2, csa_window=4, csa_indexer_heads=2,
           csa_indexer_dim=32, n_routed_experts=4, experts_per_token=2, moe_intermediate_size=32, o_groups=2,
           o_lora_rank=8, mtp_depth=0, scoring="sqrt-softplus", init_std=0.1)


def test_qat_forward_equals_quantize_dequantize_and_gradients_pass_straight_through() -> None:
    qat = build_model_from_args(ModelArgs(**QAT, qat="fp4-experts"), seed=4)
    plain = build_model_from_args(ModelArgs(**QAT), seed=4)
    with torch.no_grad():
        for name, p in plain.named_parameters():
            if name.endswith(("experts.gate_proj", "experts.up_proj", "experts.down_proj")):
                p.copy_(fp4_round_trip(p))
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(5))
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(6))
    idx = torch.randint(0, 4, (32, 2), generator=torch.Generator().manual_seed(7))
    wts = torch.rand(32, 2, generator=torch.Generator().manual_seed(8))
    e_q, e_p = qat.layers[0].mlp.experts, plain.layers[0].mlp.experts
    y_q, y_p = e_q(x, idx, wts), e_p(x, idx, wts)
    assert torch.equal(y_q, y_p)  # experts: exactly the GEMMs on the quantize-dequantized weights
    y_q.sum().backward()
    y_p.sum().backward()
    for name in ("gate_proj", "up_proj", "down_proj"):  # STE: d/d(master) = d/d(quantized weight)
        g_q, g_p = getattr(e_q, name).grad, getattr(e_p, name).grad
        assert g_q is not None and g_p is not None and torch.equal(g_q, g_p)
    out = qat(ids)
    assert out.logits is not None and torch.isfinite(out.logits).all()
    out.indexer_loss.backward()  # the indexer's quantized QK path trains through the STE
    q_b = qat.layers[0].self_attn.compressor.indexer.q_b_proj.weight
    assert q_b.grad is not None and q_b.grad.abs().sum() > 0
    t = torch.randn(3, 32, requires_grad=True)
    fp4_fake_quant(t).pow(2).sum().backward()
    assert t.grad is not None and torch.equal(t.grad, 2 * fp4_round_trip(t.detach()))


@pytest.mark.parametrize("quant", ["fp8", "fp8-fp4"])
@pytest.mark.parametrize("layout", ["hf", "original"])
def test_quantized_checkpoint_loads_its_dequantized_values(tmp_path: Path, quant: str, layout: str) -> None:
    from safetensors.torch import load_file

    model = build_model_from_args(ModelArgs(**QAT), seed=9).eval()
    save_hf(model, tmp_path, quant=quant, layout=layout)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
    assert ("expert_dtype" in cfg["quantization_config"]) == (quant == "fp8-fp4")
    stored = load_file(tmp_path / "model.safetensors")
    dtypes = {str(t.dtype) for k, t in stored.items() if ".experts." in k and not k.endswith("_scale_inv")}
    assert dtypes == ({"torch.int8"} if quant == "fp8-fp4" else {"torch.float8_e4m3fn"})
    assert any(t.dtype == torch.float8_e4m3fn for k, t in stored.items() if "q_b_proj" in k or "wq_b" in k)
    back = load_hf(tmp_path).eval()
    state = back.state_dict()
    ours = model.state_dict()
    for name, p in ours.items():
        is_expert = name.endswith(("experts.gate_proj", "experts.up_proj", "experts.down_proj"))
        if quant == "fp8" and layout == "hf" and name.endswith(("experts.gate_proj", "experts.up_proj")):
            # transformers' layout quantizes gate and up stacked (gate_up_proj): blocks span both
            base = name.rsplit(".", 1)[0]
            both = torch.cat([ours[f"{base}.gate_proj"], ours[f"{base}.up_proj"]], dim=1)
            gate, up = fp8_dequantize(*fp8_quantize(both)).chunk(2, dim=1)
            expected = gate if name.endswith("gate_proj") else up
        elif quant == "fp8-fp4" and is_expert:
            expected = torch.stack([fp4_dequantize(*fp4_quantize(w)) for w in p])
        elif p.dim() >= 2 and p.is_floating_point() and not any(
                s in name for s in ("embed", "lm_head", "norm", "mlp.gate.", "compressor.kv_proj",
                                    "compressor.gate_proj", "indexer.kv_proj", "indexer.gate_proj", "weights_proj",
                                    "hc_", "position_bias", "tid2eid")):
            expected = torch.stack([fp8_dequantize(*fp8_quantize(w)) for w in p]) if p.dim() == 3 \
                else fp8_dequantize(*fp8_quantize(p))
        else:
            expected = p
        assert torch.equal(state[name], expected), name
