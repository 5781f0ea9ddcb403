"""Training loss: masked next-token cross-entropy + weighted MTP loss + weighted sequence balance loss."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from trex.trainer.config import RoutingConfig
    from trex.trainer.model.model import ModelOutput

IGNORE = -100


def _valid(labels: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
    """Float weights [B, T]: 0 where the label is ignored or masked out, the mask value otherwise."""
    keep = (labels != IGNORE).float()
    return keep if loss_mask is None else keep * loss_mask.float()


def masked_ce(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted mean cross-entropy (fp32) over positions with weight > 0; 0 when there are none."""
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.clamp(min=0).reshape(-1),
                         reduction="none")
    w = weights.reshape(-1)
    return (ce * w).sum() / w.sum().clamp(min=1e-12)


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


def compute_loss(out: ModelOutput, labels: torch.Tensor, loss_mask: torch.Tensor | None,
                 routing: RoutingConfig, step: int) -> tuple[torch.Tensor, dict[str, float]]:
    """total = lm + w_mtp(step) * mean_k mtp_k + sequence_balance_weight * balance + indexer.

    labels [B, T] are the next tokens (-100 = ignore); loss_mask [B, T] optional weights. The MTP
    weight is mtp_loss_weight before mtp_weight_drop_step and mtp_loss_weight_late from then on.
    The csa indexer loss only trains the indexer (its inputs and targets are detached).
    Returns (total, parts) with parts "lm", "mtp", "balance", "indexer", "total" as floats.
    """
    lm = masked_ce(out.logits, labels, _valid(labels, loss_mask))
    zero = lm.new_zeros(())
    mtp = zero
    if out.mtp_logits:
        terms = []
        for k, logits in enumerate(out.mtp_logits):
            tgt, w = mtp_targets(labels, loss_mask, out.doc_ids, k + 1)
            terms.append(masked_ce(logits, tgt, w))
        mtp = torch.stack(terms).mean()
    w_mtp = routing.mtp_loss_weight if step < routing.mtp_weight_drop_step else routing.mtp_loss_weight_late
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
