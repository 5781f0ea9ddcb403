"""ModelArgs: the resolved model shape (preset + overrides) as a plain dataclass."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from trex.trainer.config import ModelConfig, resolved_model_values


@dataclass
class ModelArgs:
    """Every knob the model reads; field names match the config's ModelOverrides (snake_case)."""

    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    attention: Literal["mla", "csa"] = "mla"
    q_lora_rank: int = 0
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16
    csa_compress_every: int = 4
    csa_top_k: int = 8
    csa_window: int = 16
    csa_indexer_heads: int = 2
    csa_indexer_dim: int = 16
    intermediate_size: int = 128
    moe_intermediate_size: int = 32
    n_dense_layers: int = 0
    n_routed_experts: int = 8
    n_shared_experts: int = 1
    experts_per_token: int = 2
    scoring: Literal["sigmoid", "sqrt-softplus"] = "sigmoid"
    n_groups: int = 1
    topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    n_hash_layers: int = 0
    swiglu_limit: float = 10.0
    hc_mult: int = 1
    sinkhorn_iters: int = 20
    mtp_depth: int = 1
    max_seq_len: int = 1024
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self) -> None:
        self.validate()

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width (nope + rope parts)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def n_moe_layers(self) -> int:
        """MoE layers in the trunk plus one per MTP module (each MTP block has an MoE FFN)."""
        return max(self.num_layers - self.n_dense_layers, 0) + self.mtp_depth

    def validate(self) -> None:
        """Reject shapes the model cannot build, naming the offending field."""
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even for rotary pairs, got {self.qk_rope_head_dim}")
        if self.experts_per_token > self.n_routed_experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) exceeds n_routed_experts ({self.n_routed_experts})"
            )
        if self.n_routed_experts % self.n_groups:
            raise ValueError(f"n_groups ({self.n_groups}) must divide n_routed_experts ({self.n_routed_experts})")
        if self.topk_groups > self.n_groups:
            raise ValueError(f"topk_groups ({self.topk_groups}) exceeds n_groups ({self.n_groups})")
        if self.n_groups > 1 and self.n_routed_experts // self.n_groups < 2:
            raise ValueError("group-limited routing needs at least 2 experts per group (n_routed_experts / n_groups)")
        if self.n_groups > 1 and self.topk_groups * (self.n_routed_experts // self.n_groups) < self.experts_per_token:
            raise ValueError("topk_groups x experts per group must be >= experts_per_token")
        if self.n_dense_layers > self.num_layers:
            raise ValueError(f"n_dense_layers ({self.n_dense_layers}) exceeds num_layers ({self.num_layers})")
        if self.n_hash_layers > self.num_layers - self.n_dense_layers:
            raise ValueError(
                f"n_hash_layers ({self.n_hash_layers}) exceeds the MoE layer count "
                f"({self.num_layers - self.n_dense_layers})"
            )

    @classmethod
    def from_config(cls, model_cfg: ModelConfig) -> ModelArgs:
        """Preset values with the config's overrides applied."""
        values = resolved_model_values(model_cfg)
        return cls.from_values(values)

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> ModelArgs:
        """Build from a snake_case mapping; unknown keys are an error naming the key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown model field(s): {', '.join(unknown)}")
        return cls(**values)
