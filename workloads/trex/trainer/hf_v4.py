"""DeepSeek-V4 checkpoint layouts: transformers' `DeepseekV4ForCausalLM` names and DeepSeek's original names.

trex's V4 modules already carry the HF leaf names (self_attn.q_a_proj, compressor.indexer.q_b_proj,
...); the HF layout differs in prefixes, the mHC parameter names (attn_hc / ffn_hc, hc_head.hc_fn) and
the routed experts (gate_up_proj [E, 2I, D] = gate and up stacked along the rows). The original layout
(what transformers' conversion_mapping renames from) uses embed / head / layers.N.attn / layers.N.ffn,
wq_a / wq_b / wkv / wgate / wo_a / wo_b, q_norm, attn_sink, ape, compressor.norm, gate.bias,
hc_attn_fn ..., and one w1 / w2 / w3 (gate / down / up) tensor per expert.

MTP modules have no transformers class: both layouts store them under `mtp.K.*` with the release's
names (transformers skips `mtp.*` on load): e_proj, h_proj (hidden x hidden each), enorm, hnorm,
norm, hc_head_fn / hc_head_base / hc_head_scale, and the block's tensors directly under `mtp.K.` as in
a trunk block (attn.*, ffn.*, attn_norm, hc_attn_fn, ...), the layout vLLM's DeepSeek-V4 MTP loader reads.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from trex.trainer.model.args import ModelArgs

log = logging.getLogger(__name__)

LAYER_TYPE_NAMES = {"sliding": "sliding_attention", "csa": "compressed_sparse_attention",
                    "hca": "heavily_compressed_attention"}


def check_v4_compatible(args: ModelArgs) -> None:
    """Raise ValueError naming the first field transformers' DeepseekV4 cannot represent."""
    if args.hc_mult < 2:
        raise ValueError(f"hc_mult={args.hc_mult}: DeepSeek-V4 always mixes mHC streams (hc_mult >= 2)")
    if args.n_dense_layers:
        raise ValueError(f"n_dense_layers={args.n_dense_layers}: DeepSeek-V4 has MoE in every layer")
    if args.n_shared_experts != 1:
        raise ValueError(f"n_shared_experts={args.n_shared_experts}: DeepSeek-V4 has exactly one shared expert")
    if args.n_groups != 1:
        raise ValueError(f"n_groups={args.n_groups}: DeepSeek-V4 routing is not group-limited")
    if not args.norm_topk_prob:
        raise ValueError("norm_topk_prob=false: DeepSeek-V4 always renormalises the chosen experts' scores")
    if args.swiglu_limit <= 0:
        raise ValueError("swiglu_limit=0: DeepSeek-V4 always clamps its SwiGLU (set a positive limit)")


def hf_v4_config(args: ModelArgs, dtype: str = "float32") -> dict[str, Any]:
    """config.json of a `DeepseekV4ForCausalLM` with this shape."""
    check_v4_compatible(args)
    kinds = [args.layer_kind(i) for i in range(args.num_layers)]
    n_moe = args.num_layers
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": args.vocab_size,
        "hidden_size": args.hidden_size,
        "moe_intermediate_size": args.moe_intermediate_size,
        "num_hidden_layers": args.num_layers,
        "num_attention_heads": args.num_heads,
        "num_key_value_heads": 1,
        "head_dim": args.head_dim,
        "partial_rotary_factor": args.qk_rope_head_dim / args.head_dim,
        "q_lora_rank": args.q_lora_rank,
        "num_experts_per_tok": args.experts_per_token,
        "n_routed_experts": args.n_routed_experts,
        "n_shared_experts": 1,
        "scoring_func": "sqrtsoftplus" if args.scoring == "sqrt-softplus" else "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": args.routed_scaling_factor,
        "max_position_embeddings": args.max_seq_len,
        "rope_theta": args.rope_theta,
        "compress_rope_theta": args.compress_rope_theta,
        "layer_types": [LAYER_TYPE_NAMES[k] for k in kinds],
        "compress_rates": {"compressed_sparse_attention": args.csa_compress_every,
                           "heavily_compressed_attention": args.hca_compress_every},
        "mlp_layer_types": ["hash_moe" if i < args.n_hash_layers else "moe" for i in range(n_moe)],
        "hc_mult": args.hc_mult,
        "hc_sinkhorn_iters": args.sinkhorn_iters,
        "hc_eps": args.hc_eps,
        "swiglu_limit": args.swiglu_limit,
        "sliding_window": args.csa_window,
        "o_groups": args.o_groups,
        "o_lora_rank": args.o_lora_rank,
        "index_n_heads": args.csa_indexer_heads,
        "index_head_dim": args.csa_indexer_dim,
        "index_topk": args.csa_top_k,
        "num_nextn_predict_layers": args.mtp_depth,
        "rms_norm_eps": args.norm_eps,
        "initializer_range": args.init_std,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": dtype,
    }


