"""Where a teacher's weights are: the Hugging Face folder a teacher path names (torch-free, so the config rules
can check teacher paths without loading the trainer)."""

from __future__ import annotations

from pathlib import Path

CONFIG_NAME = "config.json"
MANIFEST = "manifest.json"


def resolve_teacher_dir(path: str | Path) -> Path:
    """The Hugging Face folder a teacher path names: the folder itself (config.json), its ``hf`` export, or
    for a trex checkpoint folder the newest step whose manifest is written and which holds an export."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"teacher {root}: not a directory")
    if root.name.startswith("step-") and not (root / MANIFEST).is_file():
        raise FileNotFoundError(f"teacher {root}: the checkpoint is incomplete (no {MANIFEST})")
    for cand in (root, root / "hf"):
        if (cand / CONFIG_NAME).is_file():
            return cand
    steps = sorted((p for p in root.glob("step-*") if p.is_dir() and (p / MANIFEST).is_file()), reverse=True)
    for step in steps:
        if (step / "hf" / CONFIG_NAME).is_file():
            return step / "hf"
    raise FileNotFoundError(f"teacher {root}: no Hugging Face export (config.json) in the folder, its hf/ or a "
                            "completed step-N/hf (run the teacher with checkpoint.exportHfEvery)")
