"""RMSNorm forward and backward: y = x * rsqrt(mean(x^2) + eps) * w; the backward gives dx and dw."""

from __future__ import annotations

from trex.kernels.suite._gen import gen, randn
from trex.kernels.suite.base import Buffer, Dims, KernelSpec, Tensors

EPS = 1e-6


def _inputs_fwd(d: Dims, dtype: str, seed: int) -> Tensors:
    g = gen(seed)
    return {"x": randn((d["rows"], d["cols"]), dtype, g), "w": randn((d["cols"],), dtype, g, 0.5) + 1.0}


def _eager_fwd(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    import torch

    x = t["x"].float()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s["eps"])
    y = (x * rstd).to(t["x"].dtype) * t["w"]
    return {"y": y, "rstd": rstd.squeeze(-1)}


def _ref_fwd(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    import torch

    x = t["x"]
    rstd = 1.0 / torch.sqrt((x * x).sum(-1) / x.shape[-1] + s["eps"])
    return {"y": x * rstd[:, None] * t["w"], "rstd": rstd}


def _inputs_bwd(d: Dims, dtype: str, seed: int) -> Tensors:
    import torch

    t = _inputs_fwd(d, dtype, seed)
    x = t["x"].float()
    t["dy"] = randn((d["rows"], d["cols"]), dtype, gen(seed + 7919))
    t["rstd"] = torch.rsqrt(x.pow(2).mean(-1) + EPS)
    return {"dy": t["dy"], "x": t["x"], "w": t["w"], "rstd": t["rstd"]}


def _eager_bwd(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    x, dy, w = t["x"].float(), t["dy"].float(), t["w"].float()
    rstd = t["rstd"][:, None]
    xhat = x * rstd
    g = dy * w
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    dw = (dy * xhat).sum(0)
    return {"dx": dx.to(t["x"].dtype), "dw": dw}


def _ref_bwd(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    """Autograd through the float64 forward: independent of the closed form the kernels use."""
    import torch

    x = t["x"].clone().requires_grad_(True)
    w = t["w"].clone().requires_grad_(True)
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + s["eps"]) * w
    dx, dw = torch.autograd.grad(y, (x, w), t["dy"])
    return {"dx": dx, "dw": dw}


def _rc(d: Dims) -> tuple[int, ...]:
    return (d["rows"], d["cols"])


_SHAPES = ({"rows": 512, "cols": 2048},)
_TAILS = ({"rows": 37, "cols": 1000}, {"rows": 5, "cols": 129}, {"rows": 64, "cols": 4099})

RMSNORM_FWD = KernelSpec(
    name="rmsnorm_fwd", kclass="norm", dim_names=("rows", "cols"),
    inputs=(Buffer("x", "act", _rc), Buffer("w", "act", lambda d: (d["cols"],))),
    outputs=(Buffer("y", "act", _rc), Buffer("rstd", "f32", lambda d: (d["rows"],))),
    scalars={"eps": EPS}, default_shapes=_SHAPES, tail_shapes=_TAILS, dtypes=("fp32", "bf16"),
    make_inputs=_inputs_fwd, eager=_eager_fwd, reference=_ref_fwd,
    flops=lambda d: 4.0 * d["rows"] * d["cols"],
    bytes_moved=lambda d, e: 2.0 * e * d["rows"] * d["cols"] + 4.0 * d["rows"] + e * d["cols"],
    tile_dim="rows", tile_bytes=lambda d, b, e: 2.0 * e * b * d["cols"],
)

RMSNORM_BWD = KernelSpec(
    name="rmsnorm_bwd", kclass="norm", dim_names=("rows", "cols"),
    inputs=(Buffer("dy", "act", _rc), Buffer("x", "act", _rc), Buffer("w", "act", lambda d: (d["cols"],)),
            Buffer("rstd", "f32", lambda d: (d["rows"],))),
    outputs=(Buffer("dx", "act", _rc), Buffer("dw", "f32", lambda d: (d["cols"],))),
    scalars={"eps": EPS}, default_shapes=({"rows": 512, "cols": 2048},), tail_shapes=_TAILS,
    dtypes=("fp32", "bf16"),
    make_inputs=_inputs_bwd, eager=_eager_bwd, reference=_ref_bwd,
    flops=lambda d: 8.0 * d["rows"] * d["cols"],
    bytes_moved=lambda d, e: 3.0 * e * d["rows"] * d["cols"] + 4.0 * d["rows"] + 8.0 * d["cols"],
    tile_dim="rows", tile_bytes=lambda d, b, e: 3.0 * e * b * d["cols"] + 4.0 * d["cols"],
    tol={"fp32": (2e-4, 2e-4), "bf16": (3e-2, 3e-2)},
)
