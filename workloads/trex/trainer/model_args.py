"""ModelArgs: the resolved model shape (preset + overrides) as a plain dataclass (no torch: config
validation checks shapes with it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from trex.trainer.config import ModelConfig

LayerKind = Literal["sliding", "csa", "hca"]
LAYER_KINDS: tuple[str, ...] = ("sliding", "csa", "hca")
SINK_BLOCK = 1024
"""Query rows per block of DeepSeek-V4's sink attention (trex.trainer.model.v4attention.sink_attention): the
backward recomputes one block's probabilities at a time, and the memory plan counts one block of them."""


def default_layer_types(n: int) -> list[str]:
    """transformers' DeepseekV4Config default schedule (two hca layers, then hca / csa alternating), what a
    config.json without layer_types means; the released checkpoints list theirs (the v4 presets)."""
    return ["hca"] * min(n, 2) + ["csa" if i % 2 else "hca" for i in range(max(n - 2, 0))]


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
    hca_compress_every: int = 8
    layer_types: list[str] | None = None
    """csa: attention kind per layer (sliding, csa, hca), trunk then MTP blocks; None = transformers'
    default schedule (default_layer_types) with sliding MTP blocks."""
    o_groups: int = 2
    o_lora_rank: int = 16
    compress_rope_theta: float = 160000.0
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
    norm_topk_prob: bool = True
    n_hash_layers: int = 0
    swiglu_limit: float = 10.0
    hc_mult: int = 1
    sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    mtp_depth: int = 1
    max_seq_len: int = 1024
    rope_theta: float = 10000.0
    rope_interleave: bool = True
    norm_eps: float = 1e-6
    init_std: float = 0.02
    qat: Literal["none", "fp4-experts"] = "none"

    def __post_init__(self) -> None:
        self.validate()

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width (nope + rope parts)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def head_dim(self) -> int:
        """csa: width of the one shared key/value head and of each query head."""
        return self.qk_head_dim

    def layer_kind(self, layer: int) -> str:
        """Attention kind of block `layer` (trunk 0..L-1, then MTP blocks): mla, sliding, csa or hca."""
        if self.attention == "mla":
            return "mla"
        if self.layer_types is not None and layer < len(self.layer_types):
            return self.layer_types[layer]
        return default_layer_types(self.num_layers)[layer] if layer < self.num_layers else "sliding"

    @property
    def n_moe_layers(self) -> int:
        """MoE layers in the trunk plus one per MTP module (each MTP block has an MoE FFN)."""
        return max(self.num_layers - self.n_dense_layers, 0) + self.mtp_depth

    def validate(self) -> None:
        """Reject shapes the model cannot build, naming the offending field."""
        if self.attention == "csa":
            self._validate_csa()
        if self.qat == "fp4-experts":
            dims = {"hidden_size": self.hidden_size, "moe_intermediate_size": self.moe_intermediate_size}
            if self.attention == "csa":
                dims["csa_indexer_dim"] = self.csa_indexer_dim
            for name, value in dims.items():
                if value % 32:
                    raise ValueError(f"{name} ({value}) must be a multiple of 32 with qat=fp4-experts "
                                     "(FP4 scales cover 1 x 32 blocks)")
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

    def _validate_csa(self) -> None:
        """The released V4 attention's shape constraints."""
        if self.q_lora_rank <= 0:
            raise ValueError("q_lora_rank must be > 0 with attention=csa (the indexer reads the query latent)")
        if self.v_head_dim != self.qk_head_dim:
            raise ValueError(f"v_head_dim ({self.v_head_dim}) must equal qk_nope_head_dim + qk_rope_head_dim "
                             f"({self.qk_head_dim}) with attention=csa (one shared key/value head)")
        if (self.num_heads * self.head_dim) % self.o_groups:
            raise ValueError(f"o_groups ({self.o_groups}) must divide num_heads x head_dim "
                             f"({self.num_heads * self.head_dim})")
        if self.csa_indexer_dim < self.qk_rope_head_dim:
            raise ValueError(f"csa_indexer_dim ({self.csa_indexer_dim}) must be >= qk_rope_head_dim "
                             f"({self.qk_rope_head_dim}): indexer queries and keys carry the rotary part")
        if self.layer_types is not None:
            bad = [k for k in self.layer_types if k not in LAYER_KINDS]
            if bad:
                raise ValueError(f"layer_types entries must be one of {', '.join(LAYER_KINDS)}, got {bad[0]!r}")
            if not self.num_layers <= len(self.layer_types) <= self.num_layers + self.mtp_depth:
                raise ValueError(f"layer_types has {len(self.layer_types)} entries; it needs num_layers "
                                 f"({self.num_layers}) up to num_layers + mtp_depth")

    @classmethod
    def from_config(cls, model_cfg: ModelConfig) -> ModelArgs:
        """Preset values with the config's overrides applied (and the config's qat mode): ``model_cfg.args``."""
        return model_cfg.args

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> ModelArgs:
        """Build from a snake_case mapping; unknown keys are an error naming the key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown model field(s): {', '.join(unknown)}")
        return cls(**values)
