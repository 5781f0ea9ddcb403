"""`trex train` with mode opd: the Trainer distills the tiny preset toward a teacher folder (another seed)
on its own samples of data.train's prompts (ORData's prompts rendering, as mode grpo reads it); the KL
falls, the step logs its distillation metrics, a resumed run is bit-identical to an uninterrupted one,
teachers pick their prompts by family, and bad teachers are refused by field."""

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

MODEL = {"preset": "tiny", "overrides": {"numLayers": 1, "mtpDepth": 0, "maxSeqLen": 512}}
PROMPTS = [("diet", "minimise the cost of a diet"), ("diet", "a diet with three foods"),
           ("knapsack", "pack items of value"), ("knapsack", "the optimal value is")]


def _teacher(tmp: Path, seed: int = 7) -> Path:
    cfg = load_section(TrainerConfig, {"model": MODEL})
    save_hf(build_model(cfg.model, seed=seed), tmp / "teacher")
    return tmp / "teacher"


def _cfg(tmp: Path, teacher: Path, **opd: Any) -> TrainerConfig:
    prompts = tmp / "prompts.jsonl"
    tmp.mkdir(parents=True, exist_ok=True)
    if not prompts.exists():
        prompts.write_text("".join(json.dumps({"id": f"p{i}", "question": q, "answer": float(i), "family": f}) + "\n"
                                   for i, (f, q) in enumerate(PROMPTS)))
    return load_section(TrainerConfig, {
        "mode": "opd", "model": MODEL, "maxSteps": 6, "deterministic": True,
        "optimizer": {"schedule": {"warmupSteps": 0}, "adamw": {"lr": 0.01}},
        "data": {"train": str(prompts)},
        "opd": {"teachers": [{"path": str(teacher)}], "promptsPerStep": 2,
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
    assert len(kls) == 6 and all(r.stats is not None for r in res.history)
    first, last = sum(kls[:2]) / 2, sum(kls[-2:]) / 2
    assert last < first, kls
    rec = res.history[-1].stats
    assert rec is not None and set(rec.kl) == {str(teacher)} and rec.cache_hit_bytes > 0
    assert rec.teacher_switches == 0 and rec.entropy > 0
    assert [r.stats.teacher_loads for r in res.history if r.stats] == [1, 0, 0, 0, 0, 0]  # lazily, once
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


def test_teachers_pick_prompts_by_family_and_bad_teachers_are_refused_by_field(tmp_path: Path) -> None:
    teacher = _teacher(tmp_path)
    other = tmp_path / "other"
    save_hf(build_model(load_section(TrainerConfig, {"model": MODEL}).model, seed=8), other)
    cfg = _cfg(tmp_path / "f", teacher, teachers=[{"path": str(teacher), "items": "diet"},
                                                  {"path": str(other), "items": "p[23]", "weight": 0.5}])
    tr = Trainer(cfg, tmp_path / "f", measure_peak=False, log=lambda _m: None)
    assert tr.objective.run is not None and tr.objective.run.teachers == [[str(teacher)], [str(teacher)], [str(other)], [str(other)]]
    rec = tr.train_step()
    assert rec.stats is not None and set(rec.stats.kl) <= {str(teacher), str(other)}
    with pytest.raises(ConfigProblem, match=r"opd\.teachers: prompt 'p2' matches no teacher"):
        Trainer(_cfg(tmp_path / "n", teacher, teachers=[{"path": str(teacher), "items": "diet"}]), tmp_path / "n",
                measure_peak=False, log=lambda _m: None)
    with pytest.raises(ConfigProblem, match=r"opd\.teachers\.0\.name: 'sft': a TrainJob teacher gets its path"):
        Trainer(_cfg(tmp_path / "t", teacher, teachers=[{"name": "sft"}]), tmp_path / "t", measure_peak=False,
                log=lambda _m: None)
    with pytest.raises(ConfigProblem, match=r"opd\.teachers\.0\.path: teacher .*: not a directory"):
        Trainer(_cfg(tmp_path / "m", tmp_path / "missing"), tmp_path / "m", measure_peak=False, log=lambda _m: None)
    other = load_section(TrainerConfig, {"model": {**MODEL, "overrides": {**MODEL["overrides"], "vocabSize": 300}}})  # type: ignore[dict-item]
    save_hf(build_model(other.model, seed=1), tmp_path / "small-vocab")
    with pytest.raises(ConfigProblem, match=r"opd\.teachers\.0\.path: the teacher's vocabulary is 300"):
        Trainer(_cfg(tmp_path / "v", tmp_path / "small-vocab"), tmp_path / "v", measure_peak=False, log=lambda _m: None)
