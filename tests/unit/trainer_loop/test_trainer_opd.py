"""`trex train` with mode opd: the Trainer distills the tiny preset toward a teacher folder (another seed)
on its own samples of a prompt file; the KL falls, the step logs its distillation metrics, a resumed run
is bit-identical to an uninterrupted one, and bad prompt files and teachers are refused by field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.hf import save_hf
from trex.trainer.loop import ConfigProblem, Trainer
from trex.trainer.model import build_model

MODEL = {"preset": "tiny", "overrides": {"numLayers": 1, "mtpDepth": 0, "maxSeqLen": 128}}
PROMPTS = ["the solver found", "minimise the cost of", "a linear program with", "the optimal value is"]


def _teacher(tmp: Path, seed: int = 7) -> Path:
    cfg = load_section(TrainerConfig, {"model": MODEL})
    save_hf(build_model(cfg.model, seed=seed), tmp / "teacher")
    return tmp / "teacher"


def _cfg(tmp: Path, teacher: Path, **opd: Any) -> TrainerConfig:
    prompts = tmp / "prompts.jsonl"
    tmp.mkdir(parents=True, exist_ok=True)
    if not prompts.exists():
        prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return load_section(TrainerConfig, {
        "mode": "opd", "model": MODEL, "maxSteps": 6, "deterministic": True,
        "optimizer": {"schedule": {"warmupSteps": 0}, "adamw": {"lr": 0.01}},
        "opd": {"teachers": [{"path": str(teacher)}], "prompts": str(prompts), "promptsPerStep": 2,
                "samplesPerPrompt": 2, "sampling": {"maxNewTokens": 8}, "chunkSize": 16, **opd},
        "checkpoint": {"dir": str(tmp / "ckpt"), "intervalSteps": 3, "exportHf": False},
    })


def _params(tr: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tr.model.state_dict().items()}


def test_trainer_distills_logs_and_resumes_bit_identically(tmp_path: Path) -> None:
    teacher = _teacher(tmp_path)
    ref = Trainer(_cfg(tmp_path / "a", teacher), tmp_path / "a", measure_peak=False, log=lambda _m: None)
    res = ref.run()
    kls = [r.loss for r in res.history]
    assert len(kls) == 6 and all(r.opd is not None for r in res.history)
    first, last = sum(kls[:2]) / 2, sum(kls[-2:]) / 2
    assert last < first, kls
    rec = res.history[-1].opd
    assert rec is not None and set(rec.kl) == {str(teacher)} and rec.cache_hit_bytes > 0
    assert rec.teacher_switches == 0 and rec.entropy > 0
    assert [r.opd.teacher_loads for r in res.history if r.opd] == [1, 0, 0, 0, 0, 0]  # lazily, once
    line = json.loads((tmp_path / "a" / "ckpt" / "metrics.jsonl").read_text().splitlines()[-1])
    assert line[f"opd_kl_{teacher}"] == pytest.approx(rec.kl[str(teacher)])
    assert {"opd_entropy", "opd_rollout_seconds", "opd_teacher_seconds", "opd_student_seconds"} <= set(line)

    cfg = _cfg(tmp_path / "b", teacher)
    Trainer(cfg, tmp_path / "b", measure_peak=False, log=lambda _m: None).run(3)
    resumed = Trainer(cfg, tmp_path / "b", measure_peak=False, log=lambda _m: None)
    rest = resumed.run()
    assert [r.loss for r in rest.history] == kls[3:]
    want, got = _params(ref), _params(resumed)
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_bad_prompt_files_and_teachers_are_refused_by_field(tmp_path: Path) -> None:
    teacher = _teacher(tmp_path)
    with pytest.raises(ConfigProblem, match=r"opd\.prompts: .*line 2: expected"):
        cfg = _cfg(tmp_path / "p", teacher)
        Path(str(cfg.opd.prompts)).write_text('{"prompt": "ok"}\n{"text": "no"}\n')
        Trainer(cfg, tmp_path / "p", measure_peak=False, log=lambda _m: None)
    with pytest.raises(ConfigProblem, match=r"opd\.teachers\.0\.path: teacher .*: not a directory"):
        Trainer(_cfg(tmp_path / "m", tmp_path / "missing"), tmp_path / "m", measure_peak=False, log=lambda _m: None)
    other = load_section(TrainerConfig, {"model": {**MODEL, "overrides": {**MODEL["overrides"], "vocabSize": 300}}})  # type: ignore[dict-item]
    save_hf(build_model(other.model, seed=1), tmp_path / "small-vocab")
    with pytest.raises(ConfigProblem, match=r"opd\.teachers\.0\.path: the teacher's vocabulary is 300"):
        Trainer(_cfg(tmp_path / "v", tmp_path / "small-vocab"), tmp_path / "v", measure_peak=False, log=lambda _m: None)
