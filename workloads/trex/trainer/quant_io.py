"""Block-quantized tensors in a checkpoint: which to quantize on save, how to find and undo them on load.

A quantized tensor `K` is stored with a sibling `K_scale_inv` (`X.weight` -> `X.weight_scale_inv`,
`X.gate_up_proj` -> `X.gate_up_proj_scale_inv`); DeepSeek's original files may name it `X.scale`.
The stored dtype tells the format: float8_e4m3fn is block FP8, int8 is packed FP4.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_NOT_QUANTIZED = re.compile(
    r"(embed|lm_head|head\.weight|norm|\.gate\.|(compressor|indexer)\.(kv_proj|gate_proj|wkv|wgate)|weights_proj|"
    r"hc_|_hc\.|sinks|attn_sink|position_bias|ape|tid2eid|bias|eh_proj)")
"""Tensors that stay in full precision, as in DeepSeek's releases: embedding, head, norms, routers,
the compressors' pooling projections and indexer head weights, mHC and other small parameters."""
_EXPERT = re.compile(r"experts\.(gate_up_proj|down_proj|\d+\.w[123]\.weight|\d+\.(gate|up|down)_proj\.weight)$")
"""Routed experts in every layout: V4's stacked and original names, DeepSeek-V3's one tensor per expert."""


def _scale_name(key: str) -> str:
    return key + "_scale_inv"


def quant_kind(key: str, ndim: int, floating: bool, fp4_experts: bool) -> str | None:
    """How quantize_tensors stores tensor ``key``: 'fp8', 'fp4' or None (full precision)."""
    if ndim < 2 or not floating or _NOT_QUANTIZED.search(key):
        return None
    return "fp4" if fp4_experts and _EXPERT.search(key) else "fp8"


def quantized_entries(key: str, shape: tuple[int, ...], kind: str | None,
                      dtype: torch.dtype) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of what quantize_tensors writes for one tensor of ``shape``: the tensor itself, or
    the quantized weight and its ``_scale_inv`` sibling."""
    import torch

    from trex.trainer.model.quant import FP4_BLOCK, FP8_BLOCK

    if kind is None:
        return [(key, shape, dtype)]
    lead, (rows, cols) = shape[:-2], shape[-2:]
    if kind == "fp4":
        if cols % FP4_BLOCK:
            raise ValueError(f"checkpoint.exportQuant=fp8-fp4: {key} has {cols} input columns; FP4 stores 1 x "
                             f"{FP4_BLOCK} blocks (use fp8)")
        return [(key, (*lead, rows, cols // 2), torch.int8),
                (_scale_name(key), (*lead, rows, cols // FP4_BLOCK), torch.float32)]
    grid = (*lead, -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
    return [(key, shape, torch.float8_e4m3fn), (_scale_name(key), grid, torch.float32)]


def quantize_tensors(tensors: dict[str, torch.Tensor], fp4_experts: bool) -> dict[str, torch.Tensor]:
    """FP8 (128 x 128 blocks) for every >= 2-D GEMM weight; with ``fp4_experts`` the routed experts as
    packed FP4 (1 x 32 blocks, power-of-two scales) instead."""
    from trex.trainer.model.quant import fp4_quantize, fp8_quantize

    out: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        kind = quant_kind(key, t.dim(), t.is_floating_point(), fp4_experts)
        if kind is None:
            out[key] = t
        elif kind == "fp4":
            out[key], out[_scale_name(key)] = fp4_quantize(t)
        else:
            out[key], out[_scale_name(key)] = fp8_quantize(t)
    return out


def dequantize_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every quantized tensor replaced by its fp32 value; the scale siblings removed."""
    import torch

    from trex.trainer.model.quant import fp4_dequantize, fp8_dequantize

    scales = {}
    for key in tensors:
        for cand in (_scale_name(key), key.removesuffix(".weight") + ".scale" if key.endswith(".weight") else ""):
            if cand and cand in tensors:
                scales[key] = cand
    out: dict[str, torch.Tensor] = {}
    used = set(scales.values())
    for key, t in tensors.items():
        if key in used:
            continue
        if key not in scales:
            out[key] = t
        elif t.dtype == torch.float8_e4m3fn:
            out[key] = fp8_dequantize(t, tensors[scales[key]])
        elif t.dtype in (torch.int8, torch.uint8):
            out[key] = fp4_dequantize(t, tensors[scales[key]])
        else:
            raise ValueError(f"{key}: has a scale but dtype {t.dtype} is neither float8_e4m3fn nor packed FP4 (int8)")
    return out


def quantization_config(fp4_experts: bool) -> dict[str, Any]:
    """config.json quantization_config of what quantize_tensors wrote (transformers' fine-grained FP8 keys)."""
    cfg: dict[str, Any] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                           "weight_block_size": [128, 128]}
    if fp4_experts:
        cfg["expert_dtype"] = "fp4"
    return cfg
