"""Muon fast paths: cache-sized Newton-Schulz slices and multi-tensor momentum vs the reference paths."""

from __future__ import annotations

import math

import pytest
import torch
from trex.trainer.optim.muon import Muon, cpu_chunk, newton_schulz


@pytest.mark.parametrize("shape", [(11, 48, 96), (7, 96, 48), (5, 40, 40)], ids=str)
def test_sliced_newton_schulz_equals_one_batch_and_svd(shape: tuple[int, int, int]) -> None:
    """Slices of the batch give the same result as one batched call, and both match U V^T (float64 SVD)."""
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    whole = newton_schulz(g, chunk=shape[0])
    for chunk in (1, 3, shape[0] - 1):
        torch.testing.assert_close(newton_schulz(g, chunk=chunk), whole, atol=1e-6, rtol=0)
    torch.testing.assert_close(newton_schulz(g), whole, atol=1e-6, rtol=0)
    u, _, vh = torch.linalg.svd(g.double(), full_matrices=False)
    assert float(torch.linalg.matrix_norm(whole.double() - u @ vh, ord=2).max()) < 2e-3


def test_sliced_mixed_precision_equals_one_batch() -> None:
    g = torch.randn(9, 32, 64, generator=torch.Generator().manual_seed(5))
    whole = newton_schulz(g, dtype=torch.bfloat16, final_dtype=torch.float32, chunk=9)
    sliced = newton_schulz(g, dtype=torch.bfloat16, final_dtype=torch.float32, chunk=2)
    torch.testing.assert_close(sliced, whole, atol=1e-6, rtol=0)


def test_cpu_chunk_bounds() -> None:
    assert cpu_chunk(205, 128, 256, 4, 1, budget=1 << 19) == 4  # 128 KiB per matrix, 512 KiB per slice
    assert cpu_chunk(205, 128, 256, 4, 8, budget=1 << 19) == 32  # at least the budget for every thread
    assert cpu_chunk(3, 1024, 1024, 4, 1, budget=1 << 19) == 1  # one matrix larger than the budget
    assert cpu_chunk(2, 8, 8, 4, 1, budget=1 << 19) == 2  # never more than the batch


def test_chunk_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk"):
        newton_schulz(torch.randn(2, 8, 8), chunk=0)


@pytest.mark.parametrize("nesterov", [True, False])
def test_multi_tensor_step_matches_float64_reference(nesterov: bool) -> None:
    """Three steps on several parameters (one without a gradient) against the documented rule in float64."""
    gen = torch.Generator().manual_seed(13)
    shapes = [(24, 40), (40, 24), (2, 24, 40)]
    lr, wd, mom, rms = 0.03, 0.2, 0.9, 0.18
    params = [torch.nn.Parameter(torch.randn(*s, generator=gen, dtype=torch.float64)) for s in shapes]
    idle = torch.nn.Parameter(torch.randn(8, 8, generator=gen, dtype=torch.float64))
    ref = [p.detach().clone() for p in params]
    idle0 = idle.detach().clone()
    bufs = [torch.zeros_like(r) for r in ref]
    opt = Muon([*params, idle], lr=lr, momentum=mom, nesterov=nesterov, weight_decay=wd, update_rms=rms,
               ns_dtype=torch.float64)
    for _ in range(3):
        grads = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes]
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt.step()
        for i, g in enumerate(grads):
            bufs[i] = mom * bufs[i] + (1 - mom) * g
            u = (1 - mom) * g + mom * bufs[i] if nesterov else bufs[i]
            uu, _, vh = torch.linalg.svd(u, full_matrices=False)
            ref[i] = ref[i] * (1 - lr * wd) - lr * rms * math.sqrt(40) * (uu @ vh)
    for p, r in zip(params, ref, strict=True):
        torch.testing.assert_close(p.detach(), r, atol=2e-4, rtol=0)
    assert torch.equal(idle.detach(), idle0)  # no gradient: untouched, no weight decay
