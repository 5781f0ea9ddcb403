"""MoE routing: top-k router and the grouped expert GEMM.

router_topk: scores s = sigmoid(logits) (score=1) or sqrt(softplus(logits)) (score=2); experts are
selected by top-k of s + bias (the load-balancing selection bias), and the weights are the unbiased
scores of the selected experts renormalised to sum to one. Outputs: indices [tokens, k] (descending by
s + bias) and weights [tokens, k].
grouped_gemm: tokens sorted by expert; offsets[e]..offsets[e+1] are expert e's rows; y = x @ W[e].
"""

from __future__ import annotations

from trex.kernels.suite._gen import gen
from trex.kernels.suite.base import EXP_FLOPS, Buffer, Dims, KernelSpec, Tensors


def _scores(logits, score: int):  # type: ignore[no-untyped-def]
    import torch
    import torch.nn.functional as F

    if score == 1:
        return torch.sigmoid(logits)
    if score == 2:
        return F.softplus(logits).sqrt()
    raise ValueError(f"dims.score must be 1 (sigmoid) or 2 (sqrt-softplus), got {score}")


def _router_inputs(d: Dims, dtype: str, seed: int) -> Tensors:
    import torch

    g = gen(seed)
    return {"logits": torch.randn((d["tokens"], d["experts"]), generator=g) * 2.0,
            "bias": torch.randn((d["experts"],), generator=g) * 0.1}


