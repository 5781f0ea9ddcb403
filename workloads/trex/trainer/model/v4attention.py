"""DeepSeek-V4 attention: shared-KV multi-query attention over a sliding window, plus compressed KV.

Every layer (HF names in brackets) projects queries through a low-rank latent (q_a_proj, q_a_norm,
q_b_proj), RMS-normalises each query head without a scale, and reads one shared key = value head
(kv_proj, kv_norm). RoPE rotates the trailing qk_rope_head_dim channels of queries and keys and is
undone (conjugate rotation at the query position) on the output, which then goes through a grouped
low-rank projection (o_a_proj per head group, o_b_proj). A learned per-head sink logit (sinks)
joins the softmax. Three kinds:

* sliding: the last `csa_window` tokens only (rope base rope_theta).
* hca: plus one compressed entry per `hca_compress_every` tokens (non-overlapping windows), every
  complete past entry visible (rope base compress_rope_theta).
* csa: plus one compressed entry per `csa_compress_every` tokens, each pooling two windows (the
  previous window's first half-features and the current window's second half), and a lightning
  indexer that keeps the top `csa_top_k` visible entries per query. Exact score ties go to the later
  window (the release leaves them to torch.topk, whose order of equal values is unspecified); ReLU
  makes them common with few index heads (an entry every head scores negative scores 0).

A compressed entry pools its tokens with per-channel softmax(gate + position bias) weights, is
RMS-normalised and rotated at its window's first position; it becomes visible once the query reaches
the window's last token. Packed documents compress as they would alone (windows restart at each
document). The indexer is trained (trex's addition, not in the release) by a KL loss from the
detached main attention over the visible entries to its own distribution, on detached inputs.

The keys come through the model's ``keys`` (trex.trainer.model.context.SequenceKeys): ``extend`` gives the
layer's tokens with the tokens before them its window and its pooling reach, ``place`` the whole sequences'
compressed entries in sequence order from the windows formed here. In one process both are the layer's own
tokens and windows; under context parallelism (trex.trainer.parallel.context) the first is a halo exchange
and the second shares the entries each rank forms of the windows whose last token it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trex.trainer.model.args import ModelArgs
from trex.trainer.model.context import AttnContext, EntrySet
from trex.trainer.model.layers import (
    RMSNorm,
    apply_rope_tail,
    local_tensor,
    rope_cos_sin,
    unit_rms,
    upcast,
)
from trex.trainer.model_args import SINK_BLOCK


def block_ids(position_ids: torch.Tensor, doc_ids: torch.Tensor, every: int,
              index: torch.Tensor | None = None) -> torch.Tensor:
    """Compression window index per token [B, T]: `every` consecutive positions of one document,
    aligned to the document start (so a packed document compresses as it would alone). ``index``: the tokens'
    indices [T] in their sequence when they are not consecutive (a window never spans a gap)."""
    new = torch.ones_like(doc_ids, dtype=torch.bool)
    new[:, 1:] = (doc_ids[:, 1:] != doc_ids[:, :-1]) | (position_ids[:, 1:] // every != position_ids[:, :-1] // every)
    if index is not None:
        new[:, 1:] |= (index[1:] != index[:-1] + 1)[None]
    return new.long().cumsum(dim=1) - 1


@dataclass
class Windows:
    """The compression windows of one batch (S per row, padded)."""

    seg: torch.Tensor  # [B, T] window of each token
    doc: torch.Tensor  # [B, S] document of the window (-1: padding)
    start: torch.Tensor  # [B, S] position of the window's first token
    count: int  # S

    def visible(self, position_ids: torch.Tensor, doc_ids: torch.Tensor, every: int) -> torch.Tensor:
        """[B, T, S]: entry s visible to query t (same document, query at or past the window's end)."""
        same = self.doc[:, None, :] == doc_ids[:, :, None]
        return same & (position_ids[:, :, None] >= self.start[:, None, :] + every - 1)


def windows(position_ids: torch.Tensor, doc_ids: torch.Tensor, every: int,
            index: torch.Tensor | None = None) -> Windows:
    """Compression windows of `every` tokens per document (``index``: see block_ids)."""
    seg = block_ids(position_ids, doc_ids, every, index)
    b = seg.shape[0]
    s = int(seg.max().item()) + 1
    doc = torch.full((b, s), -1, dtype=doc_ids.dtype, device=seg.device).scatter_reduce(1, seg, doc_ids, "amax")
    start = torch.zeros((b, s), dtype=torch.long, device=seg.device).scatter_reduce(
        1, seg, position_ids // every * every, "amax")
    return Windows(seg=seg, doc=doc, start=start, count=s)


class Pool(nn.Module):
    """Gated pooling of a window's tokens into one compressed entry of width `dim` (kv_proj,
    gate_proj, position_bias, kv_norm). ``overlap``: features split in two halves, the first half of
    window w - 1 and the second half of window w pool into entry w (csa)."""

    def __init__(self, args: ModelArgs, every: int, dim: int, overlap: bool) -> None:
        super().__init__()
        width = 2 * dim if overlap else dim
        self.every = every
        self.dim = dim
        self.overlap = overlap
        self.rope_dim = args.qk_rope_head_dim
        self.theta = args.compress_rope_theta
        self.kv_proj = nn.Linear(args.hidden_size, width, bias=False)
        self.gate_proj = nn.Linear(args.hidden_size, width, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(every, width))
        self.kv_norm = RMSNorm(dim, args.norm_eps, scale_in_fp32=True)

    @property
    def reach(self) -> int:
        """How many tokens before a window's last token its entry pools from (csa: the previous window too)."""
        return (2 if self.overlap else 1) * self.every - 1

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The per-token inputs of the pooling, [key/value [B, T, width], gate [B, T, width]] (width: dim, two
        halves of dim each with ``overlap``): what a context-parallel rank gathers."""
        return [self.kv_proj(x), self.gate_proj(x)]

    def pool(self, x: torch.Tensor, ctx: AttnContext, win: Windows, doc: torch.Tensor) -> torch.Tensor:
        """Compressed entries [B, S, dim] of the tokens x, normalised and rotated at their window's first position."""
        kv, gate = self.features(x)
        return self.pool_features(kv, gate, ctx.position_ids, win, doc, ctx.cos.dtype)

    def pool_features(self, kv: torch.Tensor, gate: torch.Tensor, pos: torch.Tensor, win: Windows, doc: torch.Tensor,
                      rope_dtype: torch.dtype) -> torch.Tensor:
        """Compressed entries [B, S, dim] from the features of the tokens at positions pos [B, T] (documents doc)."""
        b = kv.shape[0]
        gate = gate + self.position_bias[pos % self.every]
        s, d = win.count, self.dim
        if self.overlap:
            nxt = win.seg + 1
            ok = nxt < s
            ok &= win.doc.gather(1, nxt.clamp(max=s - 1)) == doc
            target = torch.cat([torch.where(ok, nxt, s), win.seg], dim=1)  # first halves, then second halves
            kv = torch.cat([kv[..., :d], kv[..., d:]], dim=1)
            gate = torch.cat([gate[..., :d], gate[..., d:]], dim=1)
        else:
            target = win.seg
        idx = target[..., None].expand(-1, -1, d)
        g = upcast(gate)
        peak = g.new_full((b, s + 1, d), float("-inf")).scatter_reduce(1, idx, g.detach(), "amax")
        e = torch.exp(g - peak.gather(1, idx))
        den = e.new_zeros((b, s + 1, d)).scatter_add(1, idx, e)
        w = (e / den.gather(1, idx)).to(kv.dtype)
        pooled = kv.new_zeros((b, s + 1, d)).scatter_add(1, idx, kv * w)[:, :s]
        cos, sin = rope_cos_sin(win.start, self.rope_dim, self.theta, dtype=rope_dtype)
        return apply_rope_tail(self.kv_norm(pooled), cos, sin)


class IndexScorer(nn.Module):
    """Lightning-indexer head weights (weights_proj)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.weights_proj = nn.Linear(args.hidden_size, args.csa_indexer_heads, bias=False)


class Indexer(Pool):
    """Lightning indexer: its own compressed keys (width csa_indexer_dim), queries from the query
    latent (q_b_proj), scores sum_h w_h(t) relu(q_h(t) . k(s)) / sqrt(d) with w = weights_proj / sqrt(H)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args, args.csa_compress_every, args.csa_indexer_dim, overlap=True)
        self.heads = args.csa_indexer_heads
        self.top_k = args.csa_top_k
        self.qat = args.qat == "fp4-experts"
        self.q_b_proj = nn.Linear(args.q_lora_rank, args.csa_indexer_heads * args.csa_indexer_dim, bias=False)
        self.scorer = IndexScorer(args)

    def scores(self, x: torch.Tensor, q_res: torch.Tensor, ctx: AttnContext, win: Windows,
               doc: torch.Tensor) -> torch.Tensor:
        """Index scores [B, T, S] (>= fp32) of the tokens x against their own compressed keys."""
        return self.score_keys(x, q_res, ctx, self.pool(x, ctx, win, doc))

    def score_keys(self, x: torch.Tensor, q_res: torch.Tensor, ctx: AttnContext, keys: torch.Tensor) -> torch.Tensor:
        """Index scores [B, T, S] (>= fp32) of the queries at x against compressed keys [B, S, dim]."""
        b, t, _ = x.shape
        cos, sin = ctx.rope(self.theta, self.rope_dim)
        q = apply_rope_tail(self.q_b_proj(q_res).view(b, t, -1, self.dim), cos, sin)
        if self.qat:
            from trex.trainer.model.quant import fp4_fake_quant

            q, keys = fp4_fake_quant(q), fp4_fake_quant(keys)
        dots = F.relu(torch.einsum("bthd,bsd->bths", upcast(q), upcast(keys))) * self.dim**-0.5
        w = upcast(self.scorer.weights_proj(x)) * self.heads**-0.5
        return torch.einsum("bths,bth->bts", dots, w)


class Compressor(Pool):
    """The compressed-KV branch of an hca or csa layer (csa adds the indexer)."""

    def __init__(self, args: ModelArgs, kind: str) -> None:
        every = args.csa_compress_every if kind == "csa" else args.hca_compress_every
        super().__init__(args, every, args.head_dim, overlap=kind == "csa")
        self.indexer = Indexer(args) if kind == "csa" else None


def sink_attention(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, sinks: torch.Tensor,
                   scale: float, block: int | None = None) -> torch.Tensor:
    """softmax([q k^T * scale, sink_h]) without the sink column, times v (= k): q [B, T, H, D],
    kv [B, S, D] (one shared head), mask [B, 1, T, S] boolean -> [B, T, H, D].

    Computed in blocks of ``block`` query rows (default model_args.SINK_BLOCK; rows are independent, so the
    result is that of one block). Under autograd only the inputs are saved and the backward recomputes one
    block's [B, H, block, S] probabilities at a time (no fused sink-attention kernel exists to keep only the
    log-sum-exp), so the live probabilities are one block's whatever the sequence length."""
    step = SINK_BLOCK if block is None else block
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, kv, sinks)):
        out: torch.Tensor = _BlockedSinkAttention.apply(q, kv, mask, sinks, scale, step)  # type: ignore[no-untyped-call]
        return out
    return _blocked(q, kv, mask, sinks, scale, step)


