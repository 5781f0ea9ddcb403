"""Block-quantized tensors in a checkpoint: which to quantize on save, how to find and undo them on load.

A quantized tensor `K` is stored with a sibling `K_scale_inv` (`X.weight` -> `X.weight_scale_inv`,
`X.gate_up_proj` -> `X.gate_up_proj_scale_inv`); DeepSeek's original files may name it `X.scale`.
The stored dtype tells the format: float8_e4m3fn is block FP8, int8 is packed FP4. Loading dequantizes
per slice (:func:`read_dequantized`): a rank reads only the blocks and scales of the part it holds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_NOT_QUANTIZED = re.compile(
    r"(embed|lm_head|head\.weight|norm|\.gate\.|(compressor|indexer)\.(kv_proj|gate_proj|wkv|wgate)|weights_proj|"
    r"hc_|_hc\.|sinks|attn_sink|position_bias|ape|tid2eid|bias|eh_proj)")
"""Tensors that stay in full precision, as in DeepSeek's releases: embedding, head, norms, routers,
the compressors' pooling projections and indexer head weights, mHC and other small parameters."""
_EXPERT = re.compile(r"experts\.(gate_up_proj|down_proj|\d+\.w[123]\.weight)$")


def _scale_name(key: str) -> str:
    return key + "_scale_inv"


def quantize_tensors(tensors: dict[str, torch.Tensor], fp4_experts: bool) -> dict[str, torch.Tensor]:
    """FP8 (128 x 128 blocks) for every >= 2-D GEMM weight; with ``fp4_experts`` the routed experts as
    packed FP4 (1 x 32 blocks, power-of-two scales) instead."""
    from trex.trainer.model.quant import fp4_quantize, fp8_quantize

    out: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        if t.dim() < 2 or not t.is_floating_point() or _NOT_QUANTIZED.search(key):
            out[key] = t
            continue
        if fp4_experts and _EXPERT.search(key):
            out[key], out[_scale_name(key)] = fp4_quantize(t)
        else:
            out[key], out[_scale_name(key)] = fp8_quantize(t)
    return out


def scale_siblings(keys: Iterable[str]) -> dict[str, str]:
    """Quantized tensor name -> its scale sibling's name (``K_scale_inv`` or DeepSeek's ``X.scale``), for the
    names present in ``keys``."""
    present = set(keys)
    out: dict[str, str] = {}
    for key in present:
        for cand in (_scale_name(key), key.removesuffix(".weight") + ".scale" if key.endswith(".weight") else ""):
            if cand and cand in present:
                out[key] = cand
    return out


FP8_DTYPES = ("F8_E4M3",)
FP4_DTYPES = ("I8", "U8")
"""safetensors dtype names of block FP8 (e4m3) and packed FP4 (two e2m1 codes per byte) weights."""


def dequantized_shape(shape: tuple[int, ...], dtype: str, quantized: bool) -> tuple[int, ...]:
    """The value's shape of a stored tensor: packed FP4 holds two columns per byte."""
    if quantized and dtype in FP4_DTYPES:
        return (*shape[:-1], 2 * shape[-1])
    return shape


def _aligned(start: int, stop: int, block: int, size: int) -> tuple[int, int]:
    return start // block * block, min(-(-stop // block) * block, size)


def read_dequantized(read: Callable[[str, tuple[slice, ...]], torch.Tensor], key: str, scale: str | None,
                     dtype: str, shape: tuple[int, ...], box: list[tuple[int, int]]) -> torch.Tensor:
    """The box ``[start, stop)`` per dim of tensor ``key``'s value (fp32 when quantized), reading only that box
    widened to whole scale blocks, and the matching box of its scales: FP8 e4m3 blocks are 128 x 128 over the
    last two dims, FP4 blocks 1 x 32 over the last. ``read(name, slices)`` returns a stored slice; ``shape``
    is the value's (dequantized) shape."""
    import torch

    from trex.trainer.model.quant import FP4_BLOCK, FP8_BLOCK, fp4_dequantize, fp8_dequantize

    slices = tuple(slice(a, b) for a, b in box)
    if scale is None:
        return read(key, slices)
    if any(b <= a for a, b in box):
        return torch.empty([b - a for a, b in box], dtype=torch.float32)
    if dtype in FP8_DTYPES:
        (r0, r1), (c0, c1) = box[-2:]
        ar0, ar1 = _aligned(r0, r1, FP8_BLOCK, shape[-2])
        ac0, ac1 = _aligned(c0, c1, FP8_BLOCK, shape[-1])
        lead = slices[:-2]
        w = read(key, (*lead, slice(ar0, ar1), slice(ac0, ac1)))
        s = read(scale, (*lead, slice(ar0 // FP8_BLOCK, -(-ar1 // FP8_BLOCK)),
                         slice(ac0 // FP8_BLOCK, -(-ac1 // FP8_BLOCK))))
        return fp8_dequantize(w, s)[..., r0 - ar0:r1 - ar0, c0 - ac0:c1 - ac0]
    if dtype in FP4_DTYPES:
        c0, c1 = box[-1]
        ac0, ac1 = _aligned(c0, c1, FP4_BLOCK, shape[-1])
        lead = slices[:-1]
        w = read(key, (*lead, slice(ac0 // 2, ac1 // 2)))
        s = read(scale, (*lead, slice(ac0 // FP4_BLOCK, -(-ac1 // FP4_BLOCK))))
        return fp4_dequantize(w, s)[..., c0 - ac0:c1 - ac0]
    raise ValueError(f"{key}: has a scale but dtype {dtype} is neither F8_E4M3 nor packed FP4 (I8/U8)")


def quantization_config(fp4_experts: bool) -> dict[str, Any]:
    """config.json quantization_config of what quantize_tensors wrote (transformers' fine-grained FP8 keys)."""
    cfg: dict[str, Any] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                           "weight_block_size": [128, 128]}
    if fp4_experts:
        cfg["expert_dtype"] = "fp4"
    return cfg