def _router_eager(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    import torch

    sc = _scores(t["logits"], d["score"])
    idx = torch.topk(sc + t["bias"], d["k"], dim=-1).indices
    w = sc.gather(-1, idx)
    return {"idx": idx, "weights": w / w.sum(-1, keepdim=True)}


def _router_ref(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    import torch

    sc = _scores(t["logits"], d["score"])
    sel = sc + t["bias"]
    order = torch.argsort(sel, dim=-1, descending=True, stable=True)[:, : d["k"]]
    w = sc.gather(-1, order)
    return {"idx": order, "weights": w / w.sum(-1, keepdim=True), "_sel": sel, "_scores": sc}


def _router_compare(inp: Tensors, out: Tensors, ref: Tensors, d: Dims) -> str | None:
    """Indices may differ only across exact or near ties; values and weights are checked at the chosen idx."""
    import torch

    idx = out["idx"]
    if idx.dtype != torch.int64 or bool(((idx < 0) | (idx >= d["experts"])).any()):
        return "idx out of range"
    if d["k"] > 1 and bool((idx.sort(-1).values.diff(dim=-1) == 0).any()):
        return "idx repeats an expert within a token"
    chosen = ref["_sel"].gather(-1, idx)
    if not torch.allclose(chosen, ref["_sel"].gather(-1, ref["idx"]), rtol=1e-5, atol=1e-5):
        return "selected experts are not the top-k of score + bias (in order)"
    w = ref["_scores"].gather(-1, idx)
    w = w / w.sum(-1, keepdim=True)
    if not torch.allclose(out["weights"].double(), w, rtol=1e-4, atol=1e-6):
        return f"weights differ from renormalised unbiased scores by {float((out['weights'].double() - w).abs().max()):.3g}"
    return None


def _router_dims(d: Dims) -> str | None:
    if d["score"] not in (1, 2):
        return f"score: must be 1 (sigmoid) or 2 (sqrt-softplus), got {d['score']}"
    if not 1 <= d["k"] <= d["experts"]:
        return f"k: must be in [1, experts={d['experts']}], got {d['k']}"
    return None


ROUTER_TOPK = KernelSpec(
    name="router_topk", kclass="routing", dim_names=("tokens", "experts", "k", "score"),
    inputs=(Buffer("logits", "f32", lambda d: (d["tokens"], d["experts"])), Buffer("bias", "f32", lambda d: (d["experts"],))),
    outputs=(Buffer("idx", "i64", lambda d: (d["tokens"], d["k"])), Buffer("weights", "f32", lambda d: (d["tokens"], d["k"]))),
    scalars={}, default_shapes=({"tokens": 2048, "experts": 64, "k": 6, "score": 2},),
    tail_shapes=({"tokens": 33, "experts": 17, "k": 3, "score": 1}, {"tokens": 5, "experts": 9, "k": 1, "score": 2},
                 {"tokens": 65, "experts": 256, "k": 8, "score": 2}),
    dtypes=("fp32",), make_inputs=_router_inputs, eager=_router_eager, reference=_router_ref,
    flops=lambda d: (6.0 + 2 * EXP_FLOPS) * d["tokens"] * d["experts"] + 2.0 * d["tokens"] * d["experts"] * d["k"],
    bytes_moved=lambda d, e: 4.0 * d["tokens"] * d["experts"] + 12.0 * d["tokens"] * d["k"],
    tile_dim="tokens", tile_bytes=lambda d, b, e: 4.0 * b * d["experts"] * 2,
    compare=_router_compare, dims_problem=_router_dims,
)


def _gg_inputs(d: Dims, dtype: str, seed: int) -> Tensors:
    import torch

    g = gen(seed)
    probs = torch.rand(d["experts"], generator=g) + 0.05
    if d["experts"] > 2:
        probs[seed % d["experts"]] = 0.0  # one idle expert: an empty group must be handled
    assign = torch.multinomial(probs, d["tokens"], replacement=True, generator=g)
    counts = torch.bincount(assign, minlength=d["experts"])
    offsets = torch.zeros(d["experts"] + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(counts, 0)
    return {"x": torch.randn((d["tokens"], d["hidden"]), generator=g),
            "w": torch.randn((d["experts"], d["hidden"], d["out"]), generator=g) / d["hidden"] ** 0.5,
            "offsets": offsets}


def _gg_eager(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    import torch

    off = t["offsets"].tolist()
    x, w = t["x"], t["w"]
    return {"y": torch.cat([x[off[e]: off[e + 1]] @ w[e] for e in range(len(off) - 1)], dim=0)}


def _gg_ref(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    """Per-token einsum against its expert's matrix (gathered), float64."""
    import torch

    off = t["offsets"]
    expert_of = torch.searchsorted(off[1:], torch.arange(d["tokens"]), right=True)
    return {"y": torch.einsum("th,tho->to", t["x"], t["w"][expert_of])}


GROUPED_GEMM = KernelSpec(
    name="grouped_gemm", kclass="gemm", dim_names=("tokens", "experts", "hidden", "out"),
    inputs=(Buffer("x", "f32", lambda d: (d["tokens"], d["hidden"])),
            Buffer("w", "f32", lambda d: (d["experts"], d["hidden"], d["out"])),
            Buffer("offsets", "i64", lambda d: (d["experts"] + 1,))),
    outputs=(Buffer("y", "f32", lambda d: (d["tokens"], d["out"])),),
    scalars={}, default_shapes=({"tokens": 512, "experts": 32, "hidden": 256, "out": 256},),
    tail_shapes=({"tokens": 37, "experts": 5, "hidden": 33, "out": 19}, {"tokens": 9, "experts": 3, "hidden": 7, "out": 65},
                 {"tokens": 130, "experts": 4, "hidden": 64, "out": 48}),
    dtypes=("fp32",), make_inputs=_gg_inputs, eager=_gg_eager, reference=_gg_ref,
    flops=lambda d: 2.0 * d["tokens"] * d["hidden"] * d["out"],
    bytes_moved=lambda d, e: 4.0 * (d["tokens"] * d["hidden"] + d["experts"] * d["hidden"] * d["out"] + d["tokens"] * d["out"]),
    tile_dim="out", tile_bytes=lambda d, b, e: 4.0 * (d["hidden"] * b + 64 * d["hidden"] + 64 * b),
    tol={"fp32": (1e-4, 1e-4)},
)