_KIND_OF_NAME = {v: k for k, v in LAYER_TYPE_NAMES.items()}


def args_from_v4_config(cfg: dict[str, Any]) -> ModelArgs:
    """ModelArgs of a DeepseekV4 config.json (also the legacy compress_ratios / num_hash_layers keys)."""
    from trex.trainer.model_args import ModelArgs, default_layer_types

    n = int(cfg.get("num_hidden_layers", 43))
    mtp = int(cfg.get("num_nextn_predict_layers", 1))
    rates = dict(cfg.get("compress_rates") or {})
    csa_m = int(rates.get("compressed_sparse_attention", cfg.get("compress_rate_csa", 4)))
    hca_m = int(rates.get("heavily_compressed_attention", cfg.get("compress_rate_hca", 128)))
    if cfg.get("layer_types") is not None:
        kinds = [_KIND_OF_NAME[k] for k in cfg["layer_types"]]
    elif cfg.get("compress_ratios") is not None:
        by_ratio = {0: "sliding", csa_m: "csa", hca_m: "hca"}
        kinds = [by_ratio[int(r)] for r in cfg["compress_ratios"]]
    else:
        kinds = default_layer_types(n)
    mlp_types = cfg.get("mlp_layer_types")
    if mlp_types is None:
        n_hash = min(n, int(cfg.get("num_hash_layers", 3)))
    else:
        n_hash = sum(1 for t in mlp_types if t == "hash_moe")
        if list(mlp_types) != ["hash_moe"] * n_hash + ["moe"] * (len(mlp_types) - n_hash):
            raise ValueError("config.json mlp_layer_types: hash_moe layers must lead (trex hashes the first MoE layers)")
    scoring = str(cfg.get("scoring_func", "sqrtsoftplus"))
    if scoring not in ("sqrtsoftplus", "sigmoid"):
        raise ValueError(f"config.json scoring_func={scoring!r}: only 'sqrtsoftplus' and 'sigmoid' are supported")
    if not cfg.get("norm_topk_prob", True):
        raise ValueError("config.json norm_topk_prob=false: DeepSeek-V4 always renormalises")
    rope = cfg.get("rope_parameters") or {}
    for part in ("main", "compress"):
        sub = rope.get(part) if isinstance(rope.get(part), dict) else None
        if sub is not None and sub.get("rope_type", "default") != "default":
            raise ValueError(f"config.json rope_parameters.{part}: rope scaling (yarn) is not supported")
    if rope and not isinstance(rope.get("main"), dict) and rope.get("rope_type", "default") != "default":
        raise ValueError("config.json rope_parameters: rope scaling (yarn) is not supported")
    head_dim = int(cfg.get("head_dim", 512))
    rope_dim = (int(cfg["qk_rope_head_dim"]) if "qk_rope_head_dim" in cfg
                else int(head_dim * float(cfg.get("partial_rotary_factor") or 64 / 512)))
    return ModelArgs(
        vocab_size=int(cfg.get("vocab_size", 129280)), hidden_size=int(cfg.get("hidden_size", 4096)),
        num_layers=n, num_heads=int(cfg.get("num_attention_heads", 64)), attention="csa",
        q_lora_rank=int(cfg.get("q_lora_rank", 1024)), qk_nope_head_dim=head_dim - rope_dim,
        qk_rope_head_dim=rope_dim, v_head_dim=head_dim,
        csa_compress_every=csa_m, hca_compress_every=hca_m, csa_top_k=int(cfg.get("index_topk", 512)),
        csa_window=int(cfg.get("sliding_window", 128)), csa_indexer_heads=int(cfg.get("index_n_heads", 64)),
        csa_indexer_dim=int(cfg.get("index_head_dim", 128)), layer_types=kinds[:n],
        o_groups=int(cfg.get("o_groups", 8)), o_lora_rank=int(cfg.get("o_lora_rank", 1024)),
        compress_rope_theta=float(cfg.get("compress_rope_theta", 160000.0)),
        moe_intermediate_size=int(cfg.get("moe_intermediate_size", 2048)), n_dense_layers=0,
        n_routed_experts=int(cfg.get("n_routed_experts", 256)), n_shared_experts=int(cfg.get("n_shared_experts", 1)),
        experts_per_token=int(cfg.get("num_experts_per_tok", 6)),
        scoring="sqrt-softplus" if scoring == "sqrtsoftplus" else "sigmoid",
        routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.5)), n_hash_layers=n_hash,
        swiglu_limit=float(cfg.get("swiglu_limit", 10.0)), hc_mult=int(cfg.get("hc_mult", 4)),
        sinkhorn_iters=int(cfg.get("hc_sinkhorn_iters", 20)), hc_eps=float(cfg.get("hc_eps", 1e-6)),
        mtp_depth=mtp, max_seq_len=int(cfg.get("max_position_embeddings", 1_048_576)),
        rope_theta=float(cfg.get("rope_theta", 10000.0)), norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
    )


