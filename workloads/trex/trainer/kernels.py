"""Tuned kernels inside training: a KernelTuneJob's registry replaces the trainer's RMSNorm, clamped SwiGLU,
half-split RoPE, router top-k and grouped expert GEMM.

``trainer.kernels.registry`` (the operator mounts a KernelTuneJob's registry and names it there when a TrainJob
names the KernelTuneJob in ``kernelsFrom``) lists tuned configurations per kernel, shape class (each dim rounded up
to a power of two) and dtype. At load, every entry for this device's backend whose shape class the run uses
(``trainer_kernel_shapes``) is compiled and checked against the eager op on the run's own shape; a kernel that
fails to build or disagrees beyond its declared tolerance is refused (log line, metric, termination summary)
and the eager op stays. Accepted kernels run as torch custom ops (``torch.ops.trex.*``, registered with
autograd formulas and fake implementations so autocast, FSDP2 and torch.compile see ordinary ops) through
the single dispatch point ``trex.trainer.model.layers.TUNED``; a call whose device, dtype or shape class has
no accepted kernel runs the eager code.

Covered: RMSNorm and clamped SwiGLU forward and backward, half-split RoPE (``rope_interleave: false``; its
backward is the inverse rotation), router top-k (learned, not group-limited, renormalised gates; the weights'
gradient by formula), the fp32 grouped expert GEMM (dx by the same kernel, dw per expert). DeepSeek's
interleaved RoPE and the fused cross-entropy stay eager. On CPU every kernel runs on one thread
(``training_params``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trex.kernels.backends.base import Backend, Compiled
from trex.kernels.suite import SUITE
from trex.kernels.suite.base import shape_bucket, shape_key, torch_dtype
from trex.trainer.config import TrainerConfig, resolved_model_values
from trex.trainer.model import layers

BACKEND_FOR_DEVICE = {"cpu": "cpu-c", "cuda": "cuda-triton", "npu": "npu-ascendc"}
OPS: dict[str, tuple[str, ...]] = {"rmsnorm": ("rmsnorm_fwd", "rmsnorm_bwd"),
                                   "swiglu": ("swiglu_clamp_fwd", "swiglu_clamp_bwd"),
                                   "rope": ("rope_fwd", "rope_inv"), "router": ("router_topk",),
                                   "grouped_gemm": ("grouped_gemm",)}
"""Dispatch name in layers.TUNED -> the kernels it runs (forward, then the one its backward runs)."""
DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


@dataclass
class KernelState:
    """What the run loaded: accepted kernels by (kernel, dtype, shape class), refusals, the run's shape classes,
    the registry's entries for them, and calls made."""

    compiled: dict[tuple[str, str, str], Compiled] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    """'kernel/dtype/bucket' -> why it was refused."""
    calls: Counter[str] = field(default_factory=Counter)
    """Tuned launches per kernel name."""
    run: set[tuple[str, str]] = field(default_factory=set)
    """(kernel, shape class) of every call this run's model and layout make (``trainer_kernel_shapes``)."""
    tuned: set[tuple[str, str, str]] = field(default_factory=set)
    """(kernel, dtype, shape class) the registry has an entry for among the run's shape classes."""
    called: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """Dispatched calls per (kernel, dtype, shape class), tuned or eager (counted while a registry is given)."""
    _rebound: dict[tuple[str, str, str, tuple[float, ...]], Compiled] = field(default_factory=dict)

    @property
    def active(self) -> list[str]:
        """'kernel/dtype/bucket' of every accepted kernel."""
        return sorted("/".join(k) for k in self.compiled)

    def coverage(self) -> dict[str, dict[str, Any]]:
        """Per kernel: the run's shape classes, those called so far ('dtype/bucket'), tuned in the registry, active,
        and refused with the reason."""
        names = sorted({k for k, _ in self.run} | {k[0] for k in self.tuned} | {k[0] for k in self.called})
        out: dict[str, dict[str, Any]] = {}
        for name in names:
            out[name] = {
                "run": sorted(b for k, b in self.run if k == name),
                "called": sorted(f"{d}/{b}" for k, d, b in self.called if k == name),
                "tuned": sorted(f"{d}/{b}" for k, d, b in self.tuned if k == name),
                "active": sorted(f"{d}/{b}" for k, d, b in self.compiled if k == name),
                "refused": {r.split("/", 1)[1]: why for r, why in sorted(self.refused.items())
                            if r.split("/", 1)[0] == name},
            }
        return out

    def coverage_line(self) -> str:
        """One line: per kernel, active of tuned of the run's shape classes, refused and called counts."""
        parts = [f"{name} {len(c['active'])}/{len(c['tuned'])}/{len(c['run'])}"
                 + (f" ({len(c['refused'])} refused)" if c["refused"] else "")
                 + (f", {len(c['called'])} called" if c["called"] else "")
                 for name, c in self.coverage().items()]
        return "kernels coverage (active/tuned/run shape classes): " + ("; ".join(parts) or "none")

    def summary(self) -> dict[str, Any]:
        """The termination summary's (and so TrainJob status.results') ``kernels`` entry."""
        return {"active": self.active, "refused": dict(sorted(self.refused.items())), "coverage": self.coverage()}

    def export(self, exporter: Any, job: str) -> None:
        """trex_train_kernel_active / _refused, one series per kernel/dtype/bucket, and trex_train_kernel_coverage:
        per kernel, its shape classes run / tuned / active / refused (/ called, when exported after steps)."""
        for k in self.active:
            exporter.metric("trex_train_kernel_active", job_name=job, kernel=k).set(1)
        for k in self.refused:
            exporter.metric("trex_train_kernel_refused", job_name=job, kernel=k).set(1)
        for name, c in self.coverage().items():
            for what in ("run", "called", "tuned", "active", "refused"):
                exporter.metric("trex_train_kernel_coverage", job_name=job, kernel=name, classes=what).set(len(c[what]))

    def launcher(self, kernel: str, dtype: str, bucket: str, scalars: Mapping[str, float]) -> Compiled | None:
        """The accepted kernel for this call with the call's scalars bound (eps, limit), or None."""
        comp = self.compiled.get((kernel, dtype, bucket))
        if comp is None:
            return None
        key = (kernel, dtype, bucket, tuple(float(v) for v in scalars.values()))
        if key not in self._rebound:
            c = copy.copy(comp)
            c.spec = dataclasses.replace(comp.spec, scalars={**comp.spec.scalars, **scalars})
            self._rebound[key] = c
        return self._rebound[key]


