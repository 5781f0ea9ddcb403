"""Training loss: masked next-token cross-entropy + weighted MTP loss + weighted sequence balance loss."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from trex.trainer.model.layers import upcast

if TYPE_CHECKING:
    from trex.trainer.config import RoutingConfig
    from trex.trainer.model.model import ModelOutput

IGNORE = -100


def _valid(labels: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
    """Float weights [B, T]: 0 where the label is ignored or masked out, the mask value otherwise."""
    keep = (labels != IGNORE).float()
    return keep if loss_mask is None else keep * loss_mask.float()


def loss_tokens(labels: torch.Tensor, loss_mask: torch.Tensor | None) -> float:
    """The weight the lm term averages over: the loss-mask sum of the labels that are not ignored."""
    return float(_valid(labels, loss_mask).sum())


def masked_ce(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor,
              norm: float | None = None) -> torch.Tensor:
    """Weighted mean cross-entropy (>= fp32: a float64 model keeps float64) over positions with weight > 0;
    0 when there are none. ``norm``: divide the weighted sum by it instead of the weights' sum."""
    ce = F.cross_entropy(upcast(logits).reshape(-1, logits.shape[-1]), targets.clamp(min=0).reshape(-1),
                         reduction="none")
    w = weights.reshape(-1).to(ce.dtype)
    return (ce * w).sum() / (w.sum().clamp(min=1e-12) if norm is None else max(norm, 1e-12))


CHUNK_BYTES = 4 << 20
"""fp32 logits per row chunk of the fused head + cross-entropy on CPU (small enough to stay in cache)."""
DEVICE_CHUNK_BYTES = 256 << 20
"""The same on accelerators, where larger chunks keep the GEMMs big and the chunk count low."""
GRAD_BUFFER_BYTES = 512 << 20
"""Up to this size the fused loss keeps d(loss)/d(logits) for one weight-gradient GEMM at the end;
larger (big vocabularies x many tokens) it accumulates the weight gradient chunk by chunk instead."""


class _LinearCrossEntropy(torch.autograd.Function):
    """sum_i w_i * CE(h_i @ W^T, t_i) without materialising the logits: each row chunk's logits are made,
    reduced and turned into d(loss)/d(logits) = w * (softmax - onehot) at once, so the forward also
    computes both input gradients (one softmax pass instead of forward, log-softmax backward and fills);
    backward only scales them by the incoming gradient."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                weights: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
        need = bool(ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        n, vocab = h.shape[0], weight.shape[0]
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.to(compute_dtype), weight.to(compute_dtype)
            budget = CHUNK_BYTES if h.device.type == "cpu" else DEVICE_CHUNK_BYTES
            rows = max(1, min(n, max(64, budget // (4 * vocab))))
            keep = need and n * vocab * hc.element_size() <= GRAD_BUFFER_BYTES
            g_all = hc.new_empty((n, vocab)) if keep else None
            grad_h = torch.empty_like(hc) if need else None
            grad_w = (None if not need or keep else
                      torch.zeros(weight.shape, dtype=torch.float32, device=weight.device))
            # Buffers reused by every chunk: the GEMM's output, and its fp32 copy when the GEMM is narrower (a
            # float64 model keeps float64, so its loss does not depend on how the tokens are split into rows).
            zb = hc.new_empty((rows, vocab))
            soft = torch.float64 if zb.dtype == torch.float64 else torch.float32
            zf = zb if zb.dtype == soft else torch.empty((rows, vocab), dtype=soft, device=h.device)
            total = torch.zeros((), dtype=soft, device=h.device)
            for s in range(0, n, rows):
                e = min(n, s + rows)
                z = zf[:e - s]
                torch.mm(hc[s:e], wc.T, out=zb[:e - s])
                if zf is not zb:
                    z.copy_(zb[:e - s])
                tgt = targets[s:e, None]
                w = weights[s:e].to(soft)
                picked = z.gather(1, tgt).squeeze(1)
                top = z.amax(dim=-1, keepdim=True)
                z.sub_(top).exp_()  # one exp pass serves both the log-sum-exp and the softmax
                norm = z.sum(dim=-1)
                total += ((top.squeeze(1) + norm.log() - picked) * w).sum()
                if not need:
                    continue
                z.mul_((w / norm)[:, None])  # w * softmax
                z.scatter_add_(1, tgt, -w[:, None])  # minus w * onehot
                g = g_all[s:e] if g_all is not None else zb[:e - s]
                if g.data_ptr() != z.data_ptr():
                    g.copy_(z)
                assert grad_h is not None
                torch.mm(g, wc, out=grad_h[s:e])
                if grad_w is not None:
                    grad_w.add_(g.T @ hc[s:e])
            if need:
                assert grad_h is not None
                gw = (g_all.T @ hc) if g_all is not None else grad_w
                assert gw is not None
                ctx.save_for_backward(grad_h.to(h.dtype), gw.to(weight.dtype))
        return total

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        # Scaled in place: the gradients were made for this one backward (no retain_graph reuse).
        return grad_h.mul_(grad_out), grad_w.mul_(grad_out), None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         weights: torch.Tensor, norm: float | None = None) -> torch.Tensor:
    """masked_ce(hidden @ weight.T, targets, weights, norm) fused with the head: same value and gradients, no
    [N, V] logits kept. Runs the GEMMs in the autocast dtype when autocast is on, softmax in fp32 (float64
    for a float64 model)."""
    kind = hidden.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype
    w = upcast(weights.reshape(-1))
    w = w / (w.sum().clamp(min=1e-12) if norm is None else max(norm, 1e-12))
    loss: torch.Tensor = _LinearCrossEntropy.apply(  # type: ignore[no-untyped-call]
        hidden.reshape(-1, hidden.shape[-1]), weight, targets.clamp(min=0).reshape(-1), w, dtype)
    return loss


def _ce(out: ModelOutput, k: int | None, targets: torch.Tensor, weights: torch.Tensor,
        norm: float | None = None) -> torch.Tensor:
    """Cross-entropy of the trunk head (k None) or MTP head k, fused when the forward skipped the logits."""
    hidden = out.hidden if k is None else (out.mtp_hidden[k] if out.mtp_hidden else None)
    if hidden is not None and out.head_weight is not None:
        return linear_cross_entropy(hidden, out.head_weight, targets, weights, norm)
    logits = out.logits if k is None else out.mtp_logits[k]
    if logits is None:
        raise ValueError("model output has neither logits nor hidden states with a head weight")
    return masked_ce(logits, targets, weights, norm)


def mtp_targets(labels: torch.Tensor, loss_mask: torch.Tensor | None, doc_ids: torch.Tensor | None,
                shift: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets and weights [B, T] for an MTP head that predicts labels[t + shift] at position t.

    Position t counts only when every label on the way (t .. t + shift) is kept by the mask, and
    t + shift lies in the same document as t, so a target never crosses a masked span or a document.
    """
    t = labels.shape[1]
    base = _valid(labels, loss_mask)
    targets = torch.full_like(labels, IGNORE)
    weights = torch.zeros_like(base)
    if shift >= t:
        return targets, weights
    n = t - shift
    targets[:, :n] = labels[:, shift:]
    w = base[:, shift:].clone()
    for j in range(shift):
        w = w * (base[:, j:j + n] > 0).float()
    if doc_ids is not None:
        w = w * (doc_ids[:, :n] == doc_ids[:, shift:]).float()
    weights[:, :n] = w
    return targets, weights


