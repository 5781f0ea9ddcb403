"""Small building blocks: RMSNorm, rotary embedding, dense SwiGLU FFN, packed-document helpers."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

TUNED: dict[str, Callable[..., torch.Tensor | None]] = {}
"""Tuned replacements ("rmsnorm", "swiglu", "rope", "router", "grouped_gemm") installed by trex.trainer.kernels from
trainer.kernels.registry; each returns None when it has no kernel for the call's device, dtype and shape class,
and the eager code runs ("router" returns the pair (weights, indices))."""


def same(t: torch.Tensor) -> torch.Tensor:
    """The identity: what the ``param_hook`` seams of the norms and mHC mappings do in one process."""
    return t


ParamHook = Callable[[torch.Tensor], torch.Tensor]
"""Applied to a parameter at each use: the identity (:func:`same`) unless a parallel layer installs one (under
tensor parallelism the residual's norms and mHC mappings run on a token slice, so trex.trainer.parallel
.parallelize makes the hook sum their gradients over the tp ranks)."""


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The rank-local part of a tensor: a DTensor's local shard (parameters the parallel layer distributed),
    the tensor itself otherwise."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def upcast(x: torch.Tensor) -> torch.Tensor:
    """x in at least fp32 (float64 stays float64, so a float64 model is float64 end to end)."""
    return x if x.dtype == torch.float64 else x.float()


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale, computed in (at least) fp32.

    ``scale_in_fp32`` (DeepSeek-V4) multiplies by the scale before casting back; otherwise the
    normalised value is cast first (DeepSeek-V3). The two agree whenever the input is fp32 or wider.
    """

    def __init__(self, dim: int, eps: float = 1e-6, scale_in_fp32: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.scale_in_fp32 = scale_in_fp32
        self.weight = nn.Parameter(torch.ones(dim))
        self.param_hook: ParamHook = same
        """Applied to the weight at each use (see :data:`ParamHook`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.param_hook(self.weight)
        tuned = TUNED.get("rmsnorm")
        if tuned is not None and (out := tuned(x, weight, self.eps)) is not None:
            return out
        dtype = x.dtype
        if dtype == torch.float32 and weight.dtype == torch.float32:
            # one fused op, same math as the reference below (fp32 throughout)
            return F.rms_norm(x, (x.shape[-1],), weight, self.eps)
        h = upcast(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.scale_in_fp32:
            return (weight * h).to(dtype)
        return weight * h.to(dtype)


def unit_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS normalisation without a scale (V4's query heads and mHC inputs), statistics in >= fp32."""
    return x * torch.rsqrt(upcast(x).square().mean(-1, keepdim=True) + eps).to(x.dtype)


def rope_inv_freq(dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """Inverse frequencies of the `dim/2` rotary pairs."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))


def rope_cos_sin(position_ids: torch.Tensor, dim: int, theta: float,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, T, dim/2] for integer positions (computed per call: no 1M-token tables). The
    frequencies are fp32 (as released); angles are formed in ``dtype`` (float64 for a float64 model)."""
    inv = rope_inv_freq(dim, theta, position_ids.device).to(dtype)
    ang = position_ids.to(dtype)[..., None] * inv
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool = True) -> torch.Tensor:
    """Rotate interleaved pairs (x0, x1), (x2, x3), ... as DeepSeek does (complex multiply), or with
    ``interleave=False`` the pairs (x_i, x_{i+D/2}) (transformers' rotate_half layout).

    x: [B, T, H, D] (or [B, T, D] with cos/sin broadcast); cos/sin: [B, T, D/2].
    """
    tuned = TUNED.get("rope")
    if tuned is not None and not interleave and (out := tuned(x, cos, sin)) is not None:
        return out
    if x.dim() == 4:
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    xf = upcast(x)
    if not interleave:
        x1, x2 = xf.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return out.to(x.dtype)


def apply_rope_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rope on the trailing 2 * cos.shape[-1] channels of x (V4's [nope | rope] heads)."""
    rope = 2 * cos.shape[-1]
    nope, tail = torch.split(x, [x.shape[-1] - rope, rope], dim=-1)
    return torch.cat([nope, apply_rope(tail, cos, sin)], dim=-1)


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(gate) * up with the V4 clamp: gate capped at `limit`, up clamped to [-limit, limit] (0 = off)."""
    tuned = TUNED.get("swiglu")
    if tuned is not None and (out := tuned(gate, up, limit)) is not None:
        return out
    if limit > 0:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    return F.silu(gate) * up


class MLP(nn.Module):
    """SwiGLU feed-forward: down(swiglu(gate(x), up(x))); HF DeepSeek-V3 names. ``limit`` > 0 clamps
    like DeepSeek-V4's shared experts."""

    def __init__(self, dim: int, hidden: int, limit: float = 0.0) -> None:
        super().__init__()
        self.limit = limit
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), self.limit))
        return out


def positions_from_docs(doc_ids: torch.Tensor) -> torch.Tensor:
    """Positions that restart at 0 at every document start: [B, T] long."""
    b, t = doc_ids.shape
    idx = torch.arange(t, device=doc_ids.device).expand(b, t)
    start = torch.ones_like(doc_ids, dtype=torch.bool)
    start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = torch.where(start, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - first


def causal_doc_mask(doc_ids: torch.Tensor | None, b: int, t: int, device: torch.device,
                    window: int | None = None) -> torch.Tensor:
    """Boolean [B, 1, T, T]: key j visible to query i iff j <= i, same document, and i - j < window."""
    i = torch.arange(t, device=device)
    allowed = i[None, :] <= i[:, None]
    if window is not None:
        allowed = allowed & (i[:, None] - i[None, :] < window)
    mask = allowed.expand(b, t, t)
    if doc_ids is not None:
        mask = mask & (doc_ids[:, :, None] == doc_ids[:, None, :])
    return mask[:, None]
