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
    model: dict[str, Any] = {"preset": "tiny", "overrides": {"ropeInterleave": False}}  # half-split RoPE: dispatched
    if dense:
        model["overrides"] |= {"nDenseLayers": 2, "mtpDepth": 0}
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


def _registry(tmp: Path, cfg: TrainerConfig, be: CpuCBackend, only: str | tuple[str, ...] = "",
              threads: int = 1) -> Path:
    """A registry holding a (non-default: vectorised, chunked) configuration for every shape the run uses (or
    only for kernel names starting with ``only``)."""
    r = reg.empty("cpu-c", "cpu:test")
    for kernel, dims in _shapes(cfg):
        if not kernel.startswith(only):
            continue
        params = {**be.default_params(SUITE[kernel], dims), "THREADS": threads, "VEC": 16, "UNROLL": 1}
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
        kernels = ("rmsnorm_fwd", "rmsnorm_bwd", "swiglu_clamp_fwd", "swiglu_clamp_bwd", "rope_fwd", "rope_inv")
        assert {k.split("/")[0] for k in tr.kernels.active} == set(kernels)
        calls = tr.kernels.calls
        assert all(calls[k] >= STEPS for k in kernels), calls
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


def test_moe_kernels_are_used_and_training_matches_eager(tmp_path: Path, backend: CpuCBackend) -> None:
    """Top-k routing through the tuned router_topk (its weights' gradient through the custom op's formula) and
    the routed experts' GEMMs through the tuned grouped GEMM (forward and dx; dw per expert)."""
    base_cfg = _cfg(tmp_path / "eager", None)
    eager_losses, _ = _train(base_cfg, tmp_path / "eager")
    cfg = _cfg(tmp_path / "tuned", _registry(tmp_path, base_cfg, backend, only=("router", "grouped")))
    losses, tr = _train(cfg, tmp_path / "tuned")
    try:
        assert {k.split("/")[0] for k in tr.kernels.active} == {"router_topk", "grouped_gemm"}
        assert not tr.kernels.refused
        assert tr.kernels.calls["router_topk"] >= 2 * STEPS  # one MoE layer and the MTP block's
        assert tr.kernels.calls["grouped_gemm"] >= 2 * 6 * STEPS  # 3 GEMMs each: forward and dx
        # Rounding only: the first steps agree to 1e-5; over 20 steps fp32 rounding differences compound (seen up to
        # 1.3e-4 by step 15), so the whole run is held to 1e-3 (a wrong kernel is off by far more at the first step).
        assert losses[:4] == pytest.approx(eager_losses[:4], rel=1e-5)
        assert losses == pytest.approx(eager_losses, rel=1e-3)
        assert losses != eager_losses
    finally:
        tk.install(None, {}, 1, [1], "cpu", lambda _m: None)


