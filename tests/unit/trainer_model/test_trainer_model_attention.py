"""Attention: packed documents equal separate runs, causality, and the csa compressed-block visibility rule."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from trex.trainer.model import DeepSeekModel, ModelArgs, build_model_from_args
from trex.trainer.model.attention import AttnContext, CSAttention
from trex.trainer.model.layers import apply_rope, rope_cos_sin

CASES = {
    "mla": dict(attention="mla", q_lora_rank=16),
    "csa": dict(attention="csa", csa_compress_every=4, csa_top_k=2, csa_window=5),
    "csa-mhc-hash": dict(attention="csa", csa_compress_every=3, csa_top_k=2, csa_window=4, hc_mult=4,
                         n_hash_layers=1, scoring="sqrt-softplus"),
}


def _model(kind: str, **extra: Any) -> DeepSeekModel:
    args = ModelArgs(**{**CASES[kind], **extra})
    model = build_model_from_args(args, seed=0)
    model.eval()
    return model


@pytest.mark.parametrize("kind", list(CASES))
def test_packed_documents_equal_separate_runs(kind: str) -> None:
    model = _model(kind)
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, 512, (1, 13), generator=gen)
    b = torch.randint(0, 512, (1, 19), generator=gen)
    packed = torch.cat([a, b], dim=1)
    docs = torch.cat([torch.zeros(1, 13, dtype=torch.long), torch.ones(1, 19, dtype=torch.long)], dim=1)
    pos = torch.cat([torch.arange(13), torch.arange(19)])[None]
    with torch.no_grad():
        out = model(packed, position_ids=pos, doc_ids=docs)
        out_default_pos = model(packed, doc_ids=docs)
        la, lb = model(a).logits, model(b).logits
    assert torch.allclose(out.logits[:, :13], la, atol=1e-5)
    assert torch.allclose(out.logits[:, 13:], lb, atol=1e-5)
    assert torch.equal(out.logits, out_default_pos.logits)  # positions restart per document by default
    # without doc_ids the second document sees the first one
    with torch.no_grad():
        leaky = model(packed).logits
    assert not torch.allclose(leaky[:, 13:], lb, atol=1e-3)


@pytest.mark.parametrize("kind", list(CASES))
def test_future_tokens_do_not_change_past_logits(kind: str) -> None:
    model = _model(kind)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, 512, (2, 24), generator=gen)
    y = x.clone()
    y[:, 15:] = torch.randint(0, 512, (2, 9), generator=gen)
    with torch.no_grad():
        ox, oy = model(x), model(y)
    assert torch.allclose(ox.logits[:, :15], oy.logits[:, :15], atol=1e-6)
    assert not torch.allclose(ox.logits[:, 15:], oy.logits[:, 15:], atol=1e-3)


def test_csa_compressed_block_visible_only_when_complete_and_past() -> None:
    """Window 1 (self only), one layer: token 0 reaches query i only through the compressed block
    [0, m), which becomes visible at i = m (all its tokens precede the query)."""
    m = 4
    model = _model("csa", csa_window=1, csa_compress_every=m, csa_top_k=8, num_layers=1, mtp_depth=0)
    gen = torch.Generator().manual_seed(2)
    x = torch.randint(0, 512, (1, 12), generator=gen)
    y = x.clone()
    y[0, 0] = (x[0, 0] + 1) % 512
    with torch.no_grad():
        lx, ly = model(x).logits[0], model(y).logits[0]
    changed = [(lx[i] - ly[i]).abs().max().item() > 1e-6 for i in range(12)]
    assert changed[0]
    assert changed[1:m] == [False] * (m - 1)
    assert all(changed[m:])


def test_csa_indexer_loss_is_finite_and_trains_only_the_indexer() -> None:
    model = _model("csa")
    x = torch.randint(0, 512, (2, 20))
    out = model(x)
    assert torch.isfinite(out.indexer_loss) and float(out.indexer_loss.detach()) >= 0
    out.indexer_loss.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads and all("indexer_" in n for n in grads)


def _csa_reference(attn: CSAttention, x: torch.Tensor, pos: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """Token-by-token float64 CSA: explicit blocks, visibility, indexer top-k and softmax (batch of 1)."""
    t_len, m = x.shape[1], attn.every
    cos, sin = rope_cos_sin(pos, attn.rope, attn.rope_theta)
    ctx = AttnContext(position_ids=pos, doc_ids=doc, cos=cos, sin=sin)
    q = attn.q_norm(attn.query(x, ctx))[0]
    c, k_rope = attn.latent(x)
    k_tok, v_tok = attn.expand(c, apply_rope(k_rope, cos, sin))
    p, d = pos[0].tolist(), doc[0].tolist()
    blocks: list[list[int]] = [[0]]
    for t in range(1, t_len):
        if d[t] != d[t - 1] or p[t] // m != p[t - 1] // m:
            blocks.append([])
        blocks[-1].append(t)
    lat, kr, ends = [], [], []
    for blk in blocks:
        logits = torch.stack([attn.compress_gate(c[0, t])[0] + attn.compress_pos_bias[p[t] % m] for t in blk])
        w = torch.softmax(logits, 0)
        lat.append(attn.compress_norm(torch.stack([w[i] * c[0, t] for i, t in enumerate(blk)]).sum(0)))
        pooled = torch.stack([w[i] * k_rope[0, t] for i, t in enumerate(blk)]).sum(0)
        cb, sb = rope_cos_sin(torch.tensor([[p[blk[-1]]]]), attn.rope, attn.rope_theta)
        kr.append(apply_rope(pooled[None, None], cb, sb)[0, 0])
        ends.append(blk[-1])
    k_cmp, v_cmp = attn.expand(torch.stack(lat)[None], torch.stack(kr)[None])
    qi = attn.indexer_q(x[0]).view(t_len, attn.idx_heads, attn.idx_dim)
    wi = attn.indexer_w(x[0])
    ki = attn.indexer_k(torch.stack(lat))
    outs = []
    for t in range(t_len):
        vis = [s for s, e in enumerate(ends) if e < t and d[blocks[s][0]] == d[t]]
        score = {s: float(sum(wi[t, h] * torch.relu(qi[t, h] @ ki[s]) for h in range(attn.idx_heads)))
                 / attn.idx_dim**0.5 for s in vis}
        chosen = sorted(vis, key=lambda s: (-score[s], -s))[: attn.top_k]
        toks = [j for j in range(t + 1) if d[j] == d[t] and t - j < attn.window]
        keys = torch.cat([k_tok[0, toks], k_cmp[0, chosen]])  # [K, H, qk]
        vals = torch.cat([v_tok[0, toks], v_cmp[0, chosen]])
        att = torch.softmax(torch.einsum("hd,khd->hk", q[t], keys) * attn.scale, -1)
        outs.append(torch.einsum("hk,khd->hd", att, vals).reshape(-1))
    out: torch.Tensor = attn.o_proj(torch.stack(outs))[None]
    return out


def test_csa_matches_token_by_token_reference() -> None:
    args = ModelArgs(attention="csa", csa_compress_every=3, csa_top_k=2, csa_window=4, q_lora_rank=16)
    torch.manual_seed(4)
    attn = CSAttention(args).double()
    for prm in attn.parameters():
        torch.nn.init.normal_(prm, 0, 0.3)
    x = torch.randn(1, 22, args.hidden_size, dtype=torch.float64)
    doc = torch.tensor([[0] * 10 + [1] * 12])
    pos = torch.cat([torch.arange(10), torch.arange(12)])[None]
    cos, sin = rope_cos_sin(pos, args.qk_rope_head_dim, args.rope_theta)
    with torch.no_grad():
        out, _ = attn(x, AttnContext(position_ids=pos, doc_ids=doc, cos=cos, sin=sin))
        ref = _csa_reference(attn, x, pos, doc)
    assert torch.allclose(out, ref, atol=1e-9)
