"""Routed experts: SwiGLU clamp values/gradients vs a float64 hand reference; grouped GEMM vs a per-token loop."""

from __future__ import annotations

import pytest
import torch
from trex.trainer.model import ModelArgs
from trex.trainer.model.moe import GroupedExperts, _grouped_mm_ok, swiglu


def _ref_swiglu_and_grads(g: torch.Tensor, u: torch.Tensor, limit: float) -> tuple[torch.Tensor, ...]:
    """float64 closed form: y = silu(min(g, L)) * clip(u, -L, L) and its partial derivatives."""
    g, u = g.double(), u.double()
    gc = torch.minimum(g, torch.full_like(g, limit)) if limit > 0 else g
    uc = u.clamp(-limit, limit) if limit > 0 else u
    sig = 1.0 / (1.0 + torch.exp(-gc))
    y = gc * sig * uc
    dsilu = sig * (1 + gc * (1 - sig))
    dg = torch.where(g > limit, torch.zeros_like(g), dsilu * uc) if limit > 0 else dsilu * uc
    du = torch.where(u.abs() > limit, torch.zeros_like(u), gc * sig) if limit > 0 else gc * sig
    return y, dg, du


@pytest.mark.parametrize("limit", [10.0, 2.0, 0.0])
def test_swiglu_clamp_values_and_gradients(limit: float) -> None:
    torch.manual_seed(0)
    g = (torch.randn(64) * 8).requires_grad_()
    u = (torch.randn(64) * 8).requires_grad_()
    y = swiglu(g, u, limit)
    torch.autograd.backward([y.sum()])
    ry, rdg, rdu = _ref_swiglu_and_grads(g.detach(), u.detach(), limit)
    assert torch.allclose(y.double(), ry, rtol=1e-5, atol=1e-5)
    assert g.grad is not None and u.grad is not None
    assert torch.allclose(g.grad.double(), rdg, rtol=1e-5, atol=1e-5)
    assert torch.allclose(u.grad.double(), rdu, rtol=1e-5, atol=1e-5)
    if limit:
        assert float(y.detach().abs().max()) <= limit * limit + 1e-4


