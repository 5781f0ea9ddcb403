"""Attention: DeepSeek-V3 multi-head latent attention (`mla`) and V4-style compressed sparse attention (`csa`).

Both take packed documents (`doc_ids`): no attention crosses a document, and the rotary positions
come from `position_ids` (restarting per document). Correctness first: torch SDPA with an explicit
boolean mask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trex.trainer.model.args import ModelArgs
from trex.trainer.model.layers import RMSNorm, apply_rope, causal_doc_mask, rope_cos_sin, upcast


@dataclass
class AttnContext:
    """Per-forward inputs shared by every attention layer."""

    position_ids: torch.Tensor  # [B, T] long, restarting per document
    doc_ids: torch.Tensor | None  # [B, T] or None (one document per row)
    cos: torch.Tensor  # [B, T, rope/2]
    sin: torch.Tensor
    mask: torch.Tensor | None = None
    """causal_doc_mask(doc_ids) [B, 1, T, T], built once per forward and shared by every mla layer
    (None: each layer builds it from doc_ids)."""


class MLAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2/V3), HF `DeepseekV3Attention` parameter names."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.num_heads
        self.nope = args.qk_nope_head_dim
        self.rope = args.qk_rope_head_dim
        self.v_dim = args.v_head_dim
        self.kv_lora_rank = args.kv_lora_rank
        self.q_lora_rank = args.q_lora_rank
        qk = args.qk_head_dim
        dim = args.hidden_size
        if self.q_lora_rank > 0:
            self.q_a_proj = nn.Linear(dim, self.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, args.norm_eps)
            self.q_b_proj = nn.Linear(self.q_lora_rank, self.n_heads * qk, bias=False)
        else:
            self.q_proj = nn.Linear(dim, self.n_heads * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(dim, self.kv_lora_rank + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, args.norm_eps)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, self.n_heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.v_dim, dim, bias=False)
        self.scale = qk**-0.5
        self.rope_theta = args.rope_theta

    def query(self, x: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """Queries [B, T, H, nope + rope] with RoPE applied to the rope part."""
        b, t, _ = x.shape
        if self.q_lora_rank > 0:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q = q.view(b, t, -1, self.nope + self.rope)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        return torch.cat([q_nope, apply_rope(q_rope, ctx.cos, ctx.sin)], dim=-1)

    def latent(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised KV latent [B, T, kv_lora_rank] and un-rotated shared rope key [B, T, rope]."""
        c, k_rope = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope], dim=-1)
        return self.kv_a_layernorm(c), k_rope

    def expand(self, c: torch.Tensor, k_rope_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys [B, S, H, nope + rope] and values [B, S, H, v] from latents."""
        b, s, _ = c.shape
        kv = self.kv_b_proj(c).view(b, s, -1, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_rope_rot[:, :, None, :].expand(b, s, kv.shape[2], self.rope)], dim=-1)
        return k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """SDPA over [B, T, H, *] tensors; mask [B, 1, T, S] boolean or None (plain causal)."""
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=mask, is_causal=mask is None, scale=self.scale,
        )
        b, t = q.shape[:2]
        out: torch.Tensor = self.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        return out

    def forward(self, x: torch.Tensor, ctx: AttnContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (output [B, T, D], auxiliary loss scalar: zero for mla)."""
        b, t, _ = x.shape
        q = self.query(x, ctx)
        c, k_rope = self.latent(x)
        k, v = self.expand(c, apply_rope(k_rope, ctx.cos, ctx.sin))
        mask = ctx.mask
        if mask is None and ctx.doc_ids is not None:
            mask = causal_doc_mask(ctx.doc_ids, b, t, x.device)
        return self.attend(q, k, v, mask), x.new_zeros(())


@dataclass
class Compressed:
    """Compressed KV entries of one batch, padded to S entries per row."""

    latent: torch.Tensor  # [B, S, kv_lora_rank]
    k_rope: torch.Tensor  # [B, S, rope] (rotated at the block's last position)
    doc: torch.Tensor  # [B, S] document of the block
    end: torch.Tensor  # [B, S] index (in the row) of the block's last token
    valid: torch.Tensor  # [B, S] bool: the entry exists in this row


def block_ids(position_ids: torch.Tensor, doc_ids: torch.Tensor, every: int) -> torch.Tensor:
    """Compression block index per token [B, T]: a block is `every` consecutive tokens of one
    document, aligned to the document start (so a packed document compresses as it would alone)."""
    new = torch.ones_like(doc_ids, dtype=torch.bool)
    new[:, 1:] = (doc_ids[:, 1:] != doc_ids[:, :-1]) | (position_ids[:, 1:] // every != position_ids[:, :-1] // every)
    return new.long().cumsum(dim=1) - 1


class CSAttention(MLAttention):
    """Compressed sparse attention in the style of DeepSeek-V4.

    Queries and KV entries are RMS-normalised. Every `csa_compress_every` tokens of a document are
    pooled (learned softmax weights) into one compressed KV entry; a lightning indexer scores the
    compressed entries per query and keeps the top `csa_top_k`. A sliding-window branch covers the
    last `csa_window` tokens. One softmax runs over both branches. Causal throughout: a compressed
    entry is visible only when all its tokens precede the query, and only within its document.
    The indexer is trained with the DSA recipe: KL from the (detached) main attention distribution
    over the visible compressed entries to the indexer's distribution, on detached inputs.
    """

    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args)
        self.every = args.csa_compress_every
        self.top_k = args.csa_top_k
        self.window = args.csa_window
        self.idx_heads = args.csa_indexer_heads
        self.idx_dim = args.csa_indexer_dim
        self.q_norm = RMSNorm(args.qk_head_dim, args.norm_eps)
        self.compress_gate = nn.Linear(self.kv_lora_rank, 1, bias=False)
        self.compress_pos_bias = nn.Parameter(torch.zeros(self.every))
        self.compress_norm = RMSNorm(self.kv_lora_rank, args.norm_eps)
        self.indexer_q = nn.Linear(args.hidden_size, self.idx_heads * self.idx_dim, bias=False)
        self.indexer_w = nn.Linear(args.hidden_size, self.idx_heads, bias=False)
        self.indexer_k = nn.Linear(self.kv_lora_rank, self.idx_dim, bias=False)
        self.head_mean: Callable[[torch.Tensor], torch.Tensor] | None = None
        """Turns this module's head-mean of the attention distribution into the mean over every head when
        the heads are split over ranks (set by the parallel layer; None: all heads are here)."""

    def compress(self, c: torch.Tensor, k_rope: torch.Tensor, ctx: AttnContext, doc: torch.Tensor) -> Compressed:
        """Pool each block's latents and rope keys with softmax(gate(c) + position bias) weights."""
        b, t, _ = c.shape
        pos = ctx.position_ids
        seg = block_ids(pos, doc, self.every)
        s = int(seg.max().item()) + 1
        logit = upcast(self.compress_gate(c).squeeze(-1) + self.compress_pos_bias[pos % self.every])
        seg_max = logit.new_full((b, s), float("-inf")).scatter_reduce(1, seg, logit.detach(), "amax")
        e = torch.exp(logit - seg_max.gather(1, seg))
        den = e.new_zeros((b, s)).scatter_add(1, seg, e)
        w = (e / den.gather(1, seg)).to(c.dtype)[..., None]
        latent = c.new_zeros((b, s, c.shape[-1])).scatter_add(1, seg[..., None].expand_as(c), w * c)
        kr = k_rope.new_zeros((b, s, k_rope.shape[-1])).scatter_add(
            1, seg[..., None].expand_as(k_rope), w * k_rope
        )
        idx = torch.arange(t, device=c.device).expand(b, t)
        end = torch.full((b, s), -1, dtype=torch.long, device=c.device).scatter_reduce(1, seg, idx, "amax")
        last_pos = torch.zeros((b, s), dtype=torch.long, device=c.device).scatter_reduce(1, seg, pos, "amax")
        comp_doc = torch.full((b, s), -1, dtype=doc.dtype, device=c.device).scatter_reduce(1, seg, doc, "amax")
        cos, sin = rope_cos_sin(last_pos, self.rope, self.rope_theta)
        return Compressed(
            latent=self.compress_norm(latent), k_rope=apply_rope(kr, cos, sin),
            doc=comp_doc, end=end, valid=end >= 0,
        )

    def index_scores(self, x: torch.Tensor, comp_latent: torch.Tensor) -> torch.Tensor:
        """Lightning-indexer scores [B, T, S] = sum_h w_h(t) relu(q_h(t) . k(s)) / sqrt(d)."""
        b, t, _ = x.shape
        qi = self.indexer_q(x).view(b, t, self.idx_heads, self.idx_dim)
        ki = self.indexer_k(comp_latent)
        wi = self.indexer_w(x)
        dots = torch.einsum("bthd,bsd->bths", qi, ki) * self.idx_dim**-0.5
        return upcast(torch.einsum("bths,bth->bts", F.relu(dots), wi))

    def forward(self, x: torch.Tensor, ctx: AttnContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (output [B, T, D], indexer KL loss scalar)."""
        b, t, _ = x.shape
        doc = ctx.doc_ids if ctx.doc_ids is not None else torch.zeros((b, t), dtype=torch.long, device=x.device)
        q = self.q_norm(self.query(x, ctx))
        c, k_rope = self.latent(x)
        k_tok, v_tok = self.expand(c, apply_rope(k_rope, ctx.cos, ctx.sin))
        comp = self.compress(c, k_rope, ctx, doc)
        k_cmp, v_cmp = self.expand(comp.latent, comp.k_rope)
        s = comp.latent.shape[1]
        qidx = torch.arange(t, device=x.device)
        visible = (
            comp.valid[:, None, :] & (comp.doc[:, None, :] == doc[:, :, None])
            & (comp.end[:, None, :] < qidx[None, :, None])
        )  # [B, T, S]
        scores = self.index_scores(x.detach(), comp.latent.detach())
        masked = scores.masked_fill(~visible, -1e30)
        k_sel = min(self.top_k, s)
        # stable sort on the reversed entries: ties (e.g. all-zero ReLU scores) go to the latest block,
        # independent of how many entries the row holds (packed and separate documents agree)
        order = masked.flip(-1).sort(dim=-1, descending=True, stable=True).indices[..., :k_sel]
        chosen = torch.zeros_like(visible).scatter(2, s - 1 - order, True) & visible
        window = causal_doc_mask(ctx.doc_ids, b, t, x.device, window=self.window)
        mask = torch.cat([window, chosen[:, None]], dim=-1)
        out = self.attend(q, torch.cat([k_tok, k_cmp], 1), torch.cat([v_tok, v_cmp], 1), mask)
        return out, self.indexer_loss(q, k_cmp, masked, visible)

    def indexer_loss(self, q: torch.Tensor, k_cmp: torch.Tensor, masked_scores: torch.Tensor,
                     visible: torch.Tensor) -> torch.Tensor:
        """KL(main attention over visible compressed entries, head-mean, detached || indexer softmax)."""
        with torch.no_grad():
            logits = upcast(torch.einsum("bthd,bshd->bhts", q, k_cmp)) * self.scale
            p = logits.masked_fill(~visible[:, None], -1e30).softmax(-1).mean(1)
            if self.head_mean is not None:
                p = self.head_mean(p)
        logq = masked_scores.log_softmax(-1)
        rows = visible.any(-1)
        kl = (torch.special.xlogy(p, p) - p * logq).sum(-1)
        n = rows.sum().clamp(min=1)
        loss: torch.Tensor = (kl * rows).sum() / n
        return loss


def build_attention(args: ModelArgs) -> MLAttention:
    """The attention module `args.attention` names."""
    if args.attention == "mla":
        return MLAttention(args)
    return CSAttention(args)
