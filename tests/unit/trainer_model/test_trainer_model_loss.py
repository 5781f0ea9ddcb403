"""Loss: masked CE vs a float64 log-softmax reference, MTP target alignment, MTP weight schedule, MTP inputs."""

from __future__ import annotations

import math

import pytest
import torch
from trex.trainer.config import RoutingConfig
from trex.trainer.model import ModelArgs, ModelOutput, build_model_from_args, compute_loss
from trex.trainer.model.loss import mtp_targets


def test_mtp_targets_shift_and_stop_at_masks_and_documents() -> None:
    labels = torch.tensor([[10, 11, 12, -100, 14, 15, 16, 17]])
    docs = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
    tgt, w = mtp_targets(labels, None, docs, shift=1)
    assert tgt.tolist() == [[11, 12, -100, 14, 15, 16, 17, -100]]
    # t=2: label 2 ok but the target's label (t=3) is ignored; t=3: own label ignored;
    # t=7: beyond the sequence
    assert w.tolist() == [[1, 1, 0, 0, 1, 1, 1, 0]]
    tgt2, w2 = mtp_targets(labels, None, docs, shift=2)
    assert tgt2[0, :6].tolist() == [12, -100, 14, 15, 16, 17]
    assert w2.tolist() == [[1, 0, 0, 0, 1, 1, 0, 0]]
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 1, 1]])
    _, w3 = mtp_targets(labels, mask, None, shift=1)
    assert w3.tolist() == [[1, 1, 0, 0, 0, 0, 1, 0]]
    # documents without ignored labels at the boundary: the doc check alone stops the crossing
    labels_b = torch.arange(8)[None]
    _, w4 = mtp_targets(labels_b, None, docs, shift=1)
    assert w4.tolist() == [[1, 1, 1, 0, 1, 1, 1, 0]]


def _ref_ce(logits: torch.Tensor, targets: list[int], weights: list[float]) -> float:
    tot, n = 0.0, 0.0
    for row, tgt, wt in zip(logits.double().tolist(), targets, weights, strict=True):
        if wt == 0:
            continue
        lse = math.log(sum(math.exp(v) for v in row))
        tot += wt * (lse - row[tgt])
        n += wt
    return tot / n


def test_compute_loss_matches_reference_and_weights() -> None:
    torch.manual_seed(0)
    b, t, v = 1, 6, 7
    logits = torch.randn(b, t, v)
    mtp0 = torch.randn(b, t, v)
    labels = torch.tensor([[1, 2, -100, 4, 5, 6]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0, 1.0]])
    out = ModelOutput(logits=logits, mtp_logits=[mtp0], balance_loss=torch.tensor(3.0),
                      expert_counts=torch.zeros(1, 4, dtype=torch.long), indexer_loss=torch.tensor(0.25))
    routing = RoutingConfig(mtp_loss_weight=0.3, mtp_loss_weight_late=0.1, mtp_weight_drop_step=10,
                            sequence_balance_weight=0.01)
    total, parts = compute_loss(out, labels, mask, routing, step=0)
    lm = _ref_ce(logits[0], [1, 2, 0, 4, 5, 6], [1, 1, 0, 1, 0, 1])
    # MTP at t predicts labels[t + 1]: valid where labels/mask at t and t+1 are kept
    mtp = _ref_ce(mtp0[0], [2, 0, 4, 5, 6, 0], [1, 0, 0, 0, 0, 0])
    assert parts["lm"] == pytest.approx(lm, rel=1e-5)
    assert parts["mtp"] == pytest.approx(mtp, rel=1e-5)
    assert parts["balance"] == pytest.approx(3.0)
    assert float(total) == pytest.approx(lm + 0.3 * mtp + 0.03 + 0.25, rel=1e-5)
    total_late, parts_late = compute_loss(out, labels, mask, routing, step=10)
    assert float(total_late) == pytest.approx(lm + 0.1 * mtp + 0.03 + 0.25, rel=1e-5)
    assert set(parts_late) >= {"lm", "mtp", "balance", "total"}


def test_mtp_head_sees_tokens_up_to_t_plus_one() -> None:
    """mtp_logits[0] at position t combines h_t and the embedding of token t+1 (it predicts t+2)."""
    model = build_model_from_args(ModelArgs(mtp_depth=2), seed=0).eval()
    x = torch.randint(0, 512, (1, 16))
    y = x.clone()
    p = 9
    y[0, p] = (x[0, p] + 7) % 512
    with torch.no_grad():
        ox, oy = model(x), model(y)
    for k, (a, b) in enumerate(zip(ox.mtp_logits, oy.mtp_logits, strict=True)):
        first = p - (k + 1)  # first position whose MTP-k input includes token p
        assert torch.allclose(a[0, :first], b[0, :first], atol=1e-6)
        assert not torch.allclose(a[0, first], b[0, first], atol=1e-4)
    assert len(ox.mtp_logits) == 2 and ox.mtp_logits[0].shape == ox.logits.shape


def test_mtp_weight_drops_where_the_lr_decay_starts_by_default() -> None:
    from trex.trainer.config import NEVER, TrainerConfig

    cfg = TrainerConfig.model_validate({"optimizer": {"schedule": {"warmupSteps": 7, "constantSteps": 5}}})
    assert cfg.routing.mtp_weight_drop_step == 12
    flat = TrainerConfig.model_validate({"optimizer": {"schedule": {"decay": "none"}}})
    assert flat.routing.mtp_weight_drop_step == NEVER
    explicit = TrainerConfig.model_validate({"routing": {"mtpWeightDropStep": 3}})
    assert explicit.routing.mtp_weight_drop_step == 3
    assert TrainerConfig().routing.mtp_weight_drop_step == 10  # default schedule: 10 warmup steps, no plateau