def _sink_block(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, sinks: torch.Tensor,
                scale: float) -> torch.Tensor:
    """sink_attention of one block of query rows, in one piece (its autograd keeps the probabilities)."""
    logits = torch.einsum("bthd,bsd->bhts", q, kv) * scale
    logits = logits.masked_fill(~mask, float("-inf"))
    b, h, t, _ = logits.shape
    sink = sinks.to(logits.dtype).view(1, -1, 1, 1).expand(b, h, t, 1)
    full = torch.cat([logits, sink], dim=-1)
    probs = torch.softmax(full - full.amax(-1, keepdim=True).detach(), dim=-1)[..., :-1]
    return torch.einsum("bhts,bsd->bthd", probs.to(kv.dtype), kv)


def _blocked(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, sinks: torch.Tensor, scale: float,
             block: int) -> torch.Tensor:
    """_sink_block over the query rows ``block`` at a time, concatenated."""
    t = q.shape[1]
    if t <= block:
        return _sink_block(q, kv, mask, sinks, scale)
    return torch.cat([_sink_block(q[:, i:i + block], kv, mask[:, :, i:i + block], sinks, scale)
                      for i in range(0, t, block)], dim=1)


class _BlockedSinkAttention(torch.autograd.Function):
    """sink_attention saving only its inputs (q, kv, mask, sinks); the backward recomputes block by block."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor,
                sinks: torch.Tensor, scale: float, block: int) -> torch.Tensor:
        """The blocked forward, without a graph; saves the inputs."""
        ctx.save_for_backward(q, kv, mask, sinks)
        ctx.scale, ctx.block = scale, block  # type: ignore[attr-defined]
        device = q.device.type  # the backward recomputes under the forward's autocast
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))  # type: ignore[attr-defined]
        return _blocked(q, kv, mask, sinks, scale, block)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,
                 grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """Per block: recompute its output with a graph, take the gradients of q's rows, kv and sinks, free it."""
        q, kv, mask, sinks = ctx.saved_tensors  # type: ignore[attr-defined]
        scale, block = ctx.scale, ctx.block  # type: ignore[attr-defined]
        device, enabled, dtype = ctx.autocast  # type: ignore[attr-defined]
        need_q, need_kv, _, need_sinks = ctx.needs_input_grad[:4]  # type: ignore[attr-defined]
        kv_leaf, sinks_leaf = kv.detach().requires_grad_(need_kv), sinks.detach().requires_grad_(need_sinks)
        grad_q = torch.empty_like(q) if need_q else None
        grad_kv = torch.zeros_like(kv) if need_kv else None
        grad_sinks = torch.zeros_like(sinks) if need_sinks else None
        for i in range(0, q.shape[1], block):
            q_leaf = q[:, i:i + block].detach().requires_grad_(need_q)
            with torch.enable_grad(), torch.autocast(device, dtype, enabled=enabled):
                out = _sink_block(q_leaf, kv_leaf, mask[:, :, i:i + block], sinks_leaf, scale)
            wanted = [(x, n) for x, n in ((q_leaf, need_q), (kv_leaf, need_kv), (sinks_leaf, need_sinks)) if n]
            grads = iter(torch.autograd.grad(out, [x for x, _ in wanted], grad[:, i:i + block]))
            if grad_q is not None:
                grad_q[:, i:i + block] = next(grads)
            if grad_kv is not None:
                grad_kv += next(grads)
            if grad_sinks is not None:
                grad_sinks += next(grads)
        return grad_q, grad_kv, None, grad_sinks, None, None


