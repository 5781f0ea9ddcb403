"""Hugging Face export of a trained model: DeepSeek-V3 safetensors + tokenizer + chat template.

Evaluation (`EvalJob` with `trex-checkpoint`, or any transformers/vLLM server) loads this directory
with `AutoModelForCausalLM` / `AutoTokenizer`. The chat template (:mod:`trex.prompt_contract`) reproduces
the trainer's SFT packing exactly: `<|bos|>` then `<|role|>content<|end|>` per message; generation stops at `<|end|>`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from trex.fsio import atomic_write_bytes
from trex.prompt_contract import CHAT_TEMPLATE


def export_problem(model: Any) -> str | None:
    """Why ``model`` has no DeepSeek-V3 Hugging Face form (None when it has one)."""
    from trex.trainer.hf import check_hf_compatible

    try:
        check_hf_compatible(model.args)
    except ValueError as e:
        return str(e)
    return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_bytes(path, json.dumps(data, indent=2).encode())


def export_hf(model: Any, tokenizer: Any, directory: str | os.PathLike[str]) -> Path:
    """Write the export into ``directory`` atomically (built beside it, then renamed into place).

    ``tokenizer`` is the trainer's `tokenizers.Tokenizer` (with the trainer's special tokens).
    Raises ValueError naming the model field when the shape has no DeepSeek-V3 equivalent.
    """
    from trex.trainer.hf import save_hf

    problem = export_problem(model)
    if problem is not None:
        raise ValueError(problem)
    final = Path(directory)
    staging = final.with_name(final.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    save_hf(model, staging)
    tokenizer.save(str(staging / "tokenizer.json"))
    ids = {tok: tokenizer.token_to_id(tok) for tok in ("<|bos|>", "<|eos|>", "<|end|>", "<|pad|>")}
    _write_json(staging / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|end|>",
        "pad_token": "<|pad|>", "add_bos_token": False, "add_eos_token": False,
        "model_max_length": int(model.args.max_seq_len), "chat_template": CHAT_TEMPLATE,
    })
    _write_json(staging / "generation_config.json", {
        "bos_token_id": ids["<|bos|>"], "eos_token_id": [ids["<|end|>"], ids["<|eos|>"]],
        "pad_token_id": ids["<|pad|>"], "do_sample": False,
    })
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    staging.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final
