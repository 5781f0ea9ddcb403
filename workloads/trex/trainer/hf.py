"""Hugging Face safetensors import/export: DeepSeek-V3 (`mla`) and DeepSeek-V4 (`csa`, see trex.trainer.hf_v4).

Weights may be stored block-quantized (FP8 e4m3 128 x 128 or packed FP4 1 x 32, with `*_scale_inv`
siblings, see trex.trainer.model.quant); loading dequantizes them exactly, each rank reading only the slices
of the files its shards hold (trex.trainer.hfio).

On disk the DeepSeek-V3 layout is the one `DeepseekV3ForCausalLM` checkpoints use: `model.layers.N.self_attn.*`,
`model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight` (one tensor per expert),
`model.layers.N.mlp.gate.{weight,e_score_correction_bias}`, `model.layers.N.mlp.shared_experts.*`,
`model.norm.weight`, `lm_head.weight`. MTP modules are stored as extra layers `model.layers.{L+k}.*`
with DeepSeek-V3's names (enorm, hnorm, eh_proj, shared_head.norm); transformers ignores them.
Loading also accepts the stacked expert layout (`mlp.experts.gate_up_proj` [E, 2I, D], `down_proj`).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trex.fsio import atomic_write_bytes

if TYPE_CHECKING:
    import torch

    from trex.trainer.hfio.load import LoadStats
    from trex.trainer.model.args import ModelArgs
    from trex.trainer.model.model import DeepSeekModel

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def check_hf_compatible(args: ModelArgs) -> None:
    """Raise ValueError naming the first field the model's HF format (V3 for mla, V4 for csa) cannot represent."""
    if args.attention == "csa":
        from trex.trainer.hf_v4 import check_v4_compatible

        check_v4_compatible(args)
        return
    if args.attention != "mla":
        raise ValueError(f"attention={args.attention!r}: the DeepSeek-V3 HF format needs 'mla'")
    if args.scoring != "sigmoid":
        raise ValueError(f"scoring={args.scoring!r}: the DeepSeek-V3 HF format needs 'sigmoid'")
    if args.hc_mult != 1:
        raise ValueError(f"hc_mult={args.hc_mult}: the DeepSeek-V3 HF format has a plain residual (hc_mult 1)")
    if args.n_hash_layers:
        raise ValueError(f"n_hash_layers={args.n_hash_layers}: the DeepSeek-V3 HF format has no hash routing")
    if args.n_shared_experts < 1:
        raise ValueError("n_shared_experts=0: the DeepSeek-V3 HF format always has shared experts")


def hf_config_from_args(args: ModelArgs, dtype: str = "float32") -> dict[str, Any]:
    """config.json of a `DeepseekV3ForCausalLM` / `DeepseekV4ForCausalLM` with our shape. For V3,
    `swiglu_limit` is carried as an extra key that transformers ignores: a non-zero value clamps
    experts in our model only, so exporting one logs a warning."""
    check_hf_compatible(args)
    if args.attention == "csa":
        from trex.trainer.hf_v4 import hf_v4_config

        return hf_v4_config(args, dtype)
    if args.swiglu_limit > 0:
        log.warning("swiglu_limit=%s: DeepseekV3 in transformers has no SwiGLU clamp, so its logits differ "
                    "from trex's wherever an expert activation exceeds the limit", args.swiglu_limit)
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": args.vocab_size,
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "moe_intermediate_size": args.moe_intermediate_size,
        "num_hidden_layers": args.num_layers,
        "num_attention_heads": args.num_heads,
        "num_key_value_heads": args.num_heads,
        "n_shared_experts": args.n_shared_experts,
        "n_routed_experts": args.n_routed_experts,
        "num_experts_per_tok": args.experts_per_token,
        "routed_scaling_factor": args.routed_scaling_factor,
        "n_group": args.n_groups,
        "topk_group": args.topk_groups,
        "norm_topk_prob": args.norm_topk_prob,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "first_k_dense_replace": args.n_dense_layers,
        "kv_lora_rank": args.kv_lora_rank,
        "q_lora_rank": args.q_lora_rank if args.q_lora_rank > 0 else None,
        "qk_nope_head_dim": args.qk_nope_head_dim,
        "qk_rope_head_dim": args.qk_rope_head_dim,
        "v_head_dim": args.v_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": args.max_seq_len,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": args.rope_theta},
        "rope_interleave": args.rope_interleave,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": args.mtp_depth,
        "initializer_range": args.init_std,
        "torch_dtype": dtype,
        "swiglu_limit": args.swiglu_limit,
    }


