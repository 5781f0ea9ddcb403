"""Tuned cpu-c kernels inside the trainer: used (calls counted), training with them equals training without them
within the kernels' tolerance over 20 steps, a wrong kernel is refused at load, and the shape classes the
registry is built for are the ones the trainer really calls."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from trex.config_base import load_section
from trex.kernels import registry as reg
from trex.kernels.backends.cpu_c import CpuCBackend
from trex.kernels.suite import SUITE
from trex.trainer import kernels as tk
from trex.trainer.config import TrainerConfig, resolved_model_values
from trex.trainer.loop import Trainer
from trex.trainer.model import layers

STEPS = 20


def _cfg(tmp: Path, registry: Path | None, dense: bool = False) -> TrainerConfig:
    """The tiny preset; ``dense`` makes every layer a dense SwiGLU MLP (no top-k routing, whose near ties would
    turn 1e-7 differences into different expert choices and make the 20-step comparison chaotic)."""
    model: dict[str, Any] = {"preset": "tiny"}
    if dense:
        model["overrides"] = {"nDenseLayers": 2, "mtpDepth": 0}
    data: dict[str, Any] = {
        "model": model, "maxSteps": STEPS,
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 2},
        # A fifth of the default LRs: the loss still falls (6.28 -> 5.80 in 20 steps), and Muon's orthogonalised
        # updates do not amplify the kernels' rounding into a chaotic trajectory (at the default LRs the 20-step
        # losses drift 1e-3 apart for one initial-weights draw and 5e-4 for another).
        "optimizer": {"schedule": {"warmupSteps": 2}, "muon": {"lr": 0.004}, "adamw": {"lr": 0.0004}},
        "checkpoint": {"dir": str(tmp / "ckpt"), "intervalSteps": 1000, "resume": False},
        "deterministic": True,
    }
    if registry is not None:
        data["kernels"] = {"registry": str(registry)}
    return load_section(TrainerConfig, data)


def _shapes(cfg: TrainerConfig) -> list[tuple[str, dict[str, int]]]:
    return tk.trainer_kernel_shapes(resolved_model_values(cfg.model), cfg.data.micro_batch_size, [cfg.data.seq_len],
                                    "cpu")


@pytest.fixture
def backend(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> CpuCBackend:
    """The trainer's own cpu-c backend, on a hermetic compile cache."""
    cache = tmp_path_factory.getbasetemp() / "kernel-cache"
    monkeypatch.setenv("TREX_KERNEL_CACHE", str(cache))
    return CpuCBackend(cache_dir=cache)


def _registry(tmp: Path, cfg: TrainerConfig, be: CpuCBackend) -> Path:
    """A registry holding a (non-default: vectorised, chunked) configuration for every shape the run uses."""
    r = reg.empty("cpu-c", "cpu:test")
    for kernel, dims in _shapes(cfg):
        params = {**be.default_params(SUITE[kernel], dims), "THREADS": 1, "VEC": 16, "UNROLL": 1}
        reg.put(r, kernel, dims, "fp32", {"params": params, "source_hash": "", "median_s": 1e-4})
    path = tmp / "registry.json"
    reg.save(r, path)
    return path


def _train(cfg: TrainerConfig, out: Path) -> tuple[list[float], Trainer]:
    tr = Trainer(cfg, out, measure_peak=False, log=lambda _m: None)
    res = tr.run(STEPS)
    return [r.loss for r in res.history], tr


def test_tuned_kernels_are_used_and_training_matches_eager(tmp_path: Path, backend: CpuCBackend) -> None:
    base_cfg = _cfg(tmp_path / "eager", None, dense=True)
    eager_losses, _ = _train(base_cfg, tmp_path / "eager")
    cfg = _cfg(tmp_path / "tuned", _registry(tmp_path, base_cfg, backend), dense=True)
    losses, tr = _train(cfg, tmp_path / "tuned")
    try:
        assert not tr.kernels.refused, tr.kernels.refused
        assert {k.split("/")[0] for k in tr.kernels.active} == {"rmsnorm_fwd", "rmsnorm_bwd", "swiglu_clamp_fwd",
                                                                "swiglu_clamp_bwd"}
        calls = tr.kernels.calls
        assert all(calls[k] >= STEPS for k in ("rmsnorm_fwd", "rmsnorm_bwd", "swiglu_clamp_fwd", "swiglu_clamp_bwd")), calls
        # the kernels' declared fp32 tolerance is 1e-4 relative per op: step 1 (one forward) agrees to it, and so
        # do the 20 steps' losses at these LRs (measured: at most 3e-5). Weights are not compared: Muon
        # orthogonalises each update, which turns 1e-7 gradient differences in near-null directions into
        # unit-size update differences.
        assert losses[0] == pytest.approx(eager_losses[0], rel=1e-4)
        assert losses == pytest.approx(eager_losses, rel=1e-4)
        assert eager_losses[-1] < eager_losses[0] - 0.3  # it trains
        assert losses != eager_losses  # the tuned kernels really ran (bit-identical would mean eager did)
        assert tr.kernels.summary()["active"] == tr.kernels.active
    finally:
        tk.install(None, {}, 1, [1], "cpu", lambda _m: None)
    assert not layers.TUNED


