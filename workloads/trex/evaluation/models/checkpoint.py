"""A TrainJob checkpoint, evaluated through its Hugging Face safetensors export.

The trainer's native checkpoints are torch.distributed.checkpoint shards (``step-N/`` with a
manifest); generation needs the model as a Hugging Face directory (config.json, *.safetensors,
tokenizer files), which is what the trainer's export writes. This module finds that export in the
given directory (the directory itself, ``hf/``, ``export/``, ``hf_export/`` or the newest
``step-N/hf``) and hands it to :class:`TransformersModel`. A checkpoint root with DCP shards only
is rejected with a message saying so.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from trex.evaluation.models.transformers_model import TransformersModel

_STEP = re.compile(r"^step-(\d+)$")


def _is_hf_dir(p: Path) -> bool:
    return (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def find_hf_export(root: str | Path) -> Path:
    """The Hugging Face export inside a TrainJob checkpoint directory; ValueError when there is none."""
    r = Path(root)
    if not r.is_dir():
        raise ValueError(f"checkpoint path {str(root)!r} is not a directory")
    candidates = [r, r / "hf", r / "export", r / "hf_export"]
    steps = sorted((int(m.group(1)), d) for d in r.iterdir() if d.is_dir() and (m := _STEP.match(d.name)))
    for _, d in reversed(steps):
        candidates += [d / "hf", d / "export", d]
    for c in candidates:
        if _is_hf_dir(c):
            return c
    if steps:
        raise ValueError(f"checkpoint {str(root)!r} has DCP shards ({steps[-1][1].name}) but no Hugging Face "
                         "export (config.json + *.safetensors); export it with the trainer first")
    raise ValueError(f"no Hugging Face export (config.json + *.safetensors) under {str(root)!r}")


def load_checkpoint_model(root: str | Path, **kwargs: Any) -> TransformersModel:
    """TransformersModel over the checkpoint's export, named after the checkpoint."""
    export = find_hf_export(root)
    return TransformersModel(export, name=f"trex-checkpoint:{Path(root).name}", **kwargs)
