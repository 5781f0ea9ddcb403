"""opd.cacheDir: with no host memory for the teachers' hidden states (cacheBytes 0) they spill to cacheDir, not
to <checkpoint.dir>/teacher-cache, and the distillation is the same as with every state kept in memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.distill import cache as cache_module
from trex.trainer.hf import save_hf
from trex.trainer.loop import Trainer
from trex.trainer.model import build_model

MODEL = {"preset": "tiny", "overrides": {"numLayers": 1, "mtpDepth": 0, "maxSeqLen": 512}}


def _cfg(tmp: Path, teacher: Path, **opd: Any) -> TrainerConfig:
    prompts = tmp / "prompts.jsonl"
    tmp.mkdir(parents=True, exist_ok=True)
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "question": q, "answer": float(i), "family": "diet"}) + "\n"
                               for i, q in enumerate(["minimise the cost of a diet", "a diet with three foods"])))
    return load_section(TrainerConfig, {
        "mode": "opd", "model": MODEL, "maxSteps": 2, "deterministic": True,
        "optimizer": {"schedule": {"warmupSteps": 0}, "adamw": {"lr": 0.01}}, "data": {"train": str(prompts)},
        "opd": {"teachers": [{"path": str(teacher)}], "promptsPerStep": 2, "samplesPerPrompt": 1,
                "sampling": {"maxNewTokens": 8}, "chunkSize": 16, **opd},
        "checkpoint": {"dir": str(tmp / "ckpt"), "intervalSteps": 2, "exportHf": False},
    })


def test_cache_dir_receives_the_spilled_teacher_states(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    teacher = tmp_path / "teacher"
    save_hf(build_model(load_section(TrainerConfig, {"model": MODEL}).model, seed=7), teacher)
    spill = tmp_path / "spill"
    written: list[Path] = []
    real_save = cache_module.torch.save

    def save(obj: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(path, str | Path):
            written.append(Path(path))
        real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(cache_module.torch, "save", save)
    spilled = Trainer(_cfg(tmp_path / "a", teacher, cacheBytes=0, cacheDir=str(spill)), tmp_path / "a",
                      measure_peak=False, log=lambda _m: None).run()
    in_memory = Trainer(_cfg(tmp_path / "b", teacher), tmp_path / "b", measure_peak=False, log=lambda _m: None).run()
    spills = [p for p in written if p.suffix == ".pt" and p.parent.name.startswith("run-")]
    assert spills and all(p.parent.parent == spill for p in spills), written  # in cacheDir, one run folder
    assert not (tmp_path / "a" / "ckpt" / "teacher-cache").exists()
    assert [r.stats.cache_spilled_bytes > 0 for r in spilled.history if r.stats] == [True, True]
    assert [r.stats.cache_spilled_bytes for r in in_memory.history if r.stats] == [0, 0]
    assert [r.loss for r in spilled.history] == [r.loss for r in in_memory.history]  # spilling loses nothing