class _Wrong:
    """A backend whose rmsnorm_fwd scales its output by 1.01 (a plausible, subtly wrong kernel)."""

    def __init__(self, inner: CpuCBackend) -> None:
        self.inner = inner

    def compile(self, spec: Any, params: Mapping[str, int], dtype: str) -> Any:
        comp = self.inner.compile(spec, params, dtype)
        if spec.name != "rmsnorm_fwd":
            return comp
        bad = copy.copy(comp)

        def bind(inputs: Any, outputs: Any, shape: Any) -> Any:
            run = comp.bind(inputs, outputs, shape)

            def launch() -> None:
                run()
                outputs["y"].mul_(1.01)
            return launch
        bad.bind = bind  # type: ignore[method-assign]
        return bad


def test_wrong_kernel_is_refused_at_load(tmp_path: Path, backend: CpuCBackend) -> None:
    cfg = _cfg(tmp_path, _registry(tmp_path, _cfg(tmp_path, None), backend))
    logs: list[str] = []
    state = tk.install(cfg.kernels.registry, resolved_model_values(cfg.model), cfg.data.micro_batch_size,
                       [cfg.data.seq_len], "cpu", logs.append, backend=_Wrong(backend))  # type: ignore[arg-type]
    try:
        refused = [k for k in state.refused if k.startswith("rmsnorm_fwd/")]
        assert refused and all("disagrees with eager" in state.refused[k] for k in refused)
        assert not any(k.startswith("rmsnorm_fwd/") for k in state.active)
        assert any(k.startswith("rmsnorm_bwd/") for k in state.active)  # the others still load
        assert any(line.startswith("kernels: refused rmsnorm_fwd/fp32/") for line in logs)
        assert state.summary()["refused"] == state.refused
        from trex.telemetry.exporter import Exporter

        ex = Exporter()
        state.export(ex, "job")
        text = ex.render()
        assert all(f'trex_train_kernel_refused{{job_name="job",kernel="{k}"}} 1' in text for k in refused), text
    finally:
        tk.install(None, {}, 1, [1], "cpu", lambda _m: None)


def test_other_backends_registry_leaves_ops_eager(tmp_path: Path) -> None:
    r = reg.empty("cuda-triton", "cuda:x")
    reg.save(r, tmp_path / "r.json")
    logs: list[str] = []
    state = tk.install(tmp_path / "r.json", resolved_model_values(_cfg(tmp_path, None).model), 2, [32], "cpu", logs.append)
    assert not state.active and "registry" in state.refused and not layers.TUNED and logs


def test_registry_shape_classes_match_the_trainers_real_calls(tmp_path: Path) -> None:
    """Record every RMSNorm/SwiGLU call of real steps (forward and backward) and compare their shape classes
    with the ones trainer_kernel_shapes derives (what a KernelTuneJob tunes for this run)."""
    from trex.kernels.suite.base import shape_bucket

    cfg = _cfg(tmp_path, None)
    seen: set[tuple[str, str]] = set()

    def rec(kernel: str) -> Any:
        def f(x: torch.Tensor, *_: Any) -> None:
            seen.add((kernel, shape_bucket({"rows": x.numel() // x.shape[-1], "cols": x.shape[-1]})))
        return f
    tr = Trainer(cfg, tmp_path, measure_peak=False, log=lambda _m: None)
    layers.TUNED.update({"rmsnorm": rec("rmsnorm_fwd"), "swiglu": rec("swiglu_clamp_fwd")})
    try:
        tr.run(3)
    finally:
        layers.TUNED.clear()
    derived = {(k, shape_bucket(d)) for k, d in _shapes(cfg)}
    assert seen and seen <= derived, seen - derived
    assert {(k, b) for k, b in derived if k.endswith("_fwd")} <= seen | {
        (k, b) for k, b in derived if k == "swiglu_clamp_fwd"}  # routed-row classes depend on the routing
    assert {b for k, b in derived if k == "rmsnorm_fwd"} == {b for k, b in seen if k == "rmsnorm_fwd"}
