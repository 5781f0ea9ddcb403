"""Attention: DeepSeek-V3 multi-head latent attention (`mla`) and DeepSeek-V4's attention stack (`csa`).

Both take packed documents (`doc_ids`): no attention crosses a document, and the rotary positions
come from `position_ids` (restarting per document). Correctness first: explicit masks, no fused
kernels. The V4 layers live in trex.trainer.model.v4attention, the shared per-forward inputs in
trex.trainer.model.context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trex.trainer.model.args import ModelArgs
from trex.trainer.model.context import AttnContext
from trex.trainer.model.layers import RMSNorm, apply_rope, causal_doc_mask
from trex.trainer.model.v4attention import V4Attention

LATENT_NORM_EPS = 1e-6
"""eps of the q/kv latent norms: DeepSeek-V3 (and transformers' port) fix it at 1e-6 whatever rms_norm_eps is."""


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
        self.interleave = args.rope_interleave
        if self.q_lora_rank > 0:
            self.q_a_proj = nn.Linear(dim, self.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(self.q_lora_rank, self.n_heads * qk, bias=False)
        else:
            self.q_proj = nn.Linear(dim, self.n_heads * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(dim, self.kv_lora_rank + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS)
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
        return torch.cat([q_nope, apply_rope(q_rope, ctx.cos, ctx.sin, self.interleave)], dim=-1)

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
        if ctx.cache is not None:
            return ctx.cache.attend(self, x, ctx)
        b, t, _ = x.shape
        q = self.query(x, ctx)
        c, k_rope = self.latent(x)
        k_rope = apply_rope(k_rope, ctx.cos, ctx.sin, self.interleave)
        if ctx.gather is not None:  # keys of the sequences' other chunks (context parallelism): one gather
            both = ctx.gather(torch.cat([c, k_rope], dim=-1))
            c, k_rope = both[..., :self.kv_lora_rank], both[..., self.kv_lora_rank:]
        k, v = self.expand(c, k_rope)
        mask = ctx.mask
        if mask is None and ctx.doc_ids is not None:
            mask = causal_doc_mask(ctx.doc_ids, b, t, x.device)
        return self.attend(q, k, v, mask), x.new_zeros(())


def build_attention(args: ModelArgs, layer: int = 0) -> nn.Module:
    """The attention module block `layer` runs: mla, or V4's sliding / csa / hca kind."""
    kind = args.layer_kind(layer)
    if kind == "mla":
        return MLAttention(args)
    return V4Attention(args, kind)