MTPTargets = list[tuple[torch.Tensor, torch.Tensor, float]]
"""Per MTP depth: (targets [B, t], weights [B, t], the weight sum the term averages over)."""


def compute_loss(out: ModelOutput, labels: torch.Tensor, loss_mask: torch.Tensor | None,
                 routing: RoutingConfig, step: int, lm_tokens: float | None = None,
                 mtp_given: MTPTargets | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """total = lm + w_mtp(step) * mean_k mtp_k + sequence_balance_weight * balance + indexer.

    labels [B, T] are the next tokens (-100 = ignore); loss_mask [B, T] optional weights. The MTP
    weight is mtp_loss_weight before mtp_weight_drop_step and mtp_loss_weight_late from then on.
    The csa indexer loss only trains the indexer (its inputs and targets are detached).
    ``lm_tokens``: the loss-token weight the lm term averages over (None: these labels' own; a context-parallel
    rank's chunks pass their whole sequences', so the ranks' lm terms sum to the sequences' mean).
    ``mtp_given``: the MTP heads' targets made on the whole sequences and cut to the chunks, with the whole
    sequences' weight sums (None: mtp_targets of these labels).
    Returns (total, parts) with parts "lm", "mtp", "balance", "indexer", "total" as floats.
    """
    lm = _ce(out, None, labels, _valid(labels, loss_mask), lm_tokens)
    zero = lm.new_zeros(())
    mtp = zero
    n_mtp = len(out.mtp_hidden) or len(out.mtp_logits)
    if n_mtp:
        terms = []
        for k in range(n_mtp):
            if mtp_given is not None:
                tgt, w, norm = mtp_given[k]
                terms.append(_ce(out, k, tgt, w, norm))
                continue
            tgt, w = mtp_targets(labels, loss_mask, out.doc_ids, k + 1)
            terms.append(_ce(out, k, tgt, w))
        mtp = torch.stack(terms).mean()
    drop = routing.mtp_weight_drop_step  # resolved from the LR schedule by TrainerConfig; None = never
    w_mtp = routing.mtp_loss_weight_late if drop is not None and step >= drop else routing.mtp_loss_weight
    balance = out.balance_loss.float()
    indexer = out.indexer_loss.float()
    total = lm + w_mtp * mtp + routing.sequence_balance_weight * balance + indexer
    parts = {
        "lm": float(lm.detach()),
        "mtp": float(mtp.detach()),
        "balance": float(balance.detach()),
        "indexer": float(indexer.detach()),
        "total": float(total.detach()),
    }
    return total, parts