# --- names -------------------------------------------------------------------------------------
# (ours, original) leaf renames inside a block, applied left to right on dotted names.
_ORIGINAL_BLOCK = [
    ("self_attn.compressor.indexer.scorer.weights_proj.", "attn.indexer.weights_proj."),
    ("self_attn.compressor.indexer.q_b_proj.", "attn.indexer.wq_b."),
    ("self_attn.compressor.indexer.", "attn.indexer.compressor."),
    ("self_attn.compressor.", "attn.compressor."),
    ("self_attn.q_b_proj.", "attn.wq_b."),
    ("self_attn.", "attn."),
    ("mlp.", "ffn."),
    ("input_layernorm.", "attn_norm."),
    ("post_attention_layernorm.", "ffn_norm."),
]
_ORIGINAL_LEAF = [
    ("q_a_proj.", "wq_a."), ("q_a_norm.", "q_norm."), ("kv_proj.", "wkv."), ("gate_proj.", "wgate."),
    ("o_a_proj.", "wo_a."), ("o_b_proj.", "wo_b."), ("sinks", "attn_sink"), ("position_bias", "ape"),
    ("gate.e_score_correction_bias", "gate.bias"),
]
_SHARED = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
_HC = {"hc_attn": "attn_hc", "hc_ffn": "ffn_hc"}


def _block_to_original(rest: str) -> str:
    """Block-relative name (ours) -> original."""
    m = re.match(r"mlp\.shared_experts\.(gate_proj|up_proj|down_proj)\.weight$", rest)
    if m:
        return f"ffn.shared_experts.{_SHARED[m.group(1)]}.weight"
    m = re.match(r"(hc_attn|hc_ffn)\.(fn|base|scale)$", rest)
    if m:
        return f"{m.group(1)}_{m.group(2)}"
    for ours, orig in _ORIGINAL_BLOCK:
        if rest.startswith(ours):
            rest = orig + rest[len(ours):]
            break
    if rest.startswith(("attn.compressor.", "attn.indexer.compressor.")) and rest.endswith("kv_norm.weight"):
        rest = rest[: -len("kv_norm.weight")] + "norm.weight"
    for ours, orig in _ORIGINAL_LEAF:
        rest = rest.replace(ours, orig)
    return rest


def _block_to_hf(rest: str) -> str:
    m = re.match(r"(hc_attn|hc_ffn)\.(fn|base|scale)$", rest)
    if m:
        return f"{_HC[m.group(1)]}.{m.group(2)}"
    return rest


def _mtp_name(rest: str) -> str:
    """MTP-module-relative name (ours) -> stored (original style)."""
    if rest.startswith("block."):
        return _block_to_original(rest[len("block."):])
    if rest.startswith("hc_head."):
        return "hc_head_" + rest[len("hc_head."):]
    return rest


