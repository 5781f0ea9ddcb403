"""Reverse KL(p_student || p_teacher) over the full vocabulary, fused with both heads and chunked over tokens.

The student's and the teacher's logits are made from their pre-head hidden states and head weights one
chunk of tokens at a time (``h @ W^T``), both log-sum-exps are taken in the same pass, and the per-token
KL sum_v p_s (log p_s - log p_t) is reduced before the next chunk: no more than a chunk of [T, V] logits is
ever alive. While the chunk is there, the closed form d KL / d z_s = p_s * (log p_s - log p_t - KL) gives
its share of the gradients of the student's hidden states and head weight (the teacher is a constant),
so the logits are made once, not again in the backward. With ``group`` the heads are sharded on the
vocabulary over a tensor-parallel group: the maxima, the exp-sums and the KL are all-reduced over it, and
the hidden states' gradient (each rank's share of the vocabulary) is summed over it.

The ``sampled-token`` estimator is the cheap comparison: its value is log p_s(y) - log p_t(y) at the sampled
token y and its gradient the score-function estimate (log p_s(y) - log p_t(y)) * grad log p_s(y), unbiased
for the KL's gradient under y ~ p_s, with far more variance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

Estimator = Literal["full-vocab", "sampled-token"]
ESTIMATORS: tuple[Estimator, ...] = ("full-vocab", "sampled-token")


@dataclass(frozen=True)
class KLOutput:
    """The weighted loss and, per token (detached), the KL value and the student's entropy."""

    loss: torch.Tensor
    kl: torch.Tensor
    """[N] KL(p_s || p_t) per token (full-vocab), or the sampled-token log-ratio."""
    entropy: torch.Tensor
    """[N] the student's entropy per token."""


def _all_reduce(x: torch.Tensor, group: Any, op: str) -> torch.Tensor:
    if group is not None:
        import torch.distributed as dist

        dist.all_reduce(x, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=group)
    return x


