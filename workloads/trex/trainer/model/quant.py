"""DeepSeek's block-quantized weight formats and V4-style FP4 quantization-aware training.

* FP8: ``float8_e4m3fn`` weight [N, K] with one fp32 scale per 128 x 128 block, ``weight_scale_inv``
  [ceil(N/128), ceil(K/128)]; value = fp8 * scale (DeepSeek-V3 and V4 dense weights).
* FP4: e2m1 codes packed two per byte (element 2j in the low nibble) in an ``int8`` tensor [N, K/2],
  one scale per row and 32 columns, ``weight_scale_inv`` [N, K/32] (fp32, or ``float8_e8m0fnu``
  powers of two); value = e2m1 * scale (DeepSeek-V4 routed experts, ``expert_dtype: fp4``).

The layouts follow transformers' finegrained-FP8 loader (``Fp8Dequantize``), which reads both.
"""

from __future__ import annotations

import torch

FP8_BLOCK = 128
FP4_BLOCK = 32
FP8_MAX = 448.0
FP4_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""Magnitudes of the 3-bit e2m1 code; bit 3 of a nibble is the sign."""


def _block_scale_grid(scale: torch.Tensor, rows: int, cols: int, block_r: int, block_c: int) -> torch.Tensor:
    """Expand a per-block scale grid [..., R, C] to the weight's [..., rows, cols]."""
    full = scale.repeat_interleave(block_r, dim=-2).repeat_interleave(block_c, dim=-1)
    return full[..., :rows, :cols]


def fp8_dequantize(weight: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Block-scaled FP8 e4m3 [..., N, K] x scales [..., ceil(N/128), ceil(K/128)] -> ``dtype``."""
    rows, cols = weight.shape[-2:]
    s = _block_scale_grid(scale_inv.to(torch.float32), rows, cols, FP8_BLOCK, FP8_BLOCK)
    return (weight.to(torch.float32) * s).to(dtype)


def fp8_quantize(w: torch.Tensor, pow2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, fp32 scale per 128 x 128 block): each block's amax maps to 448 (``pow2``: the
    scale is rounded up to a power of two, so FP4 values times power-of-two scales stay exact)."""
    rows, cols = w.shape[-2:]
    pad_r, pad_c = -rows % FP8_BLOCK, -cols % FP8_BLOCK
    wf = torch.nn.functional.pad(w.detach().to(torch.float32), (0, pad_c, 0, pad_r))
    lead = wf.shape[:-2]
    r, c = wf.shape[-2] // FP8_BLOCK, wf.shape[-1] // FP8_BLOCK
    blocks = wf.reshape(*lead, r, FP8_BLOCK, c, FP8_BLOCK)
    amax = blocks.abs().amax(dim=(-3, -1))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    if pow2:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (blocks / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    q = q.reshape(wf.shape)[..., :rows, :cols].to(torch.float8_e4m3fn)
    return q, scale


def _e2m1_lut(device: torch.device) -> torch.Tensor:
    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def fp4_unpack(packed: torch.Tensor) -> torch.Tensor:
    """int8 [..., K/2] of two e2m1 nibbles (low nibble first) -> fp32 [..., K]."""
    u8 = packed.contiguous().view(torch.uint8).long()
    lut = _e2m1_lut(packed.device)
    vals = torch.stack([lut[u8 & 0xF], lut[(u8 >> 4) & 0xF]], dim=-1)
    return vals.reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def fp4_dequantize(packed: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Packed FP4 [..., N, K/2] x scales [..., N, K/32] (fp32 or e8m0) -> ``dtype`` [..., N, K]."""
    vals = fp4_unpack(packed)
    s = scale_inv.to(torch.float32).repeat_interleave(FP4_BLOCK, dim=-1)[..., : vals.shape[-1]]
    return (vals * s).to(dtype)


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code (sign in bit 3) of values already scaled into [-6, 6]; ties to the even code."""
    mags = torch.tensor(E2M1_VALUES, dtype=x.dtype, device=x.device)
    a = x.abs().clamp(max=FP4_MAX)
    mid = (mags[1:] + mags[:-1]) / 2
    idx = torch.bucketize(a, mid)  # index of the nearest magnitude; at a midpoint, the lower one
    at_mid = (idx < len(E2M1_VALUES) - 1) & (a == mid[idx.clamp(max=len(E2M1_VALUES) - 2)])
    idx = torch.where(at_mid & (idx % 2 == 1), idx + 1, idx)
    return idx | ((x < 0) & (idx > 0)).long() << 3


def fp4_scales(w: torch.Tensor) -> torch.Tensor:
    """Power-of-two scale per row and 32 columns [..., N, K/32]: the smallest 2^e with amax / 2^e <= 6."""
    wf = w.detach().to(torch.float32)
    blocks = wf.reshape(*wf.shape[:-1], -1, FP4_BLOCK)
    amax = blocks.abs().amax(-1)
    e = torch.ceil(torch.log2(torch.where(amax > 0, amax / FP4_MAX, torch.ones_like(amax))))
    return torch.exp2(e)


def fp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed int8 [..., N, K/2], fp32 power-of-two scales [..., N, K/32]); K must be a multiple of 32."""
    if w.shape[-1] % FP4_BLOCK:
        raise ValueError(f"FP4 needs the input dimension to be a multiple of {FP4_BLOCK}, got {w.shape[-1]}")
    scale = fp4_scales(w)
    scaled = w.detach().to(torch.float32) / scale.repeat_interleave(FP4_BLOCK, dim=-1)
    codes = _e2m1_codes(scaled)
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    packed = (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8).view(torch.int8)
    return packed, scale


def fp4_round_trip(w: torch.Tensor) -> torch.Tensor:
    """V4's QAT weight: FP4-quantize (1 x 32 power-of-two blocks), then the FP8 e4m3 form the GEMM
    reads (128 x 128 blocks), returned in w's dtype. No gradient."""
    with torch.no_grad():
        packed, scale = fp4_quantize(w)
        deq = fp4_dequantize(packed, scale)
        q8, s8 = fp8_quantize(deq, pow2=True)
        return fp8_dequantize(q8, s8, dtype=w.dtype)


def fp4_fake_quant(w: torch.Tensor) -> torch.Tensor:
    """fp4_round_trip(w) in the forward, identity gradient to the fp32 master (straight-through)."""
    return w + (fp4_round_trip(w) - w).detach()