def _expert_tensors(prefix: str, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                    original: bool) -> dict[str, torch.Tensor]:
    import torch

    if not original:
        return {f"{prefix}.gate_up_proj": torch.cat([gate, up], dim=1), f"{prefix}.down_proj": down}
    out: dict[str, torch.Tensor] = {}
    for e in range(gate.shape[0]):
        out[f"{prefix}.{e}.w1.weight"] = gate[e]
        out[f"{prefix}.{e}.w2.weight"] = down[e]
        out[f"{prefix}.{e}.w3.weight"] = up[e]
    return out


def to_v4_state_dict(state: dict[str, torch.Tensor], args: ModelArgs, original: bool = False) -> dict[str, torch.Tensor]:
    """Our state dict (a DeepSeekModel's) under the HF (default) or original V4 names."""
    out: dict[str, torch.Tensor] = {}
    stacks: dict[str, dict[str, torch.Tensor]] = {}
    hash_gates = {f"layers.{i}.mlp.gate" for i in range(args.n_hash_layers)}
    for name, t in state.items():
        em = re.match(r"(.*\.mlp\.experts)\.(gate_proj|up_proj|down_proj)$", name)
        if em:
            stacks.setdefault(em.group(1), {})[em.group(2)] = t
            continue
        if name.endswith("e_score_correction_bias") and name.rsplit(".", 1)[0] in hash_gates:
            continue  # hash-routed gates carry no selection bias in either layout
        out[_stored_name(name, original)] = t
    for prefix, parts in stacks.items():
        stored = _stored_name(prefix + ".x", original)[: -len(".x")]
        out.update(_expert_tensors(stored, parts["gate_proj"], parts["up_proj"], parts["down_proj"], original))
    return out


def _stored_name(name: str, original: bool) -> str:
    """One of our parameter names -> its stored name."""
    top_hf = {"embed_tokens.weight": "model.embed_tokens.weight", "lm_head.weight": "lm_head.weight",
              "norm.weight": "model.norm.weight", "hc_head.fn": "model.hc_head.hc_fn",
              "hc_head.base": "model.hc_head.hc_base", "hc_head.scale": "model.hc_head.hc_scale"}
    top_orig = {"embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
                "norm.weight": "norm.weight", "hc_head.fn": "hc_head_fn", "hc_head.base": "hc_head_base",
                "hc_head.scale": "hc_head_scale"}
    if name in top_hf:
        return top_orig[name] if original else top_hf[name]
    m = re.match(r"layers\.(\d+)\.(.*)$", name)
    if m:
        rest = _block_to_original(m.group(2)) if original else _block_to_hf(m.group(2))
        return f"layers.{m.group(1)}.{rest}" if original else f"model.layers.{m.group(1)}.{rest}"
    m = re.match(r"mtp\.(\d+)\.(.*)$", name)
    if m:
        return f"mtp.{m.group(1)}.{_mtp_name(m.group(2))}"
    raise ValueError(f"no V4 checkpoint name for {name!r}")


def detect_v4_layout(keys: set[str]) -> str:
    """'hf' (transformers' module names) or 'original' (DeepSeek's, with or without a `model.` prefix,
    as transformers itself writes them back), from the tensor names."""
    if any(re.match(r"(model\.)?layers\.\d+\.(attn|ffn)\.", k) for k in keys) or "embed.weight" in keys:
        return "original"
    if any(k.startswith("model.") for k in keys):
        return "hf"
    raise ValueError("cannot tell the checkpoint layout: neither model.* (transformers) nor embed/layers.N.attn "
                     "(DeepSeek original) names")


