"""mHC pre-projection chain: RMSNorm over all residual streams, projection to mixing logits, Sinkhorn.

x: [tokens, streams*hidden] (the n residual streams of width C side by side), gamma: [streams*hidden],
w: [streams*hidden, streams*streams]. Per token:
  z = x * rsqrt(mean(x^2) + eps) * gamma              (RMSNorm over the n*C features)
  a = reshape(z @ w, [n, n]);  M = exp(a - max(a))     (mixing logits; max-shift for stability)
  repeat `iters` times: M = M / rowsum(M); M = M / colsum(M)   (Sinkhorn-Knopp, rows then columns)
Output h = M: [tokens, n, n], columns summing to one exactly and rows to one up to Sinkhorn's residual.
"""

from __future__ import annotations

from trex.kernels.suite._gen import gen
from trex.kernels.suite.base import Buffer, Dims, KernelSpec, Tensors

EPS = 1e-6


def _f(d: Dims) -> int:
    return d["streams"] * d["hidden"]


def _inputs(d: Dims, dtype: str, seed: int) -> Tensors:
    import torch

    g = gen(seed)
    n = d["streams"]
    return {"x": torch.randn((d["tokens"], _f(d)), generator=g),
            "gamma": torch.rand((_f(d),), generator=g) + 0.5,
            "w": torch.randn((_f(d), n * n), generator=g) * (1.0 / _f(d) ** 0.5)}


def _chain(t: Tensors, d: Dims, eps: float):  # type: ignore[no-untyped-def]
    import torch

    x = t["x"]
    z = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * t["gamma"]
    n = d["streams"]
    a = (z @ t["w"]).view(-1, n, n)
    m = torch.exp(a - a.amax(dim=(-1, -2), keepdim=True))
    for _ in range(d["iters"]):
        m = m / m.sum(-1, keepdim=True)
        m = m / m.sum(-2, keepdim=True)
    return m


def _eager(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    return {"h": _chain(t, d, s["eps"])}


def _reference(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    """Float64, with the Sinkhorn scaling written as diagonal scalings r, c of the exp-logits (M = diag(r) K diag(c))."""
    import torch

    x = t["x"]
    z = x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + s["eps"]) * t["gamma"]
    n = d["streams"]
    a = torch.einsum("tf,fm->tm", z, t["w"]).reshape(-1, n, n)
    k = torch.exp(a - a.flatten(1).max(-1).values[:, None, None])
    c = torch.ones(k.shape[0], n, dtype=k.dtype)
    r = torch.ones_like(c)
    for _ in range(d["iters"]):
        r = 1.0 / torch.einsum("tij,tj->ti", k, c)
        c = 1.0 / torch.einsum("tij,ti->tj", k, r)
    return {"h": r[:, :, None] * k * c[:, None, :]}


MHC_PRE = KernelSpec(
    name="mhc_pre", kclass="mixing", dim_names=("tokens", "streams", "hidden", "iters"),
    inputs=(Buffer("x", "f32", lambda d: (d["tokens"], _f(d))), Buffer("gamma", "f32", lambda d: (_f(d),)),
            Buffer("w", "f32", lambda d: (_f(d), d["streams"] ** 2))),
    outputs=(Buffer("h", "f32", lambda d: (d["tokens"], d["streams"], d["streams"])),),
    scalars={"eps": EPS}, default_shapes=({"tokens": 256, "streams": 4, "hidden": 512, "iters": 20},),
    tail_shapes=({"tokens": 7, "streams": 4, "hidden": 33, "iters": 20}, {"tokens": 33, "streams": 3, "hidden": 65, "iters": 5},
                 {"tokens": 1, "streams": 2, "hidden": 8, "iters": 1}),
    dtypes=("fp32",), make_inputs=_inputs, eager=_eager, reference=_reference,
    flops=lambda d: 2.0 * d["tokens"] * _f(d) * d["streams"] ** 2 + 4.0 * d["tokens"] * _f(d)
    + 4.0 * d["tokens"] * d["iters"] * d["streams"] ** 2,
    bytes_moved=lambda d, e: 4.0 * (d["tokens"] * _f(d) + _f(d) * (1 + d["streams"] ** 2) + d["tokens"] * d["streams"] ** 2),
    tile_dim="tokens", tile_bytes=lambda d, b, e: 4.0 * (b * _f(d) + _f(d) * d["streams"] ** 2),
    tol={"fp32": (2e-4, 1e-5)},
)
