"""Hugging Face export of a trained model: DeepSeek-V3 (mla) or DeepSeek-V4 (csa) safetensors + tokenizer +
chat template.

Evaluation (`EvalJob` with `trex-checkpoint`, or any transformers/vLLM server) loads this directory
with `AutoModelForCausalLM` / `AutoTokenizer`. The chat template (:mod:`trex.prompt_contract`) reproduces
the trainer's SFT packing exactly: `<|bos|>` then `<|role|>content<|end|>` per message; generation stops at `<|end|>`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trex.fsio import atomic_write_bytes
from trex.prompt_contract import BOS, CHAT_TEMPLATE, END, EOS, PAD


def export_problem(model: Any) -> str | None:
    """Why ``model`` has no transformers (DeepseekV3 / DeepseekV4) form (None when it has one)."""
    from trex.trainer.hf import check_hf_compatible

    try:
        check_hf_compatible(model.args)
    except ValueError as e:
        return str(e)
    return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_bytes(path, json.dumps(data, indent=2).encode())


def save_tokenizer(tokenizer: Any, directory: Path, max_len: int) -> None:
    """tokenizer.json, tokenizer_config.json (with the prompt contract's chat template) and
    generation_config.json (greedy, stop at <|end|> or <|eos|>) into ``directory``."""
    tokenizer.save(str(directory / "tokenizer.json"))
    ids = {tok: tokenizer.token_to_id(tok) for tok in (BOS, EOS, END, PAD)}
    _write_json(directory / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": END,
        "pad_token": PAD, "add_bos_token": False, "add_eos_token": False,
        "model_max_length": max_len, "chat_template": CHAT_TEMPLATE,
    })
    _write_json(directory / "generation_config.json", {
        "bos_token_id": ids[BOS], "eos_token_id": [ids[END], ids[EOS]],
        "pad_token_id": ids[PAD], "do_sample": False,
    })


def export_hf(model: Any, tokenizer: Any, directory: str | os.PathLike[str], quant: str = "none",
              dtypes: Mapping[str, Any] | None = None) -> Path:
    """Write the export into ``directory`` atomically (built beside it, then renamed into place).

    Collective when torch.distributed is initialised: every rank calls it with its part of the model (a
    distributed model's DTensor shards, or the whole plain model) and writes the tensors it owns
    (trex.trainer.hf_export); rank 0 writes the index, config, tokenizer and renames. ``tokenizer`` is the
    trainer's `tokenizers.Tokenizer` (with the trainer's special tokens). ``quant``: none (the model dtype),
    fp8 or fp8-fp4 (checkpoint.exportQuant). ``dtypes``: the stored dtype per state-dict name (default: each
    tensor's own). Raises ValueError naming the model field when the shape has no transformers equivalent.
    """
    import torch.distributed as dist

    from trex.trainer.hf_export import save_hf_distributed

    problem = export_problem(model)
    if problem is not None:
        raise ValueError(problem)
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    rank = dist.get_rank() if distributed else 0
    final = Path(directory)
    staging = final.with_name(final.name + ".partial")
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    if distributed:
        dist.barrier()
    state = model.state_dict()
    save_hf_distributed(state, model.args, staging, dtypes or {k: v.dtype for k, v in state.items()}, quant=quant)
    if distributed:
        dist.barrier()
    if rank == 0:
        save_tokenizer(tokenizer, staging, int(model.args.max_seq_len))
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            final.rename(old)
        staging.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    if distributed:
        dist.barrier()
    return final


def export_trainer(trainer: Any, directory: str | os.PathLike[str]) -> Path:
    """export_hf of a Trainer's model on every rank (collective): each rank writes from its own shards, in
    the model dtype (fp32 masters cast as a plain model would hold them), quantised as checkpoint.exportQuant."""
    with trainer.opts.masters_on_device():  # the shards are read (and sent) on the device
        return export_hf(trainer.model, trainer.tokenizer, directory, quant=trainer.cfg.checkpoint.export_quant,
                         dtypes=export_dtypes(trainer))


def export_dtypes(trainer: Any) -> dict[str, Any] | None:
    """The stored dtype per state-dict name of a Trainer's export: the model dtype's (fp32 masters cast as a plain
    model would hold them) when the model is distributed, None (each tensor's own) when it is plain."""
    from trex.runtime.device import torch_dtype
    from trex.trainer.model import build_model

    if trainer.meshes is None:
        return None
    cfg = trainer.cfg
    plain = build_model(cfg.model, device="meta", dtype=torch_dtype(cfg.model.dtype), seed=cfg.seed)
    return {k: v.dtype for k, v in plain.state_dict().items()}


def staged_export(trainer: Any, staging: Path) -> Callable[[Path], None]:
    """Write the trainer's export into ``staging`` now (every rank, collective) and return the checkpoint's
    before-commit hook (rank 0) that moves it into the step being committed (``<step>/hf``)."""
    export_trainer(trainer, staging)

    def move(step_dir: Path) -> None:
        staging.rename(step_dir / "hf")

    return move