def args_from_hf_config(cfg: dict[str, Any]) -> ModelArgs:
    """ModelArgs of a DeepSeek-V3 (sigmoid routing, mla, plain residual) or DeepSeek-V4 config.json."""
    from trex.trainer.model.args import ModelArgs

    if cfg.get("model_type") == "deepseek_v4":
        from trex.trainer.hf_v4 import args_from_v4_config

        return args_from_v4_config(cfg)
    if cfg.get("topk_method", "noaux_tc") != "noaux_tc":
        raise ValueError(f"config.json topk_method={cfg.get('topk_method')!r}: only 'noaux_tc' is supported")
    if cfg.get("scoring_func", "sigmoid") != "sigmoid":
        raise ValueError(f"config.json scoring_func={cfg.get('scoring_func')!r}: only 'sigmoid' is supported")
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
        raise ValueError("config.json: rope scaling (yarn) is not supported; only rope_type 'default'")
    try:
        return ModelArgs(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=int(cfg["num_attention_heads"]),
            attention="mla",
            q_lora_rank=int(cfg.get("q_lora_rank") or 0),
            kv_lora_rank=int(cfg["kv_lora_rank"]),
            qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
            qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
            v_head_dim=int(cfg["v_head_dim"]),
            intermediate_size=int(cfg["intermediate_size"]),
            moe_intermediate_size=int(cfg["moe_intermediate_size"]),
            n_dense_layers=int(cfg.get("first_k_dense_replace", 0)),
            n_routed_experts=int(cfg["n_routed_experts"]),
            n_shared_experts=int(cfg.get("n_shared_experts", 1)),
            experts_per_token=int(cfg["num_experts_per_tok"]),
            scoring="sigmoid",
            n_groups=int(cfg.get("n_group", 1)),
            topk_groups=int(cfg.get("topk_group", 1)),
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            n_hash_layers=0,
            swiglu_limit=float(cfg.get("swiglu_limit", 0.0)),
            hc_mult=1,
            mtp_depth=int(cfg.get("num_nextn_predict_layers", 0)),
            max_seq_len=int(cfg.get("max_position_embeddings", 4096)),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            rope_interleave=bool(cfg.get("rope_interleave", True)),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        )
    except KeyError as exc:
        raise ValueError(f"config.json lacks the field {exc.args[0]!r}") from exc


_MTP_RENAME = {"hnorm": "hnorm", "enorm": "enorm", "eh_proj": "eh_proj", "norm": "shared_head.norm"}


def to_hf_state_dict(model: DeepSeekModel, layout: str = "hf") -> dict[str, torch.Tensor]:
    """Our state dict under the HF names (V3: experts unstacked, views) or, for V4, ``layout`` 'hf' or
    'original' (DeepSeek's names)."""
    check_hf_compatible(model.args)
    if model.args.attention == "csa":
        from trex.trainer.hf_v4 import to_v4_state_dict

        return to_v4_state_dict(model.state_dict(), model.args, original=layout == "original")
    if layout != "hf":
        raise ValueError(f"layout={layout!r}: DeepSeek-V3 checkpoints are written with the HF names only")
    n_layers = model.args.num_layers
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            out[name] = t
            continue
        m = re.match(r"mtp\.(\d+)\.(.*)$", name)
        if m:
            layer = n_layers + int(m.group(1))
            rest = m.group(2)
            head = rest.split(".")[0]
            if head in _MTP_RENAME:
                rest = _MTP_RENAME[head] + rest[len(head):]
            elif rest.startswith("block."):
                rest = rest[len("block."):]
            name = f"layers.{layer}.{rest}"
        em = re.match(r"(layers\.\d+\.mlp\.experts)\.(gate_proj|up_proj|down_proj)$", name)
        if em:
            for e in range(t.shape[0]):
                out[f"model.{em.group(1)}.{e}.{em.group(2)}.weight"] = t[e]
            continue
        out[f"model.{name}"] = t
    for k in range(model.args.mtp_depth):
        out[f"model.layers.{n_layers + k}.embed_tokens.weight"] = model.embed_tokens.weight
        out[f"model.layers.{n_layers + k}.shared_head.head.weight"] = model.lm_head.weight
    return out


