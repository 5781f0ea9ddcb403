"""Attention: packed documents equal separate runs, causality, the V4 compressed-entry visibility rule and
the indexer's loss (forward parity with transformers lives in test_trainer_model_hf_v4)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from trex.trainer.model import DeepSeekModel, ModelArgs, build_model_from_args
from trex.trainer.model.v4attention import windows

CASES = {
    "mla": dict(attention="mla", q_lora_rank=16),
    "csa": dict(attention="csa", q_lora_rank=16, v_head_dim=24, csa_compress_every=4, csa_top_k=2, csa_window=5,
                hca_compress_every=6, layer_types=["csa", "hca"]),
    "csa-mhc-hash": dict(attention="csa", q_lora_rank=16, v_head_dim=24, csa_compress_every=3, csa_top_k=2,
                         csa_window=4, hca_compress_every=5, hc_mult=4, n_hash_layers=1, scoring="sqrt-softplus",
                         layer_types=["sliding", "csa", "hca"], num_layers=3),
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


def test_compressed_entry_visible_from_its_windows_last_token() -> None:
    m = 4
    pos = torch.cat([torch.arange(10), torch.arange(7)])[None]
    doc = torch.cat([torch.zeros(10, dtype=torch.long), torch.ones(7, dtype=torch.long)])[None]
    win = windows(pos, doc, m)
    assert win.count == 3 + 2  # windows restart at the second document
    assert win.start.tolist() == [[0, 4, 8, 0, 4]]
    vis = win.visible(pos, doc, m)[0]
    for t in range(17):
        p, d = int(pos[0, t]), int(doc[0, t])
        expected = [int(win.doc[0, s]) == d and p >= int(win.start[0, s]) + m - 1 for s in range(win.count)]
        assert vis[t].tolist() == expected, t
    assert vis[3].tolist() == [True, False, False, False, False]  # position 3 closes window 0
    assert not vis[:, 2].any() and not vis[:, 4].any()  # partial windows are never visible


def test_csa_indexer_loss_is_finite_and_trains_only_the_indexer() -> None:
    model = _model("csa")
    x = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(3))
    out = model(x)
    assert torch.isfinite(out.indexer_loss) and float(out.indexer_loss.detach()) > 0
    out.indexer_loss.backward()
    grads = [n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    assert grads and all(".compressor.indexer." in n for n in grads)