def _log_softmax(z: torch.Tensor, group: Any) -> torch.Tensor:
    """log softmax over the (possibly vocabulary-sharded) last dimension, in place of z (one temporary)."""
    top = _all_reduce(z.amax(dim=-1, keepdim=True), group, "max")
    norm = _all_reduce(torch.sub(z, top).exp_().sum(dim=-1, keepdim=True), group, "sum")
    return z.sub_(top + norm.log())


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum_v a[i, v] * b[i, v] without an [N, V] temporary."""
    return torch.einsum("ij,ij->i", a, b)


class _ChunkedKL(torch.autograd.Function):
    """sum_i c_i * KL_i(h_s, W_s, h_t, W_t); outputs (loss, per-token KL, per-token student entropy).

    Each chunk's logits are made once: the same pass reduces the KL and, when a gradient is wanted, turns
    the chunk into d(loss)/d(z_s) and multiplies it into both student gradients ([N, D] and [V, D], never
    [N, V]); the backward only scales them by the incoming gradient (four GEMMs per chunk in all, as many
    as the unfused forward and backward)."""

    @staticmethod
    def forward(ctx: Any, hs: torch.Tensor, ws: torch.Tensor, ht: torch.Tensor, wt: torch.Tensor,
                coef: torch.Tensor, tokens: torch.Tensor | None, sampled: bool, chunk: int, group: Any,
                vocab_start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dtype = torch.float64 if hs.dtype == torch.float64 else torch.float32
        n = hs.shape[0]
        need_h, need_w = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        kl = torch.empty(n, dtype=dtype, device=hs.device)
        ent = torch.empty(n, dtype=dtype, device=hs.device)
        grad_h = torch.empty(hs.shape, dtype=dtype, device=hs.device) if need_h else None
        grad_w = torch.zeros(ws.shape, dtype=dtype, device=ws.device) if need_w else None
        scale = coef.to(dtype)
        with torch.autocast(hs.device.type, enabled=False):
            wsc, wtc = ws.to(dtype), wt.to(dtype)
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                hc = hs[s:e].to(dtype)
                lps = _log_softmax(hc @ wsc.T, group)
                lpt = _log_softmax(ht[s:e].to(dtype) @ wtc.T, group)
                ps = lps.exp()
                ent[s:e] = _all_reduce(-_rowdot(ps, lps), group, "sum")
                diff = lps.sub_(lpt)  # log p_s - log p_t, in place of log p_s
                del lpt
                if sampled:
                    assert tokens is not None
                    kl[s:e] = _pick(diff, tokens[s:e], vocab_start, group)
                else:
                    kl[s:e] = _all_reduce(_rowdot(ps, diff), group, "sum")
                if grad_h is None and grad_w is None:
                    continue
                if sampled:  # d/dz [c * log p_s(y)] = c * (onehot(y) - p_s), c = the log-ratio (a constant)
                    g = ps.neg_()
                    local = tokens[s:e] - vocab_start  # type: ignore[index]
                    rows = ((local >= 0) & (local < g.shape[1])).nonzero().squeeze(1)
                    g[rows, local[rows]] += 1.0
                    g.mul_((kl[s:e] * scale[s:e])[:, None])
                else:  # d KL / d z_s = p_s * (log p_s - log p_t - KL)
                    g = diff.sub_(kl[s:e, None]).mul_(ps).mul_(scale[s:e, None])
                if grad_h is not None:
                    torch.mm(g, wsc, out=grad_h[s:e])
                if grad_w is not None:
                    grad_w.addmm_(g.T, hc)
        if grad_h is not None:
            grad_h = _all_reduce(grad_h, group, "sum")  # every rank's share of the vocabulary
        ctx.grads = (grad_h.to(hs.dtype) if grad_h is not None else None,
                     grad_w.to(ws.dtype) if grad_w is not None else None)
        ctx.mark_non_differentiable(kl, ent)
        loss = (kl * scale).sum()
        return loss, kl, ent

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, ...]:
        grad_h, grad_w = ctx.grads
        ctx.grads = (None, None)
        # Scaled in place: the gradients were made for this one backward (no retain_graph reuse).
        return (grad_h.mul_(grad_loss) if grad_h is not None else None,
                grad_w.mul_(grad_loss) if grad_w is not None else None,
                None, None, None, None, None, None, None, None)


def _pick(values: torch.Tensor, tokens: torch.Tensor, vocab_start: int, group: Any) -> torch.Tensor:
    """values[i, tokens[i]] for global token ids over a vocabulary shard starting at vocab_start."""
    local = tokens - vocab_start
    inside = (local >= 0) & (local < values.shape[1])
    picked = values.gather(1, local.clamp(0, values.shape[1] - 1)[:, None]).squeeze(1) * inside
    return _all_reduce(picked, group, "sum")


def reverse_kl(student_hidden: torch.Tensor, student_head: torch.Tensor, teacher_hidden: torch.Tensor,
               teacher_head: torch.Tensor, coef: torch.Tensor, *, estimator: Estimator = "full-vocab",
               tokens: torch.Tensor | None = None, chunk_size: int = 1024, group: Any = None,
               vocab_start: int | None = None) -> KLOutput:
    """sum_i coef_i * KL(p_s || p_t) at each of N tokens, from hidden states [N, D_s] / [N, D_t] and head
    weights [V, D_s] / [V, D_t] (with ``group``: this rank's contiguous vocabulary shard [V / tp, D] of
    each head). ``coef`` [N] carries the teacher weight, the mask and the token-mean normaliser
    (:func:`token_coefficients`). ``tokens`` [N] (global ids): the sampled tokens, for ``sampled-token``.
    ``vocab_start``: the first vocabulary row of this rank's shard (default: its rank in ``group`` times the
    shard's rows).
    Gradients flow to the student's hidden states and head; the teacher's inputs are constants."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
    if student_hidden.dim() != 2 or teacher_hidden.dim() != 2 or student_hidden.shape[0] != teacher_hidden.shape[0]:
        raise ValueError(f"hidden states must be [N, D] with one N, got {tuple(student_hidden.shape)} and "
                         f"{tuple(teacher_hidden.shape)}")
    if student_head.shape[0] != teacher_head.shape[0]:
        raise ValueError(f"student and teacher heads must share the vocabulary (shard), got {student_head.shape[0]} "
                         f"and {teacher_head.shape[0]} rows")
    if student_head.shape[1] != student_hidden.shape[1] or teacher_head.shape[1] != teacher_hidden.shape[1]:
        raise ValueError("a head's width does not match its hidden states")
    if coef.shape != student_hidden.shape[:1]:
        raise ValueError(f"coef must have shape [{student_hidden.shape[0]}], got {tuple(coef.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    sampled = estimator == "sampled-token"
    if sampled and (tokens is None or tokens.shape != coef.shape):
        raise ValueError("tokens [N]: required by the sampled-token estimator")
    if vocab_start is None:
        vocab_start = 0
        if group is not None:
            import torch.distributed as dist

            vocab_start = dist.get_rank(group) * student_head.shape[0]
    loss, kl, ent = _ChunkedKL.apply(  # type: ignore[no-untyped-call]
        student_hidden, student_head, teacher_hidden.detach(), teacher_head.detach(), coef.detach(),
        tokens if sampled else None, sampled, chunk_size, group, vocab_start)
    return KLOutput(loss, kl, ent)


def token_coefficients(mask: torch.Tensor, weight: torch.Tensor | float = 1.0,
                       denominator: float | None = None) -> torch.Tensor:
    """Per-token loss coefficients for a token-mean aggregation: weight * mask / (valid tokens), where
    ``weight`` is the token's teacher weight (scalar or per token) and ``denominator`` the valid-token count of
    the whole batch (default: mask.sum(), for a batch of one teacher)."""
    m = mask.to(torch.float64)
    n = float(m.sum()) if denominator is None else denominator
    if n <= 0:
        raise ValueError("no valid tokens (the mask is all zero)")
    w = torch.as_tensor(weight, dtype=torch.float64, device=mask.device)
    return (m * w / n).reshape(-1)


def shard_rows(weight: torch.Tensor, group: Any) -> torch.Tensor:
    """This rank's contiguous share of a [V, D] head's rows over ``group`` (V divisible by its size)."""
    import torch.distributed as dist

    tp, rank = dist.get_world_size(group), dist.get_rank(group)
    if weight.shape[0] % tp:
        raise ValueError(f"vocabulary {weight.shape[0]} is not divisible by the tp group size {tp}")
    size = weight.shape[0] // tp
    return weight[rank * size:(rank + 1) * size]
