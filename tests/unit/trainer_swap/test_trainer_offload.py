"""trainer.activationOffload: under recompute full the block inputs go to host memory and come back for the
backward. Three training steps equal the run without offload bit for bit (MLA and a DeepSeek-V4 stack with
sliding, CSA and HCA layers, mHC, hash routing and MTP; fp32 and fp64); the block inputs are not among the
tensors autograd keeps after the forward; validate refuses the field without recompute full; the plan moves
the block inputs from the device activations to the step's host memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trex.config_base import format_validation_error, load_section
from trex.trainer.config import ModelConfig, RoutingConfig, TrainerConfig
from trex.trainer.mfu import DEVICES
from trex.trainer.model import build_model, compute_loss
from trex.trainer.model.model import blocks
from trex.trainer.parallel.offload import apply_activation_offload
from trex.trainer.parallel.recompute import apply_recompute
from trex.trainer.plan import plan_lifecycle, plan_memory
from trex.trainer.rules import job_problems
from trex_operator.api import TrainJob

MODELS: dict[str, dict[str, Any]] = {
    "mla": {"mtpDepth": 1, "nHashLayers": 1},
    "v4": {"attention": "csa", "hcMult": 2, "mtpDepth": 1, "nHashLayers": 1, "nDenseLayers": 1, "numLayers": 3,
           "qLoraRank": 16, "vHeadDim": 24, "layerTypes": ["sliding", "csa", "hca"]},
}
STEPS = 3


def _cfg(tmp: Path, overrides: dict[str, Any], dtype: str, offload: bool) -> TrainerConfig:
    return load_section(TrainerConfig, {
        "model": {"preset": "tiny", "dtype": dtype, "overrides": overrides}, "maxSteps": STEPS,
        "recompute": "full", "activationOffload": offload,
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 4},  # two micro-batches accumulate
        "optimizer": {"schedule": {"warmupSteps": 1}}, "stability": {"enabled": False},
        "checkpoint": {"dir": str(tmp / "ckpt"), "intervalSteps": 100, "exportHf": False},
    })


def _train(tmp: Path, overrides: dict[str, Any], dtype: str, offload: bool) -> tuple[list[float], dict[str, Any]]:
    from trex.trainer.loop import Trainer

    torch.manual_seed(0)
    tr = Trainer(_cfg(tmp, overrides, dtype, offload), tmp, measure_peak=False, log=lambda _m: None)
    losses = [tr.train_step().loss for _ in range(STEPS)]
    return losses, {n: p.detach().clone() for n, p in tr.model.named_parameters()}


@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_offload_trains_bit_identically(tmp_path: Path, model: str, dtype: str) -> None:
    torch.set_num_threads(1)
    losses, params = _train(tmp_path / "off", MODELS[model], dtype, False)
    got_losses, got_params = _train(tmp_path / "on", MODELS[model], dtype, True)
    assert got_losses == losses
    assert sorted(got_params) == sorted(params)
    for name, p in params.items():
        assert torch.equal(got_params[name], p), name
    want = torch.float64 if dtype == "fp64" else torch.float32
    assert all(p.dtype == want for p in params.values())


def _saved_after_forward(overrides: dict[str, Any], offload: bool) -> tuple[int, int, int, int]:
    """(blocks, block inputs among the tensors autograd keeps after the forward, host copies held after the
    forward, host copies held after the backward)."""
    model = build_model(load_section(ModelConfig, {"preset": "tiny", "overrides": overrides}), seed=0)
    apply_recompute(model, "full")
    off = apply_activation_offload(model, "full") if offload else None
    inputs: list[torch.Tensor] = []
    for b in blocks(model):
        b.register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t)
        return t

    ids = torch.randint(0, 512, (2, 33), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):  # sees what the offload's hooks leave
        out = model(ids[:, :-1], logits=False)
        loss, _ = compute_loss(out, ids[:, 1:], None, RoutingConfig(), 0)
    n_blocks = len(blocks(model))
    assert len(inputs) == n_blocks
    ptrs = {t.untyped_storage().data_ptr() for t in kept}
    in_kept = sum(x.untyped_storage().data_ptr() in ptrs for x in inputs)
    live = off.live if off is not None else 0
    loss.backward()
    del out, loss
    return n_blocks, in_kept, live, off.live if off is not None else 0


@pytest.mark.parametrize("model", sorted(MODELS))
def test_block_inputs_leave_the_saved_tensors(model: str) -> None:
    n_blocks, in_kept, live, _ = _saved_after_forward(MODELS[model], offload=False)
    assert in_kept == n_blocks and live == 0  # the probe sees every block input without offload
    n_blocks, in_kept, live, after = _saved_after_forward(MODELS[model], offload=True)
    assert in_kept == 0
    assert live == n_blocks  # one host copy per block (trunk and MTP)
    assert after == 0  # the backward released every host copy


def test_validate_refuses_offload_without_full_recompute() -> None:
    base = {"activationOffload": True, "recompute": "selective"}
    [(field, msg)] = job_problems(load_section(TrainerConfig, base), 1)
    assert field == "activationOffload" and "recompute: full" in msg and "\n" not in msg
    assert job_problems(load_section(TrainerConfig, {**base, "recompute": "full"}), 1) == []
    job = {"apiVersion": "trex.dev/v1alpha1", "kind": "TrainJob", "metadata": {"name": "j"},
           "spec": {"deviceType": "cpu", "trainer": {"activationOffload": True}}}
    with pytest.raises(Exception) as e:
        load_section(TrainJob, job)
    [line] = format_validation_error(e.value)  # type: ignore[arg-type]
    assert line.startswith("spec.trainer.activationOffload: needs recompute: full (got none)")
    model = build_model(load_section(ModelConfig, {"preset": "tiny"}), device="meta")
    with pytest.raises(ValueError, match=r"trainer\.activationOffload"):
        apply_activation_offload(model, "selective")


def test_plan_moves_block_inputs_to_host() -> None:
    def cfg(offload: bool) -> TrainerConfig:
        return load_section(TrainerConfig, {
            "model": {"preset": "tiny", "overrides": {"mtpDepth": 1}}, "recompute": "full",
            "activationOffload": offload, "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 2}})

    off, on = (plan_memory(cfg(o), 1, DEVICES["h200"]) for o in (False, True))
    # tiny: hidden 64, hc_mult 1, 2 layers + 1 MTP block; 2 x 32 tokens of fp32: 16 KiB per block input
    per_block = 64 * 4 * 2 * 32
    assert per_block == 16384
    assert on.offloaded == 3 * per_block and off.offloaded == 0
    assert off.activations - on.activations == (3 - 2) * per_block  # two of them stay in flight on the device
    step = {o: next(p for p in plan_lifecycle(cfg(o), 1, m).phases if p.name == "step")
            for o, m in ((False, off), (True, on))}
    assert step[True].host_bytes - step[False].host_bytes == 3 * per_block