def test_rope_and_router_gradients_equal_eager_autograd(tmp_path: Path, backend: CpuCBackend) -> None:
    """The custom ops' autograd formulas (RoPE's backward through rope_inv, the router weights' through the
    renormalisation, the grouped GEMM's) against torch autograd of the eager model code."""
    from trex.trainer.model.layers import apply_rope, rope_cos_sin
    from trex.trainer.model.moe import grouped_linear, router_scores

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 32, 4, 8, generator=g)  # the tiny preset's query rope part: heads 4, rope dim 8
    cos, sin = rope_cos_sin(torch.arange(32).expand(2, 32), 8, 10000.0)
    dy = torch.randn(x.shape, generator=g)
    logits, bias = torch.randn(64, 8, generator=g) * 2, torch.randn(8, generator=g) * 0.1
    dw = torch.randn(64, 2, generator=g)

    def rope_grads(f: Any) -> tuple[torch.Tensor, torch.Tensor]:
        xx = x.clone().requires_grad_()
        y = f(xx)
        y.backward(dy)
        return y.detach(), xx.grad

    def router_grads(f: Any) -> tuple[torch.Tensor, torch.Tensor]:
        lt = logits.clone().requires_grad_()
        w, idx = f(lt)
        (w * dw).sum().backward()
        return idx, lt.grad

    def eager_router(scoring: str) -> Any:
        def f(lt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            s = router_scores(lt, scoring)
            idx = torch.topk(s.detach() + bias, 2, dim=-1).indices
            w = s.gather(1, idx)
            return w / w.sum(-1, keepdim=True), idx
        return f
    xs, counts = torch.randn(128, 64, generator=g), torch.tensor([18, 0, 40, 6, 14, 22, 12, 16])  # an idle expert
    w_up, dys = torch.randn(8, 32, 64, generator=g) / 8, torch.randn(128, 32, generator=g)

    def gemm_grads(f: Any) -> tuple[torch.Tensor, ...]:
        xx, ww = xs.clone().requires_grad_(), w_up.clone().requires_grad_()
        y = f(xx, ww)
        y.backward(dys)
        return y.detach(), xx.grad, ww.grad
    ref_gemm = gemm_grads(lambda xx, ww: grouped_linear(xx, ww, counts))
    ref_rope = rope_grads(lambda xx: apply_rope(xx, cos, sin, interleave=False))
    ref_router = {sc: router_grads(eager_router(sc)) for sc in tk.SCORE_CODES}
    cfg = _cfg(tmp_path, _registry(tmp_path, _cfg(tmp_path, None), backend))
    tk.install_for(cfg, "cpu", lambda _m: None)
    try:
        torch.testing.assert_close(rope_grads(lambda xx: apply_rope(xx, cos, sin, interleave=False)), ref_rope,
                                   rtol=1e-5, atol=1e-6)
        tuned = router_grads(lambda lt: tk.tuned_router(lt, bias, 2, "sigmoid"))  # the preset's router: tuned
        # sqrt-softplus has no registry entry: the op computes eagerly, its autograd formula is still the one tested
        other = router_grads(lambda lt: tk.router_topk(lt, bias, 2, tk.SCORE_CODES["sqrt-softplus"])[::-1])
        for got, (idx, grad) in ((tuned, ref_router["sigmoid"]), (other, ref_router["sqrt-softplus"])):
            assert torch.equal(got[0], idx)
            torch.testing.assert_close(got[1], grad, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(gemm_grads(lambda xx, ww: grouped_linear(xx, ww, counts)), ref_gemm,
                                   rtol=1e-4, atol=1e-5)
        assert tk.STATE.calls["rope_fwd"] == 1 and tk.STATE.calls["rope_inv"] == 1 and tk.STATE.calls["router_topk"] == 1
        assert tk.STATE.calls["grouped_gemm"] == 2  # forward and dx
    finally:
        tk.install(None, {}, 1, [1], "cpu", lambda _m: None)


def test_cpu_kernels_run_one_thread_inside_training(tmp_path: Path, backend: CpuCBackend) -> None:
    """A registry tuned at 2 threads is compiled at 1 (no parallel region beside torch's intra-op pool)."""
    assert tk.training_params({"THREADS": 2, "VEC": 16}, "cpu") == {"THREADS": 1, "VEC": 16}
    assert tk.training_params({"THREADS": 2, "VEC": 16}, "cuda") == {"THREADS": 2, "VEC": 16}
    cfg = _cfg(tmp_path, _registry(tmp_path, _cfg(tmp_path, None), backend, threads=2))
    state = tk.install_for(cfg, "cpu", lambda _m: None)
    try:
        assert state.compiled and not state.refused
        assert {c.params["THREADS"] for c in state.compiled.values()} == {1}
    finally:
        tk.install(None, {}, 1, [1], "cpu", lambda _m: None)


class _Wrong:
    """A backend whose ``kernel`` scales its output ``out`` by 1.01 (a plausible, subtly wrong kernel)."""

    def __init__(self, inner: CpuCBackend, kernel: str, out: str) -> None:
        self.inner, self.kernel, self.out = inner, kernel, out

    def compile(self, spec: Any, params: Mapping[str, int], dtype: str) -> Any:
        comp = self.inner.compile(spec, params, dtype)
        if spec.name != self.kernel:
            return comp
        bad = copy.copy(comp)

        def bind(inputs: Any, outputs: Any, shape: Any) -> Any:
            run = comp.bind(inputs, outputs, shape)

            def launch() -> None:
                run()
                outputs[self.out].mul_(1.01)
            return launch
        bad.bind = bind  # type: ignore[method-assign]
        return bad


@pytest.mark.parametrize(("kernel", "out", "other"), [("rmsnorm_fwd", "y", "rmsnorm_bwd"), ("rope_fwd", "y", "rope_inv"),
                                                    ("router_topk", "weights", "rmsnorm_fwd"),
                                                    ("grouped_gemm", "y", "router_topk")])
def test_wrong_kernel_is_refused_at_load(tmp_path: Path, backend: CpuCBackend, kernel: str, out: str,
                                         other: str) -> None:
    cfg = _cfg(tmp_path, _registry(tmp_path, _cfg(tmp_path, None), backend))
    logs: list[str] = []
    state = tk.install(cfg.kernels.registry, resolved_model_values(cfg.model), cfg.data.micro_batch_size,
                       [cfg.data.seq_len], "cpu", logs.append, backend=_Wrong(backend, kernel, out))  # type: ignore[arg-type]
    try:
        refused = [k for k in state.refused if k.startswith(f"{kernel}/")]
        assert refused and all("disagrees with eager" in state.refused[k] for k in refused)
        assert not any(k.startswith(f"{kernel}/") for k in state.active)
        assert any(k.startswith(f"{other}/") for k in state.active)  # the others still load
        assert any(line.startswith(f"kernels: refused {kernel}/fp32/") for line in logs)
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


@pytest.mark.parametrize("attention", ["mla", "csa"])
def test_registry_shape_classes_match_the_trainers_real_calls(tmp_path: Path, attention: str) -> None:
    """Record every dispatched call of real steps (forward and backward) and compare their shape classes with the
    ones trainer_kernel_shapes derives (what a KernelTuneJob tunes for this run); csa adds V4's extra norms
    (q_a_norm, kv_norm, the compressed entries' norms) and keeps its interleaved RoPE eager."""
    from trex.kernels.suite.base import shape_bucket

    cfg = _cfg(tmp_path, None)
    if attention == "csa":
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"overrides": cfg.model.overrides.model_copy(
            update={"attention": "csa", "q_lora_rank": 32, "v_head_dim": 24, "layer_types": ["csa", "hca"],
                    "rope_interleave": None})})})
    seen: set[tuple[str, str]] = set()

    def rows_cols(kernel: str) -> Any:
        def f(x: torch.Tensor, *_: Any) -> None:
            seen.add((kernel, shape_bucket({"rows": x.numel() // x.shape[-1], "cols": x.shape[-1]})))
        return f

    def rope(x: torch.Tensor, *_: Any) -> None:
        heads = x.shape[2] if x.dim() == 4 else 1
        seen.add(("rope_fwd", shape_bucket({"tokens": x.shape[0] * x.shape[1], "heads": heads, "dim": x.shape[-1]})))

    def router(logits: torch.Tensor, _bias: torch.Tensor, k: int, scoring: str) -> None:
        dims = {"tokens": logits.shape[0], "experts": logits.shape[1], "k": k, "score": tk.SCORE_CODES[scoring]}
        seen.add(("router_topk", shape_bucket(dims)))
    def gemm(x: torch.Tensor, w: torch.Tensor, _counts: torch.Tensor) -> None:
        dims = {"tokens": x.shape[0], "experts": w.shape[0], "hidden": w.shape[2], "out": w.shape[1]}
        seen.add(("grouped_gemm", shape_bucket(dims)))
    tr = Trainer(cfg, tmp_path, measure_peak=False, log=lambda _m: None)
    layers.TUNED.update({"rmsnorm": rows_cols("rmsnorm_fwd"), "swiglu": rows_cols("swiglu_clamp_fwd"), "rope": rope,
                         "router": router, "grouped_gemm": gemm})
    try:
        tr.run(3)
    finally:
        layers.TUNED.clear()
    derived = {(k, shape_bucket(d)) for k, d in _shapes(cfg)}
    assert seen and seen <= derived, seen - derived
    def classes(kernel: str, among: set[tuple[str, str]]) -> set[str]:
        return {b for k, b in among if k == kernel}
    assert classes("router_topk", derived) == classes("router_topk", seen)
    assert classes("grouped_gemm", derived) == classes("grouped_gemm", seen) and len(classes("grouped_gemm", seen)) == 2
    assert {k for k, _ in seen} == {"rmsnorm_fwd", "swiglu_clamp_fwd", "router_topk", "grouped_gemm"} | (
        {"rope_fwd"} if attention == "mla" else set())
    if attention == "mla":
        assert classes("rmsnorm_fwd", derived) == classes("rmsnorm_fwd", seen)
        assert classes("rope_fwd", derived) == classes("rope_fwd", seen) and len(classes("rope_fwd", seen)) == 2
    else:  # q_a_norm (q_lora_rank 32) and kv_norm (head dim 24) on the tokens; compressed entries on fewer rows
        tokens = cfg.data.micro_batch_size * cfg.data.seq_len
        assert {shape_bucket({"rows": tokens, "cols": c}) for c in (32, 24)} <= classes("rmsnorm_fwd", seen)
        assert any(int(b.split("rows")[1]) < tokens for b in classes("rmsnorm_fwd", seen))
        assert not classes("rope_fwd", seen | derived)  # V4's interleaved RoPE stays eager


def test_untuned_baseline_runs_the_eager_path_beside_the_tuned_one(tmp_path: Path, backend: CpuCBackend) -> None:
    """The tokens/s baseline: inside ``untuned()`` a forward launches no tuned kernel and equals a run without a
    registry bit for bit; the timing alternates tuned and untuned legs, leaves the coverage counts as the run made
    them, and the trainer's baseline clears the gradients it made."""
    base_cfg = _cfg(tmp_path / "eager", None, dense=True)
    eager = Trainer(base_cfg, tmp_path / "eager", measure_peak=False, log=lambda _m: None)
    ids = torch.randint(0, base_cfg.model.args.vocab_size, (2, 32), generator=torch.Generator().manual_seed(3))
    pos = torch.arange(32).expand(2, 32)
    docs = torch.zeros(2, 32, dtype=torch.long)
    with torch.no_grad():
        want = eager.model(ids, pos, docs).logits
    cfg = _cfg(tmp_path / "tuned", _registry(tmp_path, base_cfg, backend), dense=True)
    tr = Trainer(cfg, tmp_path / "tuned", measure_peak=False, log=lambda _m: None)
    try:
        with torch.no_grad():
            launches = sum(tk.STATE.calls.values())
            with tk.untuned():
                got = tr.model(ids, pos, docs).logits
                assert not layers.TUNED
            assert sum(tk.STATE.calls.values()) == launches and layers.TUNED
            assert torch.equal(got, want)
            tuned = tr.model(ids, pos, docs).logits
            assert sum(tk.STATE.calls.values()) > launches and not torch.equal(tuned, want)

        legs: list[bool] = []
        counts = (sum(tk.STATE.calls.values()), sum(tk.STATE.called.values()))
        out = tk.tuned_vs_untuned(lambda: legs.append(bool(layers.TUNED)), tokens=64, repeats=3)
        assert legs == [True, False] * 4
        assert (sum(tk.STATE.calls.values()), sum(tk.STATE.called.values())) == counts
        assert out["tokens"] == 64 and out["speedup"] == pytest.approx(
            out["tunedTokensPerSecond"] / out["untunedTokensPerSecond"], rel=1e-2)

        base = tr.kernel_baseline()
        assert base is not None and base["tokens"] == 2 * 32
        assert all(p.grad is None for p in tr.model.parameters())
        assert eager.kernel_baseline() is None  # no kernel active: nothing to compare
    finally:
        tk.install(None, {}, 1, [1], "cpu", lambda _m: None)