def window_mask(q_idx: torch.Tensor, doc: torch.Tensor, k_idx: torch.Tensor, k_doc: torch.Tensor,
                window: int) -> torch.Tensor:
    """Boolean [B, 1, t, u]: key j (index k_idx[j] in its sequence, document k_doc[:, j]) visible to query i
    (index q_idx[i], document doc[:, i]) iff k_idx[j] <= q_idx[i] < k_idx[j] + window, in the same document."""
    back = q_idx[:, None] - k_idx[None, :]
    allowed = (back >= 0) & (back < window)
    return (allowed[None] & (doc[:, :, None] == k_doc[:, None, :]))[:, None]


@dataclass
class EntryLayout:
    """The compression windows of the tokens SequenceKeys.extend gives for a pooling's reach, and where their
    entries go among the whole sequences' (computed once per forward per window size)."""

    win: Windows  # over the extended tokens
    pos: torch.Tensor  # [B, u] positions of the extended tokens
    doc: torch.Tensor  # [B, u] their documents
    entries: EntrySet


def entry_layout(ctx: AttnContext, every: int, reach: int) -> EntryLayout:
    """The windows of ``every`` tokens over the extended tokens of ``reach`` and their entries' place: a window is
    formed here for everyone when its last token is held here and is its window's last position (a document's
    trailing partial window is never visible to a query); its entry pools only tokens within ``reach`` before
    that token, which the extended tokens hold."""
    key = ("entries", every, reach)
    if key not in ctx.memo:
        idx, held, pos, doc = ctx.extended(reach)
        win = windows(pos, doc, every, idx)
        b, u = pos.shape
        col = torch.arange(u, device=pos.device).expand(b, u)
        last = torch.full((b, win.count), -1, dtype=torch.long, device=pos.device).scatter_reduce(
            1, win.seg, col, "amax")
        lc = last.clamp(min=0)
        owned = (last >= 0) & held[lc] & (pos.gather(1, lc) % every == every - 1)
        ctx.memo[key] = EntryLayout(win, pos, doc, ctx.keys.place(owned, idx[lc], win.start, win.doc))
    out = ctx.memo[key]
    assert isinstance(out, EntryLayout)
    return out