def from_hf_state_dict(model: DeepSeekModel, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map DeepSeek-V3 HF tensors onto our state-dict names (stacking per-expert tensors)."""
    import torch

    n_layers = model.args.num_layers
    ours: dict[str, torch.Tensor] = {}
    experts: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    rev_mtp = {v: k for k, v in _MTP_RENAME.items()}
    for name, t in hf.items():
        if name == "lm_head.weight":
            ours[name] = t
            continue
        if not name.startswith("model."):
            raise ValueError(f"unexpected tensor {name!r} in the HF checkpoint")
        name = name[len("model."):]
        lm = re.match(r"layers\.(\d+)\.(.*)$", name)
        if lm and int(lm.group(1)) >= n_layers:
            k = int(lm.group(1)) - n_layers
            if k >= model.args.mtp_depth:
                continue
            rest = lm.group(2)
            if rest.startswith(("embed_tokens.", "shared_head.head.")):
                continue
            for hf_head, our_head in rev_mtp.items():
                if rest == f"{hf_head}.weight" or rest.startswith(f"{hf_head}."):
                    rest = our_head + rest[len(hf_head):]
                    break
            else:
                rest = f"block.{rest}"
            name = f"mtp.{k}.{rest}"
        em = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", name)
        if em:
            experts.setdefault((em.group(1), em.group(3)), {})[int(em.group(2))] = t
            continue
        sm = re.match(r"(.*\.mlp\.experts)\.gate_up_proj$", name)
        if sm:
            gate, up = t.chunk(2, dim=1)
            ours[f"{sm.group(1)}.gate_proj"] = gate
            ours[f"{sm.group(1)}.up_proj"] = up
            continue
        ours[name] = t
    for (prefix, kind), per in experts.items():
        ours[f"{prefix}.{kind}"] = torch.stack([per[e] for e in sorted(per)])
    return ours


QUANT_MODES = ("none", "fp8", "fp8-fp4")


def save_hf(model: DeepSeekModel, directory: str | os.PathLike[str], max_shard_bytes: int = 5 * 1024**3,
            layout: str = "hf", quant: str = "none") -> Path:
    """Write config.json and safetensors shards (index file when more than one) atomically.

    ``layout``: 'hf' or (V4) 'original' names. ``quant``: 'fp8' stores GEMM weights as block FP8,
    'fp8-fp4' additionally the routed experts as packed FP4 (V4's release format)."""
    from safetensors.torch import save

    from trex.trainer.quant_io import quantization_config, quantize_tensors

    if quant not in QUANT_MODES:
        raise ValueError(f"quant={quant!r}: allowed {', '.join(QUANT_MODES)}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = to_hf_state_dict(model, layout=layout)
    if quant != "none":
        tensors = quantize_tensors(tensors, fp4_experts=quant == "fp8-fp4")
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous().clone()
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        atomic_write_bytes(out / SINGLE_FILE, save(shards[0], metadata={"format": "pt"}))
    else:
        weight_map: dict[str, str] = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            atomic_write_bytes(out / fname, save(shard, metadata={"format": "pt"}))
            weight_map.update(dict.fromkeys(shard, fname))
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
                 "weight_map": weight_map}
        atomic_write_bytes(out / INDEX_FILE, json.dumps(index, indent=2).encode())
    cfg = hf_config_from_args(model.args, dtype=dtype)
    if quant != "none":
        cfg["quantization_config"] = quantization_config(fp4_experts=quant == "fp8-fp4")
    atomic_write_bytes(out / CONFIG_NAME, json.dumps(cfg, indent=2).encode())
    return out


def load_hf_into(model: DeepSeekModel, directory: str | os.PathLike[str]) -> LoadStats:
    """Copy a DeepSeek-V3 or -V4 checkpoint (HF or, for V4, original names; quantized or not) into
    ``model`` (shapes must match; missing keys are an error), reading each tensor by slices
    (trex.trainer.hfio.load: in one process the slice is the whole tensor). Returns what was read."""
    from trex.trainer.hfio.load import load_sliced

    check_hf_compatible(model.args)
    stats = load_sliced(model, directory, model_state_from_stored)
    for _, gate in model.moe_gates():
        gate.e_score_correction_bias.data = gate.e_score_correction_bias.data.float()
    return stats


def load_hf_sharded(model: DeepSeekModel, directory: str | os.PathLike[str]) -> LoadStats:
    """load_hf_into for a distributed model: each rank reads from the safetensors files only the boxes of its own
    shards (FP8/FP4 blocks dequantized per box) and copies them into its local tensors in place."""
    from trex.trainer.hfio.load import load_sliced

    check_hf_compatible(model.args)
    return load_sliced(model, directory, model_state_from_stored)


def model_state_from_stored(model: DeepSeekModel, stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Stored tensors (V3 HF names; V4 HF or original names) renamed and stacked to ``model``'s names; a V4
    checkpoint tensor the model lacks is an error naming it."""
    if model.args.attention == "csa":
        from trex.trainer.hf_v4 import from_v4_state_dict

        ours, extra = from_v4_state_dict(stored, model.args, list(model.state_dict()))
        if extra:
            raise ValueError(f"V4 checkpoint has tensors the model lacks: {sorted(extra)[:5]}")
        return ours
    return from_hf_state_dict(model, stored)


def args_from_hf_dir(directory: str | os.PathLike[str]) -> ModelArgs:
    """ModelArgs of a checkpoint folder's config.json (V3 or V4, by model_type)."""
    return args_from_hf_config(json.loads((Path(directory) / CONFIG_NAME).read_text()))


def load_hf(directory: str | os.PathLike[str], device: str | None = None,
            dtype: torch.dtype | None = None) -> DeepSeekModel:
    """Build a model from config.json and load its safetensors."""
    import torch

    from trex.trainer.model.model import build_model_from_args

    args = args_from_hf_dir(directory)
    model = build_model_from_args(args, device=device, dtype=dtype or torch.float32)
    load_hf_into(model, directory)
    return model