STATE = KernelState()
"""The process's loaded kernels (the custom ops read it; ``install`` replaces it)."""


def _launch(kernel: str, inputs: dict[str, torch.Tensor], scalars: Mapping[str, float],
            dims: Mapping[str, int] | None = None) -> dict[str, torch.Tensor] | None:
    """Run the accepted kernel on contiguous inputs (``dims`` default: the first input's rows x cols); None when
    none is accepted for them."""
    first = next(iter(inputs.values()))
    shape = {k: int(v) for k, v in dims.items()} if dims else {"rows": int(first.shape[0]), "cols": int(first.shape[1])}
    dtype = DTYPES.get(first.dtype)
    comp = STATE.launcher(kernel, dtype, shape_bucket(shape), scalars) if dtype else None
    if comp is None:
        return None
    spec = comp.spec
    outs = {b.name: torch.empty(b.shape(shape), dtype=torch_dtype(b.role, dtype or "fp32"), device=first.device)
            for b in spec.outputs}
    comp.bind({k: v.contiguous() for k, v in inputs.items()}, outs, shape)()
    STATE.calls[kernel] += 1
    return outs


# ---- custom ops -------------------------------------------------------------------------------------------------


@torch.library.custom_op("trex::rmsnorm_fwd", mutates_args=())
def rmsnorm_fwd(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x * rsqrt(mean(x^2) + eps) * w over the last dim of a 2-D x, and rstd (fp32) per row."""
    out = _launch("rmsnorm_fwd", {"x": x, "w": w}, {"eps": eps})
    if out is None:
        ref = SUITE["rmsnorm_fwd"].eager({"x": x, "w": w}, {}, {"eps": eps})
        return ref["y"].contiguous(), ref["rstd"].contiguous()
    return out["y"], out["rstd"]


@rmsnorm_fwd.register_fake
def _rmsnorm_fwd_fake(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), x.new_empty((x.shape[0],), dtype=torch.float32)


@torch.library.custom_op("trex::rmsnorm_bwd", mutates_args=())
def rmsnorm_bwd(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """dx and dw (fp32) of rmsnorm_fwd."""
    t = {"dy": dy, "x": x, "w": w, "rstd": rstd}
    out = _launch("rmsnorm_bwd", t, {"eps": eps})
    if out is None:
        ref = SUITE["rmsnorm_bwd"].eager(t, {}, {"eps": eps})
        return ref["dx"].contiguous(), ref["dw"].contiguous()
    return out["dx"], out["dw"]


@rmsnorm_bwd.register_fake
def _rmsnorm_bwd_fake(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rstd: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), w.new_empty(w.shape, dtype=torch.float32)


def _rmsnorm_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, w, eps = inputs
    ctx.save_for_backward(x, w, output[1])
    ctx.eps = eps


def _rmsnorm_backward(ctx: Any, dy: torch.Tensor, _drstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    x, w, rstd = ctx.saved_tensors
    dx, dw = rmsnorm_bwd(dy.contiguous(), x, w, rstd, ctx.eps)
    return dx, dw.to(w.dtype), None


rmsnorm_fwd.register_autograd(_rmsnorm_backward, setup_context=_rmsnorm_setup)


@torch.library.custom_op("trex::swiglu_fwd", mutates_args=())
def swiglu_fwd(g: torch.Tensor, u: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(min(g, limit)) * clamp(u, -limit, limit) of 2-D g, u."""
    out = _launch("swiglu_clamp_fwd", {"g": g, "u": u}, {"limit": limit})
    if out is None:
        return SUITE["swiglu_clamp_fwd"].eager({"g": g, "u": u}, {}, {"limit": limit})["y"].contiguous()
    return out["y"]


@swiglu_fwd.register_fake
def _swiglu_fwd_fake(g: torch.Tensor, u: torch.Tensor, limit: float) -> torch.Tensor:
    return torch.empty_like(g)


@torch.library.custom_op("trex::swiglu_bwd", mutates_args=())
def swiglu_bwd(dy: torch.Tensor, g: torch.Tensor, u: torch.Tensor, limit: float) -> tuple[torch.Tensor, torch.Tensor]:
    """dg, du of swiglu_fwd (torch.clamp's gradient convention)."""
    t = {"dy": dy, "g": g, "u": u}
    out = _launch("swiglu_clamp_bwd", t, {"limit": limit})
    if out is None:
        ref = SUITE["swiglu_clamp_bwd"].eager(t, {}, {"limit": limit})
        return ref["dg"].contiguous(), ref["du"].contiguous()
    return out["dg"], out["du"]


@swiglu_bwd.register_fake
def _swiglu_bwd_fake(dy: torch.Tensor, g: torch.Tensor, u: torch.Tensor, limit: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(g), torch.empty_like(u)


def _swiglu_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    g, u, limit = inputs
    ctx.save_for_backward(g, u)
    ctx.limit = limit


def _swiglu_backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    g, u = ctx.saved_tensors
    dg, du = swiglu_bwd(dy.contiguous(), g, u, ctx.limit)
    return dg, du, None


swiglu_fwd.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)


@torch.library.custom_op("trex::rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool) -> torch.Tensor:
    """x [tokens, heads, dim] with the pairs (x_i, x_{i + dim/2}) rotated by the angles of cos, sin [tokens, dim/2]
    (fp32); ``inverse`` rotates by the negated angles."""
    kernel = "rope_inv" if inverse else "rope_fwd"
    t = {"x": x, "cos": cos, "sin": sin}
    dims = {"tokens": x.shape[0], "heads": x.shape[1], "dim": x.shape[2]}
    out = _launch(kernel, t, {}, dims)
    if out is None:
        return SUITE[kernel].eager(t, dims, {})["y"].contiguous()
    return out["y"]


@rope.register_fake
def _rope_fake(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool) -> torch.Tensor:
    return torch.empty_like(x)


def _rope_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    _, cos, sin, inverse = inputs
    ctx.save_for_backward(cos, sin)
    ctx.inverse = inverse


def _rope_backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
    """A rotation's gradient is the opposite rotation: rope_fwd's backward runs rope_inv and vice versa."""
    cos, sin = ctx.saved_tensors
    return rope(dy.contiguous(), cos, sin, not ctx.inverse), None, None, None


rope.register_autograd(_rope_backward, setup_context=_rope_setup)

SCORE_CODES = {"sigmoid": 1, "sqrt-softplus": 2}
"""Router scoring name (model) -> the router_topk kernel's ``score`` dim."""


@torch.library.custom_op("trex::router_topk", mutates_args=())
def router_topk(logits: torch.Tensor, bias: torch.Tensor, k: int, score: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts of score(logits) + bias [tokens, k] (descending) and the unbiased scores there,
    renormalised to sum to one (fp32)."""
    t = {"logits": logits, "bias": bias}
    dims = {"tokens": logits.shape[0], "experts": logits.shape[1], "k": k, "score": score}
    out = _launch("router_topk", t, {}, dims)
    if out is None:
        out = SUITE["router_topk"].eager(t, dims, {})
    return out["idx"].contiguous(), out["weights"].contiguous()


@router_topk.register_fake
def _router_topk_fake(logits: torch.Tensor, bias: torch.Tensor, k: int, score: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = logits.shape[0]
    return logits.new_empty((n, k), dtype=torch.int64), logits.new_empty((n, k))


def _router_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    ctx.save_for_backward(inputs[0], output[0], output[1])
    ctx.score = inputs[3]


def _router_backward(ctx: Any, _didx: torch.Tensor | None, dw: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
    """w = s / sum(s) over the chosen experts (the selection itself has no gradient): ds = (dw - <dw, w>) / sum(s),
    d logit = ds * score'(logit), scattered back to the chosen experts."""
    logits, idx, w = ctx.saved_tensors
    sel = logits.gather(1, idx)
    if ctx.score == 1:
        s = torch.sigmoid(sel)
        ds_dl = s * (1 - s)
    else:
        s = torch.nn.functional.softplus(sel).sqrt()
        ds_dl = torch.sigmoid(sel) / (2 * s)
    ds = (dw - (dw * w).sum(-1, keepdim=True)) / s.sum(-1, keepdim=True)
    return torch.zeros_like(logits).scatter(1, idx, ds * ds_dl), None, None, None


router_topk.register_autograd(_router_backward, setup_context=_router_setup)


@torch.library.custom_op("trex::grouped_gemm", mutates_args=())
def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows offsets[e]..offsets[e+1] of x [tokens, hidden] times w[e] ([experts, hidden, out], fp32)."""
    t = {"x": x, "w": w, "offsets": offsets}
    dims = {"tokens": x.shape[0], "experts": w.shape[0], "hidden": w.shape[1], "out": w.shape[2]}
    out = _launch("grouped_gemm", t, {}, dims)
    if out is None:
        return SUITE["grouped_gemm"].eager(t, dims, {})["y"].contiguous()
    return out["y"]


@grouped_gemm.register_fake
def _grouped_gemm_fake(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[2]))


def _grouped_gemm_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _grouped_gemm_backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    """dx = the grouped GEMM of dy with each w[e] transposed (the same kernel); dw[e] = x_e^T dy_e."""
    x, w, offsets = ctx.saved_tensors
    dy = dy.contiguous()
    dx = grouped_gemm(dy, w.transpose(1, 2).contiguous(), offsets)
    off = offsets.tolist()
    dw = torch.stack([x[off[e]:off[e + 1]].t() @ dy[off[e]:off[e + 1]] for e in range(w.shape[0])])
    return dx, dw, None


grouped_gemm.register_autograd(_grouped_gemm_backward, setup_context=_grouped_gemm_setup)


# ---- dispatch (layers.TUNED) --------------------------------------------------------------------------------------


def _plain(*ts: torch.Tensor) -> bool:
    """Ordinary dense tensors of one supported dtype (DTensors and mixed dtypes stay on the eager path)."""
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in ts) and len({t.dtype for t in ts}) == 1 \
        and ts[0].dtype in DTYPES


def _seen(kernel: str, dtype: str, dims: Mapping[str, int]) -> bool:
    """Count the call's (kernel, dtype, shape class) for the coverage; whether a kernel is accepted for it."""
    key = (kernel, dtype, shape_bucket(dims))
    STATE.called[key] += 1
    return key in STATE.compiled


def _has(kernel: str, x: torch.Tensor) -> bool:
    rows = x.numel() // max(1, x.shape[-1])
    return _seen(kernel, DTYPES[x.dtype], {"rows": rows, "cols": x.shape[-1]})


def tuned_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor | None:
    """RMSNorm through the tuned kernel, or None when there is none for this call."""
    if not _plain(x, w) or not _has("rmsnorm_fwd", x):
        return None
    y, _ = rmsnorm_fwd(x.reshape(-1, x.shape[-1]), w, float(eps))
    out: torch.Tensor = y.reshape(x.shape)
    return out


def tuned_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor | None:
    """Clamped SwiGLU through the tuned kernel (``limit`` 0 = no clamp), or None when there is none."""
    if not _plain(gate, up) or gate.shape != up.shape or not _has("swiglu_clamp_fwd", gate):
        return None
    lim = float(limit) if limit > 0 else math.inf
    y: torch.Tensor = swiglu_fwd(gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1]), lim)
    return y.reshape(gate.shape)


def tuned_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """Half-split RoPE of x [B, T, H, D] or [B, T, D] with cos, sin [B, T, D/2] through the tuned kernel (its
    backward through rope_inv), or None when there is none for this call."""
    if x.dim() not in (3, 4) or not _plain(x) or cos.shape != (*x.shape[:2], x.shape[-1] // 2) or x.shape[-1] % 2:
        return None
    if any(type(c) is not torch.Tensor or c.dtype != torch.float32 or c.requires_grad for c in (cos, sin)):
        return None
    tokens, heads, dim = x.shape[0] * x.shape[1], (x.shape[2] if x.dim() == 4 else 1), x.shape[-1]
    dims = {"tokens": tokens, "heads": heads, "dim": dim}
    if not _seen("rope_fwd", DTYPES[x.dtype], dims):
        return None
    y: torch.Tensor = rope(x.reshape(tokens, heads, dim).contiguous(), cos.reshape(tokens, dim // 2).contiguous(),
                           sin.reshape(tokens, dim // 2).contiguous(), False)
    return y.reshape(x.shape)


def tuned_router(logits: torch.Tensor, bias: torch.Tensor, k: int,
                 scoring: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(renormalised weights [N, k], expert indices [N, k]) of fp32 router logits [N, E] through the tuned
    router_topk, or None when there is none for this call."""
    code = SCORE_CODES.get(scoring)
    if code is None or logits.dim() != 2 or not _plain(logits, bias) or logits.dtype != torch.float32:
        return None
    dims = {"tokens": logits.shape[0], "experts": logits.shape[1], "k": k, "score": code}
    if not _seen("router_topk", "fp32", dims):
        return None
    idx, w = router_topk(logits.contiguous(), bias.detach().contiguous(), int(k), code)
    return w, idx


def tuned_grouped_linear(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor | None:
    """x_e @ w[e].T stacked (rows of x sorted by expert, counts[e] for expert e; w [E, out, in]) through the tuned
    grouped GEMM, or None when there is none for this call."""
    if x.dim() != 2 or w.dim() != 3 or not _plain(x, w) or x.dtype != torch.float32 or x.shape[1] != w.shape[2]:
        return None
    dims = {"tokens": x.shape[0], "experts": w.shape[0], "hidden": w.shape[2], "out": w.shape[1]}
    if not _seen("grouped_gemm", "fp32", dims):
        return None
    offsets = torch.zeros(w.shape[0] + 1, dtype=torch.int64, device=x.device)
    offsets[1:] = counts.cumsum(0)
    y: torch.Tensor = grouped_gemm(x.contiguous(), w.transpose(1, 2).contiguous(), offsets)
    return y


DISPATCH: dict[str, Callable[..., Any]] = {"rmsnorm": tuned_rmsnorm, "swiglu": tuned_swiglu, "rope": tuned_rope,
                                           "router": tuned_router, "grouped_gemm": tuned_grouped_linear}


# ---- the run's shapes and loading ---------------------------------------------------------------------------------


def _pow2_classes(lo: int, hi: int) -> list[int]:
    """lo, then each power of two above it below hi, then hi: one row count per power-of-two shape class."""
    out, r = [], lo
    while True:
        out.append(min(r, hi))
        if r >= hi:
            return out
        r = 1 << r.bit_length()


def trainer_kernel_shapes(values: Mapping[str, Any], micro_batch: int, seq_lens: list[int],
                          device: str, tp: int = 1, ep: int = 1, etp: int = 1) -> list[tuple[str, dict[str, int]]]:
    """(kernel, dims) of every dispatched call one rank of a run of this model shape and layout makes: RMSNorm rows
    are the tokens of a micro-batch (V4's compressed entries: micro-batch x windows; the blocks' residual norms
    under tp: the rank's 1/tp of them), SwiGLU rows the tokens (routed
    experts: tokens x experts per token, plus the CPU group padding), half-split RoPE the query and key heads,
    router top-k the tokens, the grouped expert GEMMs the routed rows. Local shard shapes: tp splits the query heads
    and the dense MLP's hidden dim and gives each rank 1/tp of the sequences in MoE layers (router, shared and
    routed experts), ep splits the routed experts, etp the routed experts' hidden dim; under
    ep a rank receives a routing-dependent row count, of which the classes from half to twice the balanced count
    are derived (a call outside them runs eager and shows in the coverage). These are the shapes a KernelTuneJob
    tunes for this TrainJob (``shapesFrom``)."""
    from trex.trainer.mfu import layer_kinds
    from trex.trainer.model.moe import CPU_GROUP_ROWS

    hidden = int(values["hidden_size"])
    kinds = set(layer_kinds(values))
    norm_cols = {hidden}
    if values.get("attention") == "mla":
        norm_cols |= {int(values["kv_lora_rank"])} | ({int(values["q_lora_rank"])} if values.get("q_lora_rank") else set())
    head_dim = int(values["qk_nope_head_dim"]) + int(values["qk_rope_head_dim"])
    if kinds & {"sliding", "csa", "hca"}:  # V4 attention: q_a_norm and the shared key/value head's kv_norm
        norm_cols |= {int(values["q_lora_rank"]), head_dim}
    n_exp, k = int(values["n_routed_experts"]), int(values["experts_per_token"])
    n_moe = int(values["num_layers"]) - int(values["n_dense_layers"]) + int(values.get("mtp_depth", 0))
    moe_layers = n_moe > 0
    out: dict[tuple[str, str], tuple[str, dict[str, int]]] = {}

    def add(kernel: str, **dims: int) -> None:
        out[(kernel, shape_bucket(dims))] = (kernel, dims)
    for seq in sorted(set(seq_lens)):
        tokens = micro_batch * seq
        norms = [(tokens, c) for c in norm_cols]
        if tp > 1:  # the residual's norms run on the rank's 1/tp of the tokens (sequence parallelism)
            norms.append((-(-tokens // tp), hidden))
        for kind, every, dims in (("csa", "csa_compress_every", (head_dim, int(values.get("csa_indexer_dim", 0)))),
                                  ("hca", "hca_compress_every", (head_dim,))):
            if kind in kinds:  # pooled entries: ceil(seq / every) windows per row, one more per packed document
                lo = micro_batch * -(-seq // int(values[every]))
                norms += [(r, c) for r in _pow2_classes(lo, tokens) for c in dims if c]
        for rows, c in norms:
            for kern in OPS["rmsnorm"]:
                add(kern, rows=rows, cols=c)
        act: list[tuple[int, int]] = []
        if int(values["n_dense_layers"]) > 0:
            act.append((tokens, int(values["intermediate_size"]) // tp))
        moe_tokens = -(-tokens // tp)  # MoE layers: 1/tp of the micro-batch's tokens per rank (Shard(0))
        if moe_layers:
            moe = int(values["moe_intermediate_size"])
            if int(values.get("n_shared_experts", 0)) > 0:  # shared experts: whole, on the rank's tokens
                act.append((moe_tokens, moe * int(values["n_shared_experts"])))
            routed, local, local_moe = moe_tokens * k, n_exp // ep, moe // etp
            lo, hi = (routed, routed) if ep == 1 else (max(1, routed // 2), 2 * routed)
            top = hi + (local * (CPU_GROUP_ROWS - 1) if device == "cpu" else 0)
            act += [(r, local_moe) for r in _pow2_classes(lo, top)]  # every class the padded routed rows can fall in
            for rows in _pow2_classes(lo, hi):
                for d_in, d_out in ((hidden, local_moe), (local_moe, hidden)):  # gate/up, down (each other's dx)
                    add("grouped_gemm", tokens=rows, experts=local, hidden=d_in, out=d_out)
        for rows, cols in act:
            for kern in OPS["swiglu"]:
                add(kern, rows=rows, cols=cols)
        if kinds == {"mla"} and values.get("rope_interleave") is False:  # DeepSeek's interleaved pairs stay eager
            for heads in (int(values["num_heads"]) // tp, 1):
                for kern in OPS["rope"]:
                    add(kern, tokens=tokens, heads=heads, dim=int(values["qk_rope_head_dim"]))
        routed_gates = n_moe > int(values.get("n_hash_layers", 0)) or int(values.get("mtp_depth", 0)) > 0
        if routed_gates and int(values.get("n_groups", 1)) == 1 and values.get("norm_topk_prob") is not False \
                and str(values.get("scoring")) in SCORE_CODES:
            add("router_topk", tokens=moe_tokens, experts=n_exp, k=k, score=SCORE_CODES[str(values["scoring"])])
    return sorted(out.values(), key=lambda kv: (kv[0], sorted(kv[1].items())))


def run_kernel_shapes(cfg: TrainerConfig, device: str) -> list[tuple[str, dict[str, int]]]:
    """(kernel, dims) of every dispatched call one rank of this run makes (its model, micro-batch, sequence lengths
    and tp/ep/etp layout; under cp a rank holds 1/cp of each sequence): what ``install_for`` loads kernels for and
    what a KernelTuneJob's ``shapesFrom`` tunes. Pure: no model is built."""
    p = cfg.parallelism
    seqs = [s // p.cp for s in (cfg.data.seq_len, *(c.seq_len for c in cfg.data.seq_len_curriculum))]
    return trainer_kernel_shapes(resolved_model_values(cfg.model), cfg.data.micro_batch_size, seqs, device,
                                 tp=p.tp, ep=p.ep, etp=p.etp)


def run_kernel_dtypes(cfg: TrainerConfig) -> list[str]:
    """The dtypes the run's dispatched calls take: the model's (fp32 or bf16) and bf16 under bf16 autocast; a
    float64 model dispatches none."""
    dt: str = cfg.model.dtype
    out = [dt] if dt in ("fp32", "bf16") else []
    if cfg.model.autocast == "bf16" and "bf16" not in out:
        out.append("bf16")
    return out


FP32_ONLY = ("router_topk", "grouped_gemm")
"""Kernels the trainer dispatches in fp32 only (the router logits and the fp32 grouped expert GEMM)."""


def install_for(cfg: TrainerConfig, device: str, log: Callable[[str], None]) -> KernelState:
    """``install`` with this config's registry, model shape, micro-batch, sequence lengths (a cp rank's part of
    them) and layout."""
    seqs = [s // cfg.parallelism.cp for s in (cfg.data.seq_len, *(c.seq_len for c in cfg.data.seq_len_curriculum))]
    p = cfg.parallelism
    return install(cfg.kernels.registry, resolved_model_values(cfg.model), cfg.data.micro_batch_size, seqs, device,
                   log, layout=(p.tp, p.ep, p.etp))


def device_for_backend(backend: str) -> str:
    """The device kind a registry's backend runs on (cpu-c: cpu, cuda-triton: cuda, npu-ascendc: npu)."""
    return {b: d for d, b in BACKEND_FOR_DEVICE.items()}.get(backend, "cpu")


def registry_covers(data: Mapping[str, Any], cfg: TrainerConfig) -> list[str]:
    """'kernel/dtype/bucket' of the registry's entries that this run calls (its backend's device, the run's
    shape classes and dtypes)."""
    from trex.kernels import registry as reg

    dtypes = run_kernel_dtypes(cfg)
    out = []
    for kernel, dims in run_kernel_shapes(cfg, device_for_backend(str(data.get("backend")))):
        for dtype in ("fp32",) if kernel in FP32_ONLY else dtypes:
            if reg.lookup(data, kernel, dims, dtype) is not None:
                out.append(f"{kernel}/{dtype}/{shape_bucket(dims)}")
    return out


def registry_problem(cfg: TrainerConfig, field_name: str = "kernels.registry") -> tuple[str, str] | None:
    """A registry file that exists now and has no entry for any of the run's shape classes: (field, message)
    naming ``field_name`` (the validate => run rule: attached, it would activate nothing); None when it covers
    one, is not set or is not readable here (a path inside the pod)."""
    from trex.kernels import registry as reg

    path = cfg.kernels.registry
    if not path or not Path(path).is_file():
        return None
    try:
        data = reg.load(path)
    except (OSError, ValueError):
        return None
    return None if registry_covers(data, cfg) else (field_name, uncovered_message(data, cfg))


def uncovered_message(data: Mapping[str, Any], cfg: TrainerConfig) -> str:
    """Why a registry activates nothing for this run: the shape classes it has against the ones the run calls."""
    have = sorted({f"{k}/{b}" for k, by in (data.get("kernels") or {}).items() for b in by})
    want = sorted({f"{k}/{shape_bucket(d)}" for k, d in run_kernel_shapes(cfg, device_for_backend(
        str(data.get("backend"))))})
    return (f"covers none of the run's {len(want)} kernel shape classes (it has {', '.join(have[:4]) or 'none'}"
            f"{', ...' if len(have) > 4 else ''}; the run calls e.g. {', '.join(want[:4])}): tune it with "
            "shapesFrom naming this TrainJob")


def check_kernel(comp: Compiled, shape: Mapping[str, int], dtype: str, scalars: Mapping[str, float]) -> str | None:
    """Compare the compiled kernel with the eager op on ``shape`` (suite inputs, two seeds) within the kernel's
    declared tolerance; the reason it disagrees, or None."""
    from trex.kernels.verify import check_outputs

    spec = dataclasses.replace(comp.spec, scalars={**comp.spec.scalars, **scalars})
    bound = copy.copy(comp)
    bound.spec = spec
    for seed in (0, 1):
        inputs = spec.make_inputs(shape, dtype, 7 + seed)
        try:
            outs = bound(inputs, shape)
        except Exception as e:  # a kernel that crashes is refused, not fatal
            return f"raised {type(e).__name__}: {e}"
        if spec.compare is None:
            ref = {k: v.double() for k, v in spec.eager(inputs, shape, spec.scalars).items()}
        else:  # a selection (router top-k) is judged by its own rule, against the float64 form of the same op
            ref = spec.reference({k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}, shape,
                                 spec.scalars)
        why = check_outputs(spec, dtype, inputs, outs, ref, shape)
        if why:
            return f"disagrees with eager on {shape_key(shape)}: {why}"
    return None


def training_params(params: Mapping[str, int], device: str) -> dict[str, int]:
    """The registry's tuned parameters as the trainer runs them: on CPU with one OpenMP thread.

    Inside a training step each kernel is one op among torch's, called from the thread that runs them. A
    kernel of its own THREADS > 1 opens a parallel region beside torch's intra-op ones (the same libgomp pool),
    whose barrier waits for every member: on a busy host, a worker that was descheduled or is spinning after
    torch's last region stalls a 20-200 us kernel for a scheduler slice. Run serially, the kernel never waits on
    another thread; tune with ``threads: 1`` so the other parameters are chosen for that case."""
    out = {k: int(v) for k, v in params.items()}
    if device == "cpu" and "THREADS" in out:
        out["THREADS"] = 1
    return out


@contextlib.contextmanager
def untuned() -> Iterator[None]:
    """Every dispatched op on its eager path while inside: the untuned baseline a tuned run is timed against."""
    saved = dict(layers.TUNED)
    layers.TUNED.clear()
    try:
        yield
    finally:
        layers.TUNED.update(saved)


def tuned_vs_untuned(step: Callable[[], None], tokens: int, repeats: int = 3) -> dict[str, float]:
    """Tokens/s of ``step`` (one forward and backward of ``tokens`` tokens) with the accepted kernels and on the
    eager path, interleaved after one warm-up of each, median of ``repeats`` each; the coverage's call counts are
    left as the run made them."""
    called, calls = Counter(STATE.called), Counter(STATE.calls)
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        for i in range(repeats + 1):
            for tuned in (True, False):
                with contextlib.nullcontext() if tuned else untuned():
                    t0 = time.perf_counter()
                    step()
                    dt = time.perf_counter() - t0
                if i:
                    times[tuned].append(dt)
    finally:
        STATE.called, STATE.calls = called, calls
    tuned_s, eager_s = statistics.median(times[True]), statistics.median(times[False])
    return {"tokens": tokens, "tunedTokensPerSecond": round(tokens / tuned_s, 1),
            "untunedTokensPerSecond": round(tokens / eager_s, 1), "speedup": round(eager_s / tuned_s, 3)}


def install(registry: str | Path | None, values: Mapping[str, Any], micro_batch: int, seq_lens: list[int],
            device: str, log: Callable[[str], None], backend: Backend | None = None,
            layout: tuple[int, int, int] = (1, 1, 1)) -> KernelState:
    """Load, compile and check the registry's kernels for this run's shapes (one rank's, under the (tp, ep, etp)
    ``layout``); route every dispatched call through layers.TUNED, which runs the accepted ones and counts each
    call's shape class for the coverage. No registry (or none for this device) leaves every op eager."""
    global STATE
    STATE = KernelState()
    layers.TUNED.clear()
    if not registry:
        return STATE
    from trex.kernels import registry as reg
    from trex.kernels.backends import get_backend

    tp, ep, etp = layout
    shapes = trainer_kernel_shapes(values, micro_batch, seq_lens, device, tp=tp, ep=ep, etp=etp)
    STATE.run = {(k, shape_bucket(d)) for k, d in shapes}
    try:
        data = reg.load(registry)
    except (OSError, ValueError) as e:
        STATE.refused["registry"] = f"unreadable: {e}"
        log(f"kernels: registry {registry} refused ({e}); every op stays eager")
        return STATE
    want = BACKEND_FOR_DEVICE.get(device, "")
    if data.get("backend") != want:
        STATE.refused["registry"] = f"backend {data.get('backend')} does not run on {device} (needs {want})"
        log(f"kernels: registry {registry} is for {data.get('backend')}, this run is on {device}; every op stays eager")
        return STATE
    be = backend or get_backend(want)
    scalars = {"eps": float(values.get("norm_eps", 1e-6)), "limit": float(values.get("swiglu_limit", 0.0)) or math.inf}
    for kernel, dims in shapes:
        spec = SUITE[kernel]
        mine = {k: v for k, v in scalars.items() if k in spec.scalars}
        for dtype in ("fp32", "bf16"):
            entry = reg.lookup(data, kernel, dims, dtype)
            if entry is None:
                continue
            STATE.tuned.add((kernel, dtype, shape_bucket(dims)))
            key = f"{kernel}/{dtype}/{shape_bucket(dims)}"
            try:
                comp = be.compile(spec, training_params(entry["params"], device), dtype)
                why = check_kernel(comp, dims, dtype, mine)
            except Exception as e:  # a build failure refuses the kernel, never the run
                why = f"build failed: {type(e).__name__}: {str(e)[:300]}"
            if why:
                STATE.refused[key] = why
                log(f"kernels: refused {key}: {why}")
                continue
            STATE.compiled[(kernel, dtype, shape_bucket(dims))] = comp
    layers.TUNED.update(DISPATCH)
    one = " (1 thread each)" if device == "cpu" else ""
    log(f"kernels: {len(STATE.compiled)} tuned kernel(s) active{one} from {registry}: "
        f"{', '.join(STATE.active) or 'none'}")
    log(STATE.coverage_line())
    return STATE