def top_k_visible(masked_scores: torch.Tensor, visible: torch.Tensor, top_k: int) -> torch.Tensor:
    """The top_k visible entries [B, T, S] by score (invisible ones scored -1e30 in masked_scores)."""
    s = masked_scores.shape[-1]
    k = min(top_k, s)
    # stable sort on the reversed entries: exact ties go to the latest window, independent of how
    # many entries the row holds (packed and separate documents agree)
    order = masked_scores.flip(-1).sort(dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.zeros_like(visible).scatter(2, s - 1 - order, True) & visible


class V4Attention(nn.Module):
    """One DeepSeek-V4 attention layer of kind sliding, csa or hca (HF `DeepseekV4Attention` names)."""

    def __init__(self, args: ModelArgs, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.head_dim = args.head_dim
        self.rope_dim = args.qk_rope_head_dim
        self.window = args.csa_window
        self.eps = args.norm_eps
        self.o_groups = args.o_groups
        self.o_lora_rank = args.o_lora_rank
        self.theta = args.rope_theta if kind == "sliding" else args.compress_rope_theta
        d, hd, h = args.hidden_size, args.head_dim, args.num_heads
        self.q_a_proj = nn.Linear(d, args.q_lora_rank, bias=False)
        self.q_a_norm = RMSNorm(args.q_lora_rank, args.norm_eps, scale_in_fp32=True)
        self.q_b_proj = nn.Linear(args.q_lora_rank, h * hd, bias=False)
        self.kv_proj = nn.Linear(d, hd, bias=False)
        self.kv_norm = RMSNorm(hd, args.norm_eps, scale_in_fp32=True)
        self.o_a_proj = nn.Linear(h * hd // args.o_groups, args.o_groups * args.o_lora_rank, bias=False)
        self.o_b_proj = nn.Linear(args.o_groups * args.o_lora_rank, d, bias=False)
        self.sinks = nn.Parameter(torch.zeros(h))
        self.compressor = Compressor(args, kind) if kind != "sliding" else None
        self.head_mean: Callable[[torch.Tensor], torch.Tensor] | None = None
        """Turns this module's head-mean of the attention distribution into the mean over every head when
        the heads are split over ranks (set by the parallel layer; None: all heads are here)."""

    def grouped_out(self, o: torch.Tensor) -> torch.Tensor:
        """o [B, T, H, D] -> o_b(concat_g o_a[g](heads of group g)): [B, T, hidden]."""
        b, t = o.shape[:2]
        weight = local_tensor(self.o_a_proj.weight)  # the groups of this rank's heads under tp
        n_groups = weight.shape[0] // self.o_lora_rank
        groups = o.reshape(b, t, n_groups, -1)
        w = weight.view(n_groups, -1, groups.shape[-1])
        mid = torch.einsum("btgi,goi->btgo", groups, w).reshape(b, t, -1)
        out: torch.Tensor = self.o_b_proj(mid)
        return out

    def forward(self, x: torch.Tensor, ctx: AttnContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (output [B, T, D], indexer KL loss scalar: zero outside csa).

        The queries are the tokens x; the keys come through ``ctx.keys`` (the tokens x themselves in one process;
        under context parallelism the tokens x with the window's halo before each of their chunks, and the
        compressed entries of the whole sequences, each pooled where its window's last token lives)."""
        if ctx.cache is not None:
            return ctx.cache.attend(self, x, ctx)
        b, t, _ = x.shape
        q_res, q, kv = self.project(x, ctx)
        doc = ctx.doc_ids if ctx.doc_ids is not None else torch.zeros((b, t), dtype=torch.long, device=x.device)
        comp = self.compressor
        feats, reaches = [kv], [self.window - 1]
        if comp is not None:
            feats += comp.features(x)
            if comp.indexer is not None:
                feats += comp.indexer.features(x.detach())  # the indexer trains on detached inputs
            reaches += [comp.reach] * (len(feats) - 1)
        kv, *per_token = ctx.keys.extend(feats, reaches)
        k_idx, _, _, k_doc = ctx.extended(self.window - 1)
        mask = window_mask(ctx.keys.indices(t, x.device), doc, k_idx, k_doc, self.window)
        aux = upcast(x.new_zeros(()))
        if comp is not None:
            lay = entry_layout(ctx, comp.every, comp.reach)
            pooled = [comp.pool_features(per_token[0], per_token[1], lay.pos, lay.win, lay.doc, ctx.cos.dtype)]
            if comp.indexer is not None:
                pooled.append(comp.indexer.pool_features(per_token[2], per_token[3], lay.pos, lay.win, lay.doc,
                                                         ctx.cos.dtype))
            entries, *index_keys = lay.entries.share(pooled)
            visible = lay.entries.visible(ctx.position_ids, doc, comp.every)
            if index_keys:
                visible, aux = self.select(x, q_res, q, entries, index_keys[0], visible, ctx)
            kv = torch.cat([kv, entries], dim=1)
            mask = torch.cat([mask, visible[:, None]], dim=-1)
        return self.attend(q, kv, mask, ctx), aux

    def project(self, x: torch.Tensor, ctx: AttnContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(query latent [B, T, q_lora_rank], rotated unit-RMS queries [B, T, H, D], rotated shared
        key/value [B, T, D]) of the tokens x."""
        b, t, _ = x.shape
        cos, sin = ctx.rope(self.theta, self.rope_dim)
        q_res = self.q_a_norm(self.q_a_proj(x))
        q = unit_rms(self.q_b_proj(q_res).view(b, t, -1, self.head_dim), self.eps)
        return q_res, apply_rope_tail(q, cos, sin), apply_rope_tail(self.kv_norm(self.kv_proj(x)), cos, sin)

    def attend(self, q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """Sink attention of q over the keys kv [B, S, D] under mask [B, 1, T, S], un-rotated and
        projected out: [B, T, hidden]."""
        cos, sin = ctx.rope(self.theta, self.rope_dim)
        o = sink_attention(q, kv, mask, local_tensor(self.sinks), self.head_dim**-0.5)
        return self.grouped_out(apply_rope_tail(o, cos, -sin))

    def select(self, x: torch.Tensor, q_res: torch.Tensor, q: torch.Tensor, entries: torch.Tensor,
               index_keys: torch.Tensor, visible: torch.Tensor,
               ctx: AttnContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The indexer's top-k of the visible entries [B, T, S] (its compressed keys index_keys [B, S, dim]) and
        its KL training loss."""
        assert self.compressor is not None and self.compressor.indexer is not None
        indexer = self.compressor.indexer
        scores = indexer.score_keys(x.detach(), q_res.detach(), ctx, index_keys)
        masked = scores.masked_fill(~visible, -1e30)
        return (top_k_visible(masked, visible, indexer.top_k),
                self.indexer_loss(q, entries, masked, visible, ctx.keys.total))

    def indexer_loss(self, q: torch.Tensor, entries: torch.Tensor, masked_scores: torch.Tensor,
                     visible: torch.Tensor, total: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """KL(main attention over the visible entries, head-mean, detached || indexer softmax), averaged over the
        query rows that see an entry: ``total`` counts them over the whole sequences (SequenceKeys.total), so
        the parts of a split sequence sum to its loss."""
        with torch.no_grad():
            logits = upcast(torch.einsum("bthd,bsd->bhts", q, entries)) * self.head_dim**-0.5
            p = logits.masked_fill(~visible[:, None], -1e30).softmax(-1).mean(1)
            if self.head_mean is not None:
                p = self.head_mean(p)
        logq = masked_scores.log_softmax(-1)
        rows = visible.any(-1)
        kl = (torch.special.xlogy(p, p) - p * logq).sum(-1)
        loss: torch.Tensor = (kl * rows).sum() / total(rows.sum()).clamp(min=1)
        return loss  # >= fp32: float64 for a float64 model
