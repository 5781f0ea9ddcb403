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


def export_hf(model: Any, tokenizer: Any, directory: str | os.PathLike[str]) -> Path:
    """Write the export into ``directory`` atomically (built beside it, then renamed into place).

    ``tokenizer`` is the trainer's `tokenizers.Tokenizer` (with the trainer's special tokens).
    Raises ValueError naming the model field when the shape has no transformers equivalent.
    """
    from trex.trainer.hf import save_hf

    problem = export_problem(model)
    if problem is not None:
        raise ValueError(problem)
    final = Path(directory)
    staging = final.with_name(final.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    save_hf(model, staging)
    save_tokenizer(tokenizer, staging, int(model.args.max_seq_len))
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    staging.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final
