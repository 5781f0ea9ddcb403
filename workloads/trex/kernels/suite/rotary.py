"""Rotary embedding (half-split convention), forward rotation and its inverse.

x: [tokens, heads, dim]; cos, sin: [tokens, dim/2] (fp32). With x1 = x[..., :dim/2], x2 = x[..., dim/2:]:
forward y = (x1 c - x2 s, x2 c + x1 s); inverse y = (x1 c + x2 s, x2 c - x1 s).
"""

from __future__ import annotations

from trex.kernels.suite._gen import gen, randn
from trex.kernels.suite.base import Buffer, Dims, KernelSpec, Tensors


def _x(d: Dims) -> tuple[int, ...]:
    return (d["tokens"], d["heads"], d["dim"])


def _cs(d: Dims) -> tuple[int, ...]:
    return (d["tokens"], d["dim"] // 2)


def _inputs(d: Dims, dtype: str, seed: int) -> Tensors:
    import torch

    if d["dim"] % 2:
        raise ValueError(f"dims.dim must be even for rotary embedding, got {d['dim']}")
    half = d["dim"] // 2
    pos = torch.arange(d["tokens"], dtype=torch.float64)[:, None] + seed
    inv = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    ang = pos * inv[None, :]
    return {"x": randn(_x(d), dtype, gen(seed)), "cos": torch.cos(ang).float(), "sin": torch.sin(ang).float()}


def _eager(sign: float):  # type: ignore[no-untyped-def]
    def run(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
        import torch

        x = t["x"]
        x1, x2 = x.chunk(2, dim=-1)
        c = t["cos"][:, None, :].to(x.dtype)
        sn = t["sin"][:, None, :].to(x.dtype) * sign
        return {"y": torch.cat((x1 * c - x2 * sn, x2 * c + x1 * sn), dim=-1)}
    return run


def _reference(sign: float):  # type: ignore[no-untyped-def]
    def run(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
        """Complex multiplication by exp(+-i theta) in complex128: independent of the real-valued form."""
        import torch

        x = t["x"]
        half = x.shape[-1] // 2
        z = torch.complex(x[..., :half], x[..., half:])
        rot = torch.complex(t["cos"], sign * t["sin"])[:, None, :]
        w = z * rot
        return {"y": torch.cat((w.real, w.imag), dim=-1)}
    return run


_SHAPES = ({"tokens": 512, "heads": 16, "dim": 64},)
_TAILS = ({"tokens": 33, "heads": 3, "dim": 34}, {"tokens": 7, "heads": 5, "dim": 130}, {"tokens": 1, "heads": 1, "dim": 2})


def _spec(name: str, sign: float) -> KernelSpec:
    return KernelSpec(
        name=name, kclass="rotary", dim_names=("tokens", "heads", "dim"),
        inputs=(Buffer("x", "act", _x), Buffer("cos", "f32", _cs), Buffer("sin", "f32", _cs)),
        outputs=(Buffer("y", "act", _x),), scalars={}, default_shapes=_SHAPES, tail_shapes=_TAILS,
        dtypes=("fp32", "bf16"), make_inputs=_inputs, eager=_eager(sign), reference=_reference(sign),
        flops=lambda d: 3.0 * d["tokens"] * d["heads"] * d["dim"],
        bytes_moved=lambda d, e: 2.0 * e * d["tokens"] * d["heads"] * d["dim"] + 4.0 * d["tokens"] * d["dim"],
        tile_dim="tokens", tile_bytes=lambda d, b, e: b * (2.0 * e * d["heads"] * d["dim"] + 4.0 * d["dim"]),
    )


ROPE_FWD = _spec("rope_fwd", 1.0)
ROPE_INV = _spec("rope_inv", -1.0)
