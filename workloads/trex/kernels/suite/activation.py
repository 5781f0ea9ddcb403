"""SwiGLU with clamp: y = silu(min(g, L)) * clamp(u, -L, L), forward and backward.

The gate is capped from above at the limit L; the linear part is clamped to [-L, L]. Gradients follow
torch.clamp's convention (pass-through where the bound is not exceeded, boundaries inclusive).
"""

from __future__ import annotations

from trex.kernels.suite._gen import gen, randn
from trex.kernels.suite.base import EXP_FLOPS, Buffer, Dims, KernelSpec, Tensors

LIMIT = 7.0


def _rc(d: Dims) -> tuple[int, ...]:
    return (d["rows"], d["cols"])


def _inputs_fwd(d: Dims, dtype: str, seed: int) -> Tensors:
    g = gen(seed)
    # scale 4 makes a few percent of the entries exceed the limit so both clamps are exercised
    return {"g": randn(_rc(d), dtype, g, 4.0), "u": randn(_rc(d), dtype, g, 4.0)}


def _eager_fwd(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    import torch
    import torch.nn.functional as F

    lim = s["limit"]
    return {"y": F.silu(torch.clamp(t["g"], max=lim)) * torch.clamp(t["u"], -lim, lim)}


def _ref_fwd(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    import torch

    lim = s["limit"]
    gc = torch.minimum(t["g"], torch.full_like(t["g"], lim))
    uc = torch.maximum(torch.minimum(t["u"], torch.full_like(t["u"], lim)), torch.full_like(t["u"], -lim))
    return {"y": gc / (1.0 + torch.exp(-gc)) * uc}


def _inputs_bwd(d: Dims, dtype: str, seed: int) -> Tensors:
    t = _inputs_fwd(d, dtype, seed)
    return {"dy": randn(_rc(d), dtype, gen(seed + 104729)), "g": t["g"], "u": t["u"]}


def _eager_bwd(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    import torch

    lim = s["limit"]
    g, u, dy = t["g"].float(), t["u"].float(), t["dy"].float()
    gc = torch.clamp(g, max=lim)
    uc = torch.clamp(u, -lim, lim)
    sig = torch.sigmoid(gc)
    silu = gc * sig
    dg = dy * uc * (sig * (1 + gc * (1 - sig))) * (g <= lim)
    du = dy * silu * ((u >= -lim) & (u <= lim))
    return {"dg": dg.to(t["g"].dtype), "du": du.to(t["u"].dtype)}


def _ref_bwd(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    """Autograd through the float64 forward (torch.clamp's inclusive-boundary gradient convention)."""
    import torch
    import torch.nn.functional as F

    lim = s["limit"]
    g = t["g"].clone().requires_grad_(True)
    u = t["u"].clone().requires_grad_(True)
    y = F.silu(torch.clamp(g, max=lim)) * torch.clamp(u, -lim, lim)
    dg, du = torch.autograd.grad(y, (g, u), t["dy"])
    return {"dg": dg, "du": du}


_TAILS = ({"rows": 37, "cols": 1000}, {"rows": 3, "cols": 131}, {"rows": 129, "cols": 17})

SWIGLU_FWD = KernelSpec(
    name="swiglu_clamp_fwd", kclass="elementwise", dim_names=("rows", "cols"),
    inputs=(Buffer("g", "act", _rc), Buffer("u", "act", _rc)), outputs=(Buffer("y", "act", _rc),),
    scalars={"limit": LIMIT}, default_shapes=({"rows": 512, "cols": 2048},), tail_shapes=_TAILS,
    dtypes=("fp32", "bf16"), make_inputs=_inputs_fwd, eager=_eager_fwd, reference=_ref_fwd,
    flops=lambda d: (8.0 + EXP_FLOPS) * d["rows"] * d["cols"],
    bytes_moved=lambda d, e: 3.0 * e * d["rows"] * d["cols"],
    tile_dim="rows", tile_bytes=lambda d, b, e: 3.0 * e * b * d["cols"],
    tol={"fp32": (1e-4, 1e-5), "bf16": (2e-2, 2e-2)},
)

SWIGLU_BWD = KernelSpec(
    name="swiglu_clamp_bwd", kclass="elementwise", dim_names=("rows", "cols"),
    inputs=(Buffer("dy", "act", _rc), Buffer("g", "act", _rc), Buffer("u", "act", _rc)),
    outputs=(Buffer("dg", "act", _rc), Buffer("du", "act", _rc)),
    scalars={"limit": LIMIT}, default_shapes=({"rows": 512, "cols": 1024},), tail_shapes=_TAILS,
    dtypes=("fp32", "bf16"), make_inputs=_inputs_bwd, eager=_eager_bwd, reference=_ref_bwd,
    flops=lambda d: (14.0 + EXP_FLOPS) * d["rows"] * d["cols"],
    bytes_moved=lambda d, e: 5.0 * e * d["rows"] * d["cols"],
    tile_dim="rows", tile_bytes=lambda d, b, e: 5.0 * e * b * d["cols"],
    tol={"fp32": (1e-4, 1e-4), "bf16": (3e-2, 3e-2)},
)
