"""Fused head + cross-entropy: value and gradients against an unfused float64 reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from trex.trainer.model import loss as loss_mod
from trex.trainer.model.loss import IGNORE, linear_cross_entropy


def _case(seed: int, n: int = 70, d: int = 24, v: int = 300) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g)
    w = torch.randn(v, d, generator=g) * 0.3
    targets = torch.randint(0, v, (n,), generator=g)
    targets[::7] = IGNORE
    weights = (targets != IGNORE).float() * torch.rand(n, generator=g)
    return h, w, targets, weights


def _reference(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor,
               weights: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Unfused float64: logits, F.cross_entropy, weighted mean; autograd gradients."""
    h64 = h.double().requires_grad_(True)
    w64 = w.double().requires_grad_(True)
    ce = F.cross_entropy(h64 @ w64.T, targets.clamp(min=0), reduction="none")
    loss = (ce * weights.double()).sum() / weights.double().sum()
    loss.backward()
    assert h64.grad is not None and w64.grad is not None
    return float(loss.detach()), h64.grad, w64.grad


@pytest.mark.parametrize("buffer_bytes", [loss_mod.GRAD_BUFFER_BYTES, 0])
@pytest.mark.parametrize("chunk_bytes", [loss_mod.CHUNK_BYTES, 1])
def test_fused_matches_float64_reference(monkeypatch: pytest.MonkeyPatch, buffer_bytes: int,
                                         chunk_bytes: int) -> None:
    """Whole-buffer and chunk-accumulated weight gradients, one chunk and many (64-row) chunks."""
    monkeypatch.setattr(loss_mod, "GRAD_BUFFER_BYTES", buffer_bytes)
    monkeypatch.setattr(loss_mod, "CHUNK_BYTES", chunk_bytes)
    h, w, targets, weights = _case(0, n=150)
    ref, gh, gw = _reference(h, w, targets, weights)
    hp, wp = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    out = linear_cross_entropy(hp, wp, targets, weights)
    (out * 2.5).backward()  # the incoming gradient scales both input gradients
    assert abs(float(out.detach()) - ref) < 1e-5
    assert hp.grad is not None and wp.grad is not None
    assert torch.allclose(hp.grad.double(), 2.5 * gh, atol=1e-6)
    assert torch.allclose(wp.grad.double(), 2.5 * gw, atol=1e-6)


def test_fused_bf16_autocast_close_to_reference() -> None:
    """Under bf16 autocast the GEMMs run in bf16 (softmax in fp32): bf16-level agreement."""
    h, w, targets, weights = _case(1)
    ref, gh, gw = _reference(h, w, targets, weights)
    hp, wp = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear_cross_entropy(hp, wp, targets, weights)
    out.backward()
    assert out.dtype == torch.float32 and abs(float(out.detach()) - ref) < 2e-2 * abs(ref)
    assert hp.grad is not None and wp.grad is not None
    assert hp.grad.dtype == torch.float32 and wp.grad.dtype == torch.float32
    assert (hp.grad.double() - gh).norm() < 2e-2 * gh.norm()
    assert (wp.grad.double() - gw).norm() < 2e-2 * gw.norm()


def test_fused_no_weights_and_no_grad() -> None:
    """All positions masked: loss 0 and zero gradients; without grad tracking only the value is made."""
    h, w, targets, weights = _case(2)
    hp = h.clone().requires_grad_(True)
    out = linear_cross_entropy(hp, w, targets, torch.zeros_like(weights))
    out.backward()
    assert float(out.detach()) == 0.0 and hp.grad is not None and not hp.grad.any()
    with torch.no_grad():
        value = linear_cross_entropy(h, w, targets, weights)
    assert not value.requires_grad and abs(float(value) - _reference(h, w, targets, weights)[0]) < 1e-5


def test_model_loss_same_with_and_without_logits() -> None:
    """compute_loss on a forward without logits (fused) equals the logits path, value and gradients."""
    from trex.trainer.config import RoutingConfig
    from trex.trainer.model import ModelArgs, build_model_from_args, compute_loss

    model = build_model_from_args(ModelArgs(mtp_depth=2), seed=0)
    ids = torch.randint(0, model.args.vocab_size, (2, 16))
    labels = ids.roll(-1, 1)
    labels[:, -1] = IGNORE
    routing = RoutingConfig()
    results = []
    for logits in (True, False):
        model.zero_grad(set_to_none=True)
        loss, parts = compute_loss(model(ids, logits=logits), labels, None, routing, 0)
        loss.backward()
        results.append((parts, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (pa, ga), (pb, gb) = results
    for k in ("lm", "mtp", "total"):
        assert abs(pa[k] - pb[k]) < 1e-5, k
    assert ga.keys() == gb.keys()
    for n in ga:
        assert torch.allclose(ga[n], gb[n], atol=1e-5, rtol=1e-4), n
