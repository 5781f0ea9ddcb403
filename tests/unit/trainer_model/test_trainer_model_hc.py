"""mHC: Sinkhorn mixing matrices are doubly stochastic; hc_mult = 1 is exactly a plain residual (the
released formulation itself is checked against transformers in test_trainer_model_hf_v4)."""

from __future__ import annotations

import torch
from trex.trainer.model import ModelArgs
from trex.trainer.model.context import AttnContext
from trex.trainer.model.hc import HyperConnection, sinkhorn
from trex.trainer.model.layers import rope_cos_sin
from trex.trainer.model.model import Block


def test_sinkhorn_is_doubly_stochastic() -> None:
    torch.manual_seed(0)
    m = sinkhorn(torch.randn(256, 4, 4), iters=20)
    ones = torch.ones(256, 4)
    assert (m >= 0).all()
    assert torch.allclose(m.sum(-1), ones, atol=1e-3)
    assert torch.allclose(m.sum(-2), ones, atol=1e-3)


def test_hyper_connection_mappings_doubly_stochastic_and_bounded() -> None:
    torch.manual_seed(1)
    hc = HyperConnection(4, 16, sinkhorn_iters=20)
    with torch.no_grad():
        hc.base.copy_(hc.static_base())
        hc.fn.normal_(0, 0.05)
        hc.scale.fill_(1.0)
        hc.base.add_(torch.randn(24))
    pre, post, res = hc.mappings(torch.randn(2, 5, 4, 16))
    assert torch.allclose(res.sum(-1), torch.ones(2, 5, 4), atol=1e-3)
    assert torch.allclose(res.sum(-2), torch.ones(2, 5, 4), atol=1e-3)
    assert ((pre > 0) & (pre < 1)).all() and ((post > 0) & (post < 2)).all()


def _ctx(b: int, t: int, args: ModelArgs) -> AttnContext:
    pos = torch.arange(t).expand(b, t)
    cos, sin = rope_cos_sin(pos, args.qk_rope_head_dim, args.rope_theta)
    return AttnContext(position_ids=pos, doc_ids=None, cos=cos, sin=sin)


def test_hc_mult_one_is_plain_residual() -> None:
    torch.manual_seed(2)
    args = ModelArgs(hc_mult=1)
    block = Block(args, moe=True)
    for p in block.parameters():
        torch.nn.init.normal_(p, 0, 0.1)
    assert not any("hc" in n for n, _ in block.named_parameters())
    x = torch.randn(2, 8, args.hidden_size)
    ids = torch.randint(0, args.vocab_size, (2, 8))
    ctx = _ctx(2, 8, args)
    y = block(x, ctx, ids)[0]
    h = x + block.self_attn(block.input_layernorm(x), ctx)[0]
    ref = h + block.mlp(block.post_attention_layernorm(h), ids)[0]
    assert torch.equal(y, ref)


def test_hc_streams_with_identity_mixing_reduce_to_residual_per_stream() -> None:
    """With fn = 0, H_res = I (large diagonal bias), H_pre = e_0, H_post = 2 each stream is x_i + 2 F(x_0)."""
    torch.manual_seed(3)
    args = ModelArgs(hc_mult=3)
    block = Block(args, moe=False)
    for p in block.parameters():
        torch.nn.init.normal_(p, 0, 0.1)
    with torch.no_grad():
        for hc in (block.hc_attn, block.hc_ffn):
            hc.fn.zero_()
            hc.base.copy_(torch.cat([torch.tensor([60.0, -60.0, -60.0]), torch.full((3,), 60.0),  # 2 sigmoid(60) = 2
                                     (torch.eye(3) * 60.0).flatten()]))
    x = torch.randn(1, 6, 3, args.hidden_size)
    ctx = _ctx(1, 6, args)
    y = block(x, ctx, torch.zeros(1, 6, dtype=torch.long))[0]
    a = x + 2 * block.self_attn(block.input_layernorm(x[:, :, 0]), ctx)[0][:, :, None]
    ref = a + 2 * block.mlp(block.post_attention_layernorm(a[:, :, 0]))[:, :, None]
    assert torch.allclose(y, ref, atol=1e-5)
