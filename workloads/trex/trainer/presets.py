"""Model presets as plain data (no torch), so config validation and planning stay import-light."""

from __future__ import annotations

from typing import Any

# Every key is a ModelOverrides field (snake_case). v4-flash / v4-pro follow the published
# DeepSeek-V4 shapes (the transformers DeepseekV4Config defaults: head_dim 512 = 448 nope + 64 rope, one
# shared key/value head, grouped output projection); they are meant for the meta device (planning).
PRESET_VALUES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, attention="mla",
        q_lora_rank=0, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        csa_compress_every=4, csa_top_k=8, csa_window=16, csa_indexer_heads=2, csa_indexer_dim=16,
        hca_compress_every=8, o_groups=2, o_lora_rank=16, compress_rope_theta=160000.0,
        intermediate_size=128, moe_intermediate_size=32, n_dense_layers=0, n_routed_experts=8,
        n_shared_experts=1, experts_per_token=2, scoring="sigmoid", n_groups=1, topk_groups=1,
        routed_scaling_factor=1.0, n_hash_layers=0, swiglu_limit=10.0, hc_mult=1, sinkhorn_iters=20,
        mtp_depth=1, max_seq_len=1024, rope_theta=10000.0,
    ),
    "small-cpu": dict(
        vocab_size=8192, hidden_size=256, num_layers=4, num_heads=8, attention="mla",
        q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
        csa_compress_every=4, csa_top_k=32, csa_window=64, csa_indexer_heads=4, csa_indexer_dim=32,
        hca_compress_every=32, o_groups=4, o_lora_rank=64, compress_rope_theta=160000.0,
        intermediate_size=768, moe_intermediate_size=128, n_dense_layers=1, n_routed_experts=16,
        n_shared_experts=1, experts_per_token=4, scoring="sigmoid", n_groups=1, topk_groups=1,
        routed_scaling_factor=1.0, n_hash_layers=0, swiglu_limit=10.0, hc_mult=1, sinkhorn_iters=20,
        mtp_depth=1, max_seq_len=4096, rope_theta=10000.0,
    ),
    "small-gpu": dict(
        vocab_size=32768, hidden_size=1024, num_layers=12, num_heads=16, attention="mla",
        q_lora_rank=384, kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
        csa_compress_every=4, csa_top_k=256, csa_window=128, csa_indexer_heads=8, csa_indexer_dim=64,
        hca_compress_every=128, o_groups=8, o_lora_rank=256, compress_rope_theta=160000.0,
        intermediate_size=4096, moe_intermediate_size=512, n_dense_layers=1, n_routed_experts=48,
        n_shared_experts=1, experts_per_token=4, scoring="sigmoid", n_groups=1, topk_groups=1,
        routed_scaling_factor=2.5, n_hash_layers=0, swiglu_limit=10.0, hc_mult=1, sinkhorn_iters=20,
        mtp_depth=1, max_seq_len=8192, rope_theta=10000.0,
    ),
    "v4-flash": dict(
        vocab_size=129280, hidden_size=4096, num_layers=43, num_heads=64, attention="csa",
        q_lora_rank=1024, kv_lora_rank=512, qk_nope_head_dim=448, qk_rope_head_dim=64, v_head_dim=512,
        csa_compress_every=4, csa_top_k=512, csa_window=128, csa_indexer_heads=64, csa_indexer_dim=128,
        hca_compress_every=128, o_groups=8, o_lora_rank=1024, compress_rope_theta=160000.0,
        intermediate_size=12288, moe_intermediate_size=2048, n_dense_layers=0, n_routed_experts=256,
        n_shared_experts=1, experts_per_token=6, scoring="sqrt-softplus", n_groups=1, topk_groups=1,
        routed_scaling_factor=1.5, n_hash_layers=3, swiglu_limit=10.0, hc_mult=4, sinkhorn_iters=20,
        mtp_depth=1, max_seq_len=1_048_576, rope_theta=10000.0,
    ),
    "v4-pro": dict(
        vocab_size=129280, hidden_size=7168, num_layers=61, num_heads=128, attention="csa",
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=448, qk_rope_head_dim=64, v_head_dim=512,
        csa_compress_every=4, csa_top_k=1024, csa_window=128, csa_indexer_heads=64, csa_indexer_dim=128,
        hca_compress_every=128, o_groups=16, o_lora_rank=1024, compress_rope_theta=160000.0,
        intermediate_size=18432, moe_intermediate_size=3072, n_dense_layers=0, n_routed_experts=384,
        n_shared_experts=1, experts_per_token=6, scoring="sqrt-softplus", n_groups=1, topk_groups=1,
        routed_scaling_factor=2.5, n_hash_layers=3, swiglu_limit=10.0, hc_mult=4, sinkhorn_iters=20,
        mtp_depth=1, max_seq_len=1_048_576, rope_theta=10000.0,
    ),
}


def resolve_model_values(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Preset values with the non-None overrides applied."""
    if preset not in PRESET_VALUES:
        raise ValueError(f"unknown preset {preset!r}; allowed: {', '.join(PRESET_VALUES)}")
    values = dict(PRESET_VALUES[preset])
    values.update({k: v for k, v in overrides.items() if v is not None})
    return values