def _loop_reference(ex: GroupedExperts, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Token-by-token float64 reference of sum_k w_k * expert_k(x)."""
    x = x.double()
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[n, j])
            g = ex.gate_proj[e].double() @ x[n]
            u = ex.up_proj[e].double() @ x[n]
            if ex.limit > 0:
                g, u = g.clamp(max=ex.limit), u.clamp(-ex.limit, ex.limit)
            h = torch.nn.functional.silu(g) * u
            out[n] += w[n, j].double() * (ex.down_proj[e].double() @ h)
    return out


def _experts(d: int, i: int, n: int, std: float) -> GroupedExperts:
    """Top-2 GroupedExperts with N(0, std) weights (from the global seed)."""
    ex = GroupedExperts(ModelArgs(hidden_size=d, moe_intermediate_size=i, n_routed_experts=n, experts_per_token=2))
    with torch.no_grad():
        for p in ex.parameters():
            p.normal_(0, std)
    return ex


@pytest.mark.parametrize("dims", [(16, 8), (12, 6)])  # (16, 8): grouped GEMM on CPU; (12, 6): loop path
def test_grouped_experts_match_loop_reference(dims: tuple[int, int]) -> None:
    d, i = dims
    torch.manual_seed(1)
    ex = GroupedExperts(ModelArgs(hidden_size=d, moe_intermediate_size=i, n_routed_experts=6,
                                  experts_per_token=2, swiglu_limit=1.0))
    with torch.no_grad():
        for p in ex.parameters():
            p.normal_(0, 0.5)
    assert _grouped_mm_ok(torch.zeros(1, d), ex.gate_proj) == (d == 16 and hasattr(torch, "_grouped_mm"))
    x = torch.randn(10, d)
    idx = torch.stack([torch.randperm(5)[:2] for _ in range(10)])  # expert 5 receives nothing
    w = torch.rand(10, 2)
    y = ex(x, idx, w)
    assert torch.allclose(y.double(), _loop_reference(ex, x, idx, w), atol=1e-5)


def test_grouped_and_loop_paths_have_equal_gradients() -> None:
    torch.manual_seed(2)
    ex = _experts(16, 8, 4, std=0.3)
    x = torch.randn(12, 16)
    idx = torch.stack([torch.randperm(4)[:2] for _ in range(12)])
    w = torch.rand(12, 2)
    ex(x, idx, w).sum().backward()  # sum(): an expanded (stride-0) upstream gradient
    grads = [p.grad.clone() for p in ex.parameters() if p.grad is not None]
    ex.zero_grad()
    ref: torch.Tensor = _loop_reference(ex, x, idx, w)
    torch.autograd.backward([ref.sum()])
    for g, p in zip(grads, ex.parameters(), strict=True):
        assert p.grad is not None
        assert torch.allclose(g.double(), p.grad.double(), atol=1e-5)


def test_grouped_experts_under_autocast_run_in_bf16() -> None:
    """Autocast does not cover the grouped GEMM; the experts cast like F.linear does: a bf16 output close to
    the float64 reference, and fp32 gradients for the fp32 parameters."""
    torch.manual_seed(4)
    ex = _experts(32, 16, 4, std=0.3)
    x = torch.randn(24, 32)
    idx = torch.stack([torch.randperm(4)[:2] for _ in range(24)])
    w = torch.rand(24, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ex(x, idx, w)
    assert y.dtype == torch.bfloat16
    ref = _loop_reference(ex, x, idx, w)
    assert (y.double() - ref).norm() < 2e-2 * ref.norm()
    y.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in ex.parameters())


def test_bucketed_rows_keep_every_row_in_its_expert_block() -> None:
    """Padding groups to a multiple: counts become multiples, real rows keep their order inside their
    expert's padded block, and padding rows read the extra zero row (index n_tokens)."""
    from trex.trainer.model.moe import bucketed_rows

    gen = torch.Generator().manual_seed(5)
    counts = torch.tensor([0, 5, 32, 1, 0, 33, 7])
    tok = torch.randint(0, 50, (int(counts.sum()),), generator=gen)
    padded, src, keep = bucketed_rows(counts, tok, 50, 8)
    assert padded.tolist() == [0, 8, 32, 8, 0, 40, 8]
    assert torch.equal(src[keep], tok) and int((src == 50).sum()) == int(padded.sum() - counts.sum())
    starts, pstarts = counts.cumsum(0) - counts, padded.cumsum(0) - padded
    for e, n in enumerate(counts.tolist()):
        rows = keep[int(starts[e]):int(starts[e]) + n]
        assert rows.tolist() == list(range(int(pstarts[e]), int(pstarts[e]) + n))


def test_bf16_experts_padded_on_cpu_match_unpadded() -> None:
    """The padded bf16 path (CPU) equals the unpadded one, outputs and gradients."""
    from trex.trainer.model import moe

    torch.manual_seed(6)
    ex = _experts(32, 16, 5, std=0.3).to(torch.bfloat16)
    x = torch.randn(40, 32, dtype=torch.bfloat16)
    idx = torch.stack([torch.randperm(5)[:2] for _ in range(40)])
    w = torch.rand(40, 2)
    outs = []
    for rows in (moe.CPU_GROUP_ROWS, 1):
        old, moe.CPU_GROUP_ROWS = moe.CPU_GROUP_ROWS, rows
        try:
            ex.zero_grad(set_to_none=True)
            y = ex(x, idx, w)
            y.float().square().sum().backward()
            outs.append((y.detach(), [p.grad.clone() for p in ex.parameters() if p.grad is not None]))
        finally:
            moe.CPU_GROUP_ROWS = old
    (ya, ga), (yb, gb) = outs
    assert torch.equal(ya, yb)
    assert len(ga) == len(gb) == 3 and all(torch.allclose(a.float(), b.float(), atol=1e-2) for a, b in zip(ga, gb, strict=True))
