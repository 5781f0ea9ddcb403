"""optimizer.muon.enabled: false (AdamW for every parameter) against torch.optim.AdamW on the same model and data,
with and without the swap optimizer, and the memory plan's optimizer-state bytes against a real run."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from trex.config_base import load_section
from trex.trainer.config import SwapConfig, TrainerConfig
from trex.trainer.mfu import DEVICES
from trex.trainer.optim.build import Optimizers, build_optimizers, schedule_factor
from trex.trainer.optim.swap import SwapOptimizers, with_swap
from trex.trainer.plan import measured_state_bytes, plan_memory

STEPS = 4


def _cfg(tmp: Path, muon: bool = False, **over: Any) -> TrainerConfig:
    data: dict[str, Any] = {
        "model": {"preset": "tiny", "dtype": "fp64", "overrides": {"numLayers": 2, "nDenseLayers": 1}},
        "maxSteps": STEPS, "data": {"seqLen": 16, "microBatchSize": 2, "globalBatchSize": 2},
        "optimizer": {"muon": {"enabled": muon}, "adamw": {"eps": 1e-8}, "schedule": {"warmupSteps": 2}},
        "stability": {"enabled": False}, "checkpoint": {"dir": str(tmp), "intervalSteps": 100},
    }
    data.update(over)
    return load_section(TrainerConfig, data)


def _loss(model: torch.nn.Module, ids: torch.Tensor, cfg: TrainerConfig) -> torch.Tensor:
    from trex.trainer.model import compute_loss

    out = model(ids[:, :-1], None, torch.zeros_like(ids[:, :-1]), logits=False)
    total, _ = compute_loss(out, ids[:, 1:], None, cfg.routing, 0)
    return total


@pytest.mark.parametrize("swap", [False, True])
def test_adamw_only_equals_torch_adamw(tmp_path: Path, swap: bool) -> None:
    from trex.trainer.model import build_model

    cfg = _cfg(tmp_path)
    model = build_model(cfg.model, dtype=torch.float64, seed=3)
    ref = copy.deepcopy(model)
    opts: Optimizers = build_optimizers(model, dict(model.param_roles()), cfg.optimizer)
    assert opts.muon is None and opts.adamw is not None
    assert [id(p) for g in opts.adamw.param_groups for p in g["params"]] == [id(p) for p in model.parameters()]
    gemms = [n for n, role in model.param_roles().items() if role == "muon"]  # what Muon takes when enabled
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    if swap:  # small buckets: several per step
        opts = with_swap(opts, SwapConfig(enabled=True, buffers=2), "cpu", bucket_bytes=64 << 10, model=model)
        assert isinstance(opts, SwapOptimizers) and len(opts.buckets) > 1
    a = cfg.optimizer.adamw
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=a.lr, betas=(a.betas[0], a.betas[1]), eps=a.eps,
                                weight_decay=a.weight_decay)
    gen = torch.Generator().manual_seed(0)
    for step in range(STEPS):
        ids = torch.randint(0, 512, (2, 17), generator=gen)
        factor = schedule_factor(cfg.optimizer, step, STEPS)
        opts.set_lr_factor(factor)
        for g in ref_opt.param_groups:
            g["lr"] = a.lr * factor
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
            _loss(m, ids, cfg).backward()
        opts.step()
        ref_opt.step()
    got, want = dict(model.named_parameters()), dict(ref.named_parameters())
    for name, p in want.items():
        torch.testing.assert_close(got[name], p, atol=1e-12, rtol=0, msg=name)
    assert sum(not torch.equal(got[n], start[n]) for n in gemms) > len(gemms) // 2  # AdamW stepped them


def test_adamw_only_plan_equals_the_state_a_run_holds(tmp_path: Path) -> None:
    from trex.trainer.loop import Trainer

    cfg = _cfg(tmp_path, model={"preset": "tiny", "dtype": "fp32", "overrides": {"numLayers": 2, "nDenseLayers": 1}})
    tr = Trainer(cfg, tmp_path, measure_peak=False, log=lambda _m: None)
    tr.train_step()
    tr.opts.zero_grad = lambda: None  # type: ignore[method-assign]  # keep the second step's gradients
    tr.train_step()
    got = measured_state_bytes(tr.model, tr.opts)
    n_bytes = sum(p.numel() * p.element_size() for p in tr.model.parameters() if p.requires_grad)
    assert got["muon_state"] == 0 and got["adamw_state"] == 2 * n_bytes  # exp_avg and exp_avg_sq of every weight
    plan = plan_memory(cfg, 1, DEVICES["cpu"])
    assert (plan.muon_state, plan.adamw_state, plan.params) == (0, 2 * n_bytes, n_bytes)
    with_muon = plan_memory(_cfg(tmp_path, muon=True, model=cfg.model.model_dump(by_alias=True)), 1, DEVICES["cpu"])
    assert with_muon.muon_state > 0 and with_muon.muon_state + with_muon.adamw_state < plan.adamw_state