# original -> HF renames inside a block (regex, replacement), applied in order
_TO_HF = [
    (r"^attn\.indexer\.weights_proj\.", "self_attn.compressor.indexer.scorer.weights_proj."),
    (r"^attn\.indexer\.wq_b\.", "self_attn.compressor.indexer.q_b_proj."),
    (r"^attn\.indexer\.compressor\.", "self_attn.compressor.indexer."),
    (r"^attn\.wq_b\.", "self_attn.q_b_proj."),
    (r"^attn\.", "self_attn."), (r"^ffn\.", "mlp."),
    (r"^attn_norm\.", "input_layernorm."), (r"^ffn_norm\.", "post_attention_layernorm."),
    (r"^hc_(attn|ffn)_(fn|base|scale)$", r"\1_hc.\2"),
    (r"\.attn_sink$", ".sinks"), (r"\.ape$", ".position_bias"), (r"\.norm\.weight$", ".kv_norm.weight"),
    (r"\.wq_a\.", ".q_a_proj."), (r"\.wkv\.", ".kv_proj."), (r"\.wgate\.", ".gate_proj."),
    (r"\.wo_a\.", ".o_a_proj."), (r"\.wo_b\.", ".o_b_proj."), (r"\.q_norm\.", ".q_a_norm."),
    (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
    (r"shared_experts\.w1\.", "shared_experts.gate_proj."), (r"shared_experts\.w2\.", "shared_experts.down_proj."),
    (r"shared_experts\.w3\.", "shared_experts.up_proj."),
]
_TOP_TO_OURS = {"embed.weight": "embed_tokens.weight", "embed_tokens.weight": "embed_tokens.weight",
                "head.weight": "lm_head.weight", "lm_head.weight": "lm_head.weight", "norm.weight": "norm.weight",
                "hc_head_fn": "hc_head.fn", "hc_head_base": "hc_head.base", "hc_head_scale": "hc_head.scale",
                "hc_head.hc_fn": "hc_head.fn", "hc_head.hc_base": "hc_head.base", "hc_head.hc_scale": "hc_head.scale"}


def _block_from_stored(rest: str) -> str:
    """Block-relative stored name (HF or original) -> ours."""
    for pattern, repl in _TO_HF:
        rest = re.sub(pattern, repl, rest)
    return re.sub(r"^(attn|ffn)_hc\.", lambda m: f"hc_{m.group(1)}.", rest)


def from_v4_state_dict(stored: dict[str, torch.Tensor], args: ModelArgs,
                       our_names: list[str]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Stored tensors (either layout, already dequantized) -> (our state-dict names, stored names that
    map to nothing). MTP tensors are matched against the names `to_v4_state_dict` writes for them."""
    import torch

    log.info("V4 checkpoint layout: %s names", detect_v4_layout(set(stored)))
    ours: dict[str, torch.Tensor] = {}
    leftover: list[str] = []
    per_expert: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    mtp_names = {_stored_name(n, True): n for n in our_names if n.startswith("mtp.")
                 and not re.search(r"\.mlp\.experts\.(gate_proj|up_proj|down_proj)$", n)}
    for key, t in stored.items():
        bare = key.removeprefix("model.")
        if bare in _TOP_TO_OURS:
            ours[_TOP_TO_OURS[bare]] = t
            continue
        mm = re.match(r"mtp\.(\d+)\.(.*)$", bare)
        if mm and bare in mtp_names:
            ours[mtp_names[bare]] = t
            continue
        lm = re.match(r"layers\.(\d+)\.(.*)$", bare)
        if mm:  # an MTP block tensor: the same names as a trunk block, under mtp.K.
            prefix, rest = f"mtp.{mm.group(1)}.block", mm.group(2)
        elif lm:
            prefix, rest = f"layers.{lm.group(1)}", lm.group(2)
        else:
            leftover.append(key)
            continue
        rest = _block_from_stored(rest)
        em = re.match(r"mlp\.experts\.(\d+)\.(w[123])\.weight$", rest)
        if em:
            kind = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}[em.group(2)]
            per_expert.setdefault(f"{prefix}.mlp.experts", {}).setdefault(kind, {})[int(em.group(1))] = t
        elif rest == "mlp.experts.gate_up_proj":
            ours[f"{prefix}.mlp.experts.gate_proj"], ours[f"{prefix}.mlp.experts.up_proj"] = t.chunk(2, dim=1)
        else:
            ours[f"{prefix}.{rest}"] = t
    for prefix, kinds in per_expert.items():
        for kind, per in kinds.items():
            ours[f"{prefix}.{kind}"] = torch.stack([per[e] for e in sorted(per)])
    known = set(our_names)
    leftover += [k for k in ours if k not in known]
    return {k: v for k, v in ours.items() if k in known}, leftover
