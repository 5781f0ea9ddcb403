"""Muon: hybrid Newton-Schulz against a float64 SVD, update RMS, invariances, parity with torch.optim.Muon."""

from __future__ import annotations

import math

import pytest
import torch
from trex.trainer.optim.muon import DEFAULT_STAGES, Muon, newton_schulz

SHAPES = [(96, 96), (160, 48), (48, 160), (3, 40, 24)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_hybrid_ns_singular_values_and_polar_factor(shape: tuple[int, ...]) -> None:
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    o = newton_schulz(g.float(), DEFAULT_STAGES).double()
    sv = torch.linalg.svdvals(o)
    assert sv.min() >= 0.999 and sv.max() <= 1.001
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    polar = u @ vh
    err = torch.linalg.matrix_norm(o - polar, ord=2)
    assert float(err.max()) < 2e-3


def test_quintic_alone_does_not_reach_one() -> None:
    """The quintic stage only lands singular values near 1; the cleanup stage is what makes them 1."""
    g = torch.randn(96, 96, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    sv = torch.linalg.svdvals(newton_schulz(g, [(10, (3.4445, -4.7750, 2.0315))], dtype=torch.float64))
    assert float((sv - 1).abs().max()) > 0.05


def test_ns_invariances() -> None:
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(64, 40, generator=gen)
    base = newton_schulz(g)
    torch.testing.assert_close(newton_schulz(g * 1234.5), base, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(newton_schulz(g * 1e-3), base, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(newton_schulz(g.T.contiguous()), base.T, atol=1e-5, rtol=1e-4)
    z = newton_schulz(torch.zeros(64, 40))
    assert torch.equal(z, torch.zeros(64, 40))
    tiny = newton_schulz(torch.full((8, 8), 1e-30))
    assert torch.isfinite(tiny).all()
    stacked = torch.randn(4, 24, 56, generator=gen)
    batched = newton_schulz(stacked)
    for e in range(4):
        torch.testing.assert_close(batched[e], newton_schulz(stacked[e]), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", [(128, 128), (256, 64), (64, 256), (4, 64, 32)], ids=str)
def test_update_rms_is_configured_value(shape: tuple[int, ...]) -> None:
    p = torch.nn.Parameter(torch.zeros(*shape))
    p.grad = torch.randn(*shape, generator=torch.Generator().manual_seed(5))
    opt = Muon([p], lr=1.0, momentum=0.0, weight_decay=0.0, update_rms=0.18)
    opt.step()
    per_matrix = p.detach().reshape(-1, shape[-2], shape[-1])
    rms = per_matrix.pow(2).mean(dim=(-2, -1)).sqrt()
    assert torch.all((rms - 0.18).abs() <= 1e-3), rms


def test_weight_decay_is_decoupled_and_momentum_is_nesterov() -> None:
    """Two steps against a hand-written float64 reference of the documented update rule."""
    gen = torch.Generator().manual_seed(11)
    w0 = torch.randn(32, 48, generator=gen, dtype=torch.float64)
    grads = [torch.randn(32, 48, generator=gen, dtype=torch.float64) for _ in range(2)]
    lr, wd, mom, rms = 0.05, 0.1, 0.95, 0.18
    p = torch.nn.Parameter(w0.clone())
    opt = Muon([p], lr=lr, momentum=mom, weight_decay=wd, update_rms=rms, ns_dtype=torch.float64)
    ref = w0.clone()
    buf = torch.zeros_like(w0)
    for g in grads:
        p.grad = g.clone()
        opt.step()
        buf = mom * buf + (1 - mom) * g
        u = (1 - mom) * g + mom * buf
        uu, _, vh = torch.linalg.svd(u, full_matrices=False)
        ref = ref * (1 - lr * wd) - lr * rms * math.sqrt(48) * (uu @ vh)
    torch.testing.assert_close(p.detach(), ref, atol=2e-4, rtol=0)


def test_parity_with_torch_optim_muon() -> None:
    """Configured as torch's 5 quintic steps in bf16 with its match_rms_adamw scaling (0.2 sqrt(max(A, B)))."""
    gen = torch.Generator().manual_seed(2)
    shapes = [(64, 32), (32, 96), (48, 48)]
    ours = [torch.nn.Parameter(torch.randn(*s, generator=gen)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt_a = Muon(ours, lr=0.02, momentum=0.95, weight_decay=0.1, update_rms=0.2,
                 stages=[(5, (3.4445, -4.7750, 2.0315))], ns_dtype=torch.bfloat16)
    opt_b = torch.optim.Muon(theirs, lr=0.02, momentum=0.95, weight_decay=0.1, nesterov=True,
                             adjust_lr_fn="match_rms_adamw")
    for _ in range(3):
        for a, b in zip(ours, theirs, strict=True):
            g = torch.randn(a.shape, generator=gen)
            a.grad, b.grad = g.clone(), g.clone()
        before = [b.detach().clone() for b in theirs]
        opt_a.step()
        opt_b.step()  # type: ignore[no-untyped-call]
        for a, b, b0 in zip(ours, theirs, before, strict=True):
            step_size = (b.detach() - b0).abs().max()
            # bf16 GEMMs: agreement to a few percent of one update.
            assert float((a.detach() - b.detach()).abs().max()) < 0.05 * float(step_size)


def test_rejects_vectors() -> None:
    with pytest.raises(ValueError, match="2-D or 3-D"):
        Muon([torch.nn.Parameter(torch.zeros(5))])


@pytest.mark.parametrize("shape", [(96, 96), (64, 160)], ids=str)
def test_bf16_quintic_with_fp32_cleanup_is_orthogonal(shape: tuple[int, int]) -> None:
    """The mixed schedule (bf16 leading stage, fp32 cleanup) still puts every singular value on 1."""
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    o = newton_schulz(g.float(), dtype=torch.bfloat16, final_dtype=torch.float32)
    assert o.dtype == torch.float32
    sv = torch.linalg.svdvals(o.double())
    assert sv.min() >= 0.999 and sv.max() <= 1.001
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    assert float(torch.linalg.matrix_norm(o.double() - u @ vh, ord=2)) < 0.1  # bf16-level subspace error


def test_mixed_shapes_in_one_step_match_per_matrix_svd_reference() -> None:
    """Tall, wide and stacked parameters share buckets (tall ones transposed); each matches U V^T of its own update."""
    gen = torch.Generator().manual_seed(21)
    shapes = [(48, 32), (32, 48), (2, 48, 32), (3, 32, 48), (40, 40)]
    params = [torch.nn.Parameter(torch.randn(*s, generator=gen, dtype=torch.float64)) for s in shapes]
    start = [p.detach().clone() for p in params]
    opt = Muon(params, lr=0.1, momentum=0.0, weight_decay=0.0, update_rms=0.2, ns_dtype=torch.float64)
    grads = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    opt.step()
    for p, p0, g in zip(params, start, grads, strict=True):
        u, _, vh = torch.linalg.svd(g, full_matrices=False)
        expected = p0 - 0.1 * 0.2 * math.sqrt(max(g.shape[-2:])) * (u @ vh)
        torch.testing.assert_close(p.detach(), expected, atol=2e-4, rtol=0)
