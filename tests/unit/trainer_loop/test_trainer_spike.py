"""Spike detector against a numpy median/MAD reference; warm-up, cooldown; anticipatory ring buffer."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from trex.trainer.spike import AnticipatoryRouting, SpikeDetector, finite


def _reference_fires(losses: list[float], window: int, z: float, warmup: int, cooldown: int) -> list[int]:
    hist: list[float] = []
    fired: list[int] = []
    for step, loss in enumerate(losses):
        fire = False
        if step >= warmup and len(hist) >= 2 and (not fired or step - fired[-1] > cooldown):
            arr = np.array(hist[-window:])
            med = np.median(arr)
            scale = max(1.4826 * np.median(np.abs(arr - med)), 1e-3 * abs(med), 1e-8)
            fire = (loss - med) / scale > z
        if fire:
            fired.append(step)
        else:
            hist.append(loss)
    return fired


def test_detector_fires_on_spikes_only_after_warmup_and_cooldown() -> None:
    rng = np.random.default_rng(0)
    base = [float(5.0 * np.exp(-i / 200) + rng.normal(0, 0.02)) for i in range(300)]
    losses = list(base)
    for at, jump in ((10, 3.0), (120, 1.5), (125, 1.5), (200, 0.9)):
        losses[at] += jump
    det = SpikeDetector(window=30, z_threshold=6.0, warmup_steps=20, cooldown_steps=10)
    fired = [s for s, v in enumerate(losses) if det.observe(s, v)]
    assert fired == [120, 200]  # 10: warm-up; 125: cooldown
    assert fired == _reference_fires(losses, 30, 6.0, 20, 10)
    assert det.fired_total == 2
    quiet = SpikeDetector(window=30, z_threshold=6.0, warmup_steps=20, cooldown_steps=10)
    assert not any(quiet.observe(s, v) for s, v in enumerate(base))


def test_detector_state_round_trip() -> None:
    a = SpikeDetector(window=5, z_threshold=3.0, warmup_steps=2, cooldown_steps=1)
    seq = [1.0, 0.99, 0.98, 0.97, 5.0, 0.96, 0.95, 7.0, 0.9]
    for s, v in enumerate(seq[:5]):
        a.observe(s, v)
    b = SpikeDetector(window=5, z_threshold=3.0, warmup_steps=2, cooldown_steps=1)
    b.load_state_dict(a.state_dict())
    assert [a.observe(s, v) for s, v in enumerate(seq[5:], 5)] == [b.observe(s, v) for s, v in enumerate(seq[5:], 5)]


def test_finite_guard() -> None:
    assert finite(1.0, 2.0) and not finite(1.0, float("nan")) and not finite(float("inf"))


class _Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(4, 3))


def test_anticipatory_uses_weights_from_delta_steps_earlier() -> None:
    gates = {"layers.0.gate": _Gate(), "layers.1.gate": _Gate()}
    installed: list[dict[str, torch.Tensor] | None] = []
    ar = AnticipatoryRouting(lambda: list(gates.items()), installed.append, delta=2, window=3)
    seen: dict[int, dict[str, torch.Tensor]] = {}
    for step in range(10):
        ar.snapshot()
        seen[step] = {n: g.weight.detach().clone() for n, g in gates.items()}
        active = ar.prepare(step)
        if step == 4:
            ar.trigger(step)  # the loop triggers after the step that spiked
        assert active == (5 <= step <= 7)
        got = installed[-1]
        if 5 <= step <= 7:
            assert got is not None
            for n in gates:
                assert torch.equal(got[n], seen[step - 2][n])
        elif step > 7:
            assert got is None
        with torch.no_grad():
            for g in gates.values():
                g.weight.add_(1.0)  # the "optimizer step"
    state = ar.state_dict()
    ar2 = AnticipatoryRouting(lambda: list(gates.items()), installed.append, delta=2, window=3)
    ar2.load_state_dict(state)
    assert ar2.active_until == 7 and len(ar2.snapshots) == 3
    assert torch.equal(ar2.snapshots[0]["layers.0.gate"], seen[7]["layers.0.gate"])
