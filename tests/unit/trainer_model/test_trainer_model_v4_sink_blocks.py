"""DeepSeek-V4's sink attention in blocks of query rows (trex.trainer.model.v4attention.sink_attention), float64:
autograd keeps its inputs only and the backward recomputes one block's probabilities at a time (bytes at 4 blocks
against 1 block grow with the inputs, not with the probabilities), and outputs and gradients equal the unblocked
eager computation (written here, keeping every probability) to 1e-12: the function alone, under a non-reentrant
checkpoint (the trainer's recompute wraps blocks in one), without grad (decoding), and a whole V4 model (csa, hca
and a sliding MTP block, mHC, packed documents) at a sequence of four blocks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.checkpoint import checkpoint
from trex.trainer.config import RoutingConfig
from trex.trainer.model import ModelArgs, build_model_from_args, compute_loss, v4attention
from trex.trainer.model.v4attention import sink_attention

B, H, D, KEYS, BLOCK = 2, 3, 8, 64, 16
SCALE = D**-0.5


def reference(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, sinks: torch.Tensor,
              scale: float, block: int | None = None) -> torch.Tensor:
    """softmax over [q k^T * scale, sink_h] (keys hidden by mask at -inf), sink column dropped, times kv: in one
    piece, autograd keeping the probabilities."""
    logits = (torch.einsum("bthd,bsd->bhts", q, kv) * scale).masked_fill(~mask, float("-inf"))
    b, h, t, _ = logits.shape
    full = torch.cat([logits, sinks.view(1, h, 1, 1).expand(b, h, t, 1)], dim=-1)
    probs = torch.softmax(full, dim=-1)[..., :-1]
    return torch.einsum("bhts,bsd->bthd", probs, kv)


def _inputs(t: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(t)
    q = torch.randn(B, t, H, D, generator=gen, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(B, KEYS, D, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(B, 1, t, KEYS, generator=gen) < 0.6
    mask[..., 0] = True  # every row sees a key
    sinks = torch.randn(H, generator=gen, dtype=torch.float64, requires_grad=True)
    return q, kv, mask, sinks


class Saved:
    """saved_tensors_hooks counting distinct storages: every one packed (``total``) and the most held at once
    (``peak``, until autograd drops its handle)."""

    def __init__(self) -> None:
        self.refs: dict[int, list[int]] = {}
        self.total, self.now, self.peak = 0, 0, 0

    def pack(self, t: torch.Tensor) -> Any:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        ref = self.refs.setdefault(ptr, [st.nbytes(), 0])
        if ref[1] == 0:
            self.total += ref[0]
            self.now += ref[0]
            self.peak = max(self.peak, self.now)
        ref[1] += 1
        return _Handle(self, ptr, t.detach())

    def unpack(self, handle: Any) -> torch.Tensor:
        out: torch.Tensor = handle.t
        return out

    def drop(self, ptr: int) -> None:
        ref = self.refs[ptr]
        ref[1] -= 1
        if ref[1] == 0:
            self.now -= ref[0]
            del self.refs[ptr]


class _Handle:
    def __init__(self, owner: Saved, ptr: int, t: torch.Tensor) -> None:
        self.owner, self.ptr, self.t = owner, ptr, t

    def __del__(self) -> None:
        self.owner.drop(self.ptr)


def _grads(fn: Callable[..., torch.Tensor], t: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    q, kv, mask, sinks = _inputs(t)
    out = fn(q, kv, mask, sinks, SCALE, BLOCK)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=out.dtype)
    return out.detach(), list(torch.autograd.grad((out * probe).sum(), [q, kv, sinks]))


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert (a - b).abs().max().item() <= 1e-12, (a - b).abs().max().item()


@pytest.mark.parametrize("t", [BLOCK - 3, BLOCK, 4 * BLOCK, 4 * BLOCK + 5])
def test_blocks_equal_the_unblocked_computation(t: int) -> None:
    out, grads = _grads(sink_attention, t)
    ref_out, ref_grads = _grads(reference, t)
    _close(out, ref_out)
    for g, r in zip(grads, ref_grads, strict=True):
        _close(g, r)
    ck_out, ck_grads = _grads(lambda *a: checkpoint(sink_attention, *a, use_reentrant=False), t)
    _close(ck_out, ref_out)
    for g, r in zip(ck_grads, ref_grads, strict=True):
        _close(g, r)
    q, kv, mask, sinks = _inputs(t)
    with torch.no_grad():
        _close(sink_attention(q, kv, mask, sinks, SCALE, BLOCK), ref_out)


def _bytes(fn: Callable[..., torch.Tensor], t: int) -> tuple[int, int]:
    """(bytes autograd saves in the forward, beyond the parameters-like sinks; the most the backward holds at once
    of what it saves again)."""
    q, kv, mask, sinks = _inputs(t)
    fwd = Saved()
    with torch.autograd.graph.saved_tensors_hooks(fwd.pack, fwd.unpack):
        out = fn(q, kv, mask, sinks, SCALE, BLOCK)
    bwd = Saved()
    with torch.autograd.graph.saved_tensors_hooks(bwd.pack, bwd.unpack):
        out.sum().backward()
    return fwd.total - sinks.untyped_storage().nbytes(), bwd.peak


def test_autograd_keeps_the_inputs_and_one_block_of_probabilities() -> None:
    one, four = _bytes(sink_attention, BLOCK), _bytes(sink_attention, 4 * BLOCK)
    q_rows, mask_rows, kv = BLOCK * H * D * 8, BLOCK * KEYS, KEYS * D * 8
    assert one[0] == B * (q_rows + mask_rows + kv), one  # q, mask and kv themselves
    assert four[0] - one[0] == 3 * B * (q_rows + mask_rows), (four, one)  # linear in the rows
    probs = B * H * BLOCK * KEYS * 8  # one block's probabilities
    assert probs <= one[1] < 3 * probs and four[1] <= one[1] + B * (3 * q_rows + 3 * mask_rows), (one, four)
    unblocked = _bytes(reference, 4 * BLOCK)
    assert unblocked[0] >= four[0] + 2 * 4 * probs, (unblocked, four)  # what the blocks do not keep


def _model_grads(attention: Callable[..., torch.Tensor], monkeypatch: pytest.MonkeyPatch,
                 t: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    monkeypatch.setattr(v4attention, "sink_attention", attention)
    monkeypatch.setattr(v4attention, "SINK_BLOCK", BLOCK)
    args = ModelArgs(attention="csa", q_lora_rank=16, v_head_dim=24, csa_compress_every=4, csa_top_k=3,
                     csa_window=6, hca_compress_every=8, hc_mult=2, layer_types=["csa", "hca"], mtp_depth=1)
    model = build_model_from_args(args, dtype=torch.float64, seed=0)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab_size, (2, t), generator=gen)
    docs = (torch.arange(t) // 23).expand(2, t)
    out = model(ids, None, docs, logits=False)
    loss, _ = compute_loss(out, ids, torch.ones_like(ids, dtype=torch.bool), RoutingConfig(), 0)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def test_v4_model_over_four_blocks_equals_the_unblocked_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    loss, grads = _model_grads(sink_attention, monkeypatch, 4 * BLOCK)
    ref_loss, ref_grads = _model_grads(reference, monkeypatch, 4 * BLOCK)
    _close(loss, ref_loss)
    assert grads.keys() == ref_grads.keys() and any("sinks" in n for n in grads)
    for name, g in grads.items():
        assert (g - ref_grads[name]).abs().max().item() <= 1e-12, name
