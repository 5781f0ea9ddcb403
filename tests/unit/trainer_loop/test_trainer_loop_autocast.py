"""Opt-in bf16 autocast: the same run as fp32 to bf16 accuracy, with fp32 parameters, gradients and optimizer states."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer


def _cfg(tmp: Path, autocast: str | None) -> TrainerConfig:
    model: dict[str, Any] = {"preset": "tiny"}
    if autocast is not None:
        model["autocast"] = autocast
    return load_section(TrainerConfig, {
        "model": model, "device": "cpu", "maxSteps": 4,
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 4},
        "checkpoint": {"dir": str(tmp / "ckpt"), "intervalSteps": 100}, "stability": {"enabled": False},
    })


def test_autocast_is_off_by_default(tmp_path: Path) -> None:
    assert _cfg(tmp_path, None).model.autocast == "off"


def test_bf16_autocast_tracks_fp32_run(tmp_path: Path) -> None:
    ref = Trainer(_cfg(tmp_path / "a", "off"), tmp_path / "a", measure_peak=False, log=lambda _m: None)
    mixed = Trainer(_cfg(tmp_path / "b", "bf16"), tmp_path / "b", measure_peak=False, log=lambda _m: None)
    start = [p.detach().clone() for p in ref.model.parameters()]
    for step in range(3):
        r, m = ref.train_step(), mixed.train_step()
        assert abs(m.loss - r.loss) <= 2e-2 * abs(r.loss), (step, m.loss, r.loss)
        assert abs(m.grad_norm - r.grad_norm) <= 0.1 * r.grad_norm, (step, m.grad_norm, r.grad_norm)
        if step == 0:
            assert m.loss != r.loss  # the bf16 path really ran
    moved_mixed, moved_ref = [], []
    for (name, p), q, p0 in zip(mixed.model.named_parameters(), ref.model.parameters(), start, strict=True):
        assert p.dtype == torch.float32, name
        moved_mixed.append((p.detach() - p0).reshape(-1))
        moved_ref.append((q.detach() - p0).reshape(-1))
    # Muon orthogonalises every update, so compare the whole three-step move by direction and size.
    a, b = torch.cat(moved_mixed).double(), torch.cat(moved_ref).double()
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) > 0.95
    assert abs(float(a.norm() / b.norm()) - 1) < 0.05
    states = [s for o in mixed.opts.all() for s in o.state.values()]
    assert states and all(t.dtype == torch.float32 for s in states for t in s.values() if torch.is_tensor(t)
                          and t.is_floating_point())


def test_autocast_rejects_unknown_value(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="autocast"):
        _cfg(tmp_path, "fp16")
