"""Model fast paths vs their reference paths: fused RMSNorm, the per-forward shared mask, grouped GEMM under tracing."""

from __future__ import annotations

import pytest
import torch
from trex.trainer.model import ModelArgs, build_model_from_args
from trex.trainer.model.attention import MLAttention
from trex.trainer.model.context import AttnContext
from trex.trainer.model.layers import RMSNorm, causal_doc_mask, positions_from_docs, rope_cos_sin
from trex.trainer.model.moe import grouped_linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rmsnorm_matches_float64_formula(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=gen, dtype=torch.float64) * 3
    norm = RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64, generator=gen, dtype=torch.float64))
    norm.to(dtype)
    ref = norm.weight.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    out = norm(x.to(dtype))
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


def test_rmsnorm_gradient_matches_float64_autograd() -> None:
    gen = torch.Generator().manual_seed(1)
    x64 = torch.randn(4, 32, generator=gen, dtype=torch.float64, requires_grad=True)
    w64 = torch.randn(32, generator=gen, dtype=torch.float64, requires_grad=True)
    torch.autograd.backward([(w64 * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)).pow(2).sum()])
    norm = RMSNorm(32)
    with torch.no_grad():
        norm.weight.copy_(w64.detach().float())
    x = x64.detach().float().requires_grad_()
    torch.autograd.backward([norm(x).pow(2).sum()])
    assert x.grad is not None and norm.weight.grad is not None and x64.grad is not None and w64.grad is not None
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(norm.weight.grad.double(), w64.grad, atol=1e-4, rtol=1e-4)


def test_shared_mask_equals_per_layer_mask() -> None:
    """An mla layer given the forward's shared mask returns what it returns when it builds the mask itself."""
    args = ModelArgs(attention="mla", q_lora_rank=16)
    attn = MLAttention(args)
    gen = torch.Generator().manual_seed(2)
    for p in attn.parameters():
        with torch.no_grad():
            p.normal_(0, 0.1, generator=gen)
    x = torch.randn(2, 20, args.hidden_size, generator=gen)
    doc = torch.tensor([[0] * 7 + [1] * 13, [0] * 20])
    pos = positions_from_docs(doc)
    cos, sin = rope_cos_sin(pos, args.qk_rope_head_dim, args.rope_theta)
    own, _ = attn(x, AttnContext(position_ids=pos, doc_ids=doc, cos=cos, sin=sin))
    shared, _ = attn(x, AttnContext(position_ids=pos, doc_ids=doc, cos=cos, sin=sin,
                                    mask=causal_doc_mask(doc, 2, 20, x.device)))
    assert torch.equal(own, shared)


def test_model_forward_documents_stay_isolated_with_shared_mask() -> None:
    """Packed rows through the whole model equal the documents run alone (the shared mask is the right one)."""
    model = build_model_from_args(ModelArgs(attention="mla", mtp_depth=0), seed=0).eval()
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, 512, (1, 9), generator=gen), torch.randint(0, 512, (1, 11), generator=gen)
    doc = torch.tensor([[0] * 9 + [1] * 11])
    with torch.no_grad():
        packed = model(torch.cat([a, b], 1), doc_ids=doc).logits
        alone = torch.cat([model(a).logits, model(b).logits], 1)
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


def test_grouped_linear_while_tracing_matches_per_row_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch.compile tracing grouped_linear takes the per-expert path; it must equal x_i @ w[e_i].T."""
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(4, 16, 8, generator=gen, dtype=torch.float64)
    counts = torch.tensor([3, 0, 5, 2])
    x = torch.randn(int(counts.sum()), 8, generator=gen, dtype=torch.float64)
    expert = torch.repeat_interleave(torch.arange(4), counts)
    ref = torch.einsum("nd,nod->no", x, w[expert])
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    torch.testing.assert_close(grouped_linear(x.float(), w.float(), counts).double(), ref, atol=1e-5, rtol=1e-5)
