"""The swap optimizer against the trainer without it: bit-identical parameters and Muon/AdamW states after 5
steps (fp32 and bf16), with one bucket per optimizer and with small buckets on a simulated host link whose
random per-copy delays reorder completions (Muon's buckets are whole Newton-Schulz batches, so every matrix
is orthogonalised in the same batched call either way); a deliberately missing wait must show up as a
different result; checkpoint + resume with swap equals an uninterrupted run; each step's first copy-in
starts in the backward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import trex.trainer.build as build_mod
from optimizer_states import assert_identical
from trex.config_base import load_section
from trex.runtime.copy_engine import LatencyCopyEngine, ThreadCopyEngine
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer
from trex.trainer.optim import muon as muon_mod
from trex.trainer.optim import swap
from trex.trainer.optim.build import Optimizers
from trex.trainer.optim.muon import Muon, ns_batches
from trex.trainer.optim.swap import SwapOptimizers, SwapStats, plan_buckets

STEPS = 5
BUCKET = 24 * 1024
"""Small buckets, so the tiny model's states move in a dozen or more of them."""


def _cfg(ckpt: Path, dtype: str, enabled: bool, **over: Any) -> TrainerConfig:
    return load_section(TrainerConfig, {
        "model": {"preset": "tiny", "dtype": dtype}, "maxSteps": STEPS,
        "data": {"seqLen": 16, "microBatchSize": 2, "globalBatchSize": 2},
        "optimizer": {"schedule": {"warmupSteps": 1}, "swap": {"enabled": enabled, "buffers": 2}},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(ckpt), "intervalSteps": 100, "exportHf": False}, **over,
    })


def _run(tmp: Path, dtype: str, enabled: bool, steps: int = STEPS, **over: Any) -> Trainer:
    tr = Trainer(_cfg(tmp / "ckpt", dtype, enabled, **over), tmp, measure_peak=False, log=lambda _m: None)
    tr.run(steps)
    return tr


def _states(tr: Trainer) -> dict[str, torch.Tensor]:
    """Every parameter and every optimizer state tensor, by parameter name."""
    names = {id(p): n for n, p in tr.model.named_parameters()}
    out = {f"param.{n}": p.detach().clone() for n, p in tr.model.named_parameters()}
    for opt in tr.opts.all():
        for p, state in opt.state.items():
            for key, val in state.items():
                out[f"{names[id(p)]}.{key}"] = val.detach().clone()
    return out


@pytest.fixture
def jittery(monkeypatch: pytest.MonkeyPatch) -> None:
    """`trex train` with small buckets on a simulated 2 GB/s link with up to 2 ms random delay per copy."""
    seeds = iter(range(100))

    def make(opts: Any, cfg: Any, kind: str, **kw: Any) -> Any:
        return swap.with_swap(opts, cfg, kind, engine=LatencyCopyEngine(2.0, jitter=2e-3, seed=next(seeds)),
                              bucket_bytes=BUCKET, **kw)

    monkeypatch.setattr(build_mod, "with_swap", make)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, torch.Tensor]]:
    torch.set_num_threads(1)
    return {dtype: _states(_run(tmp_path_factory.mktemp(dtype), dtype, False)) for dtype in ("fp32", "bf16")}


def test_buckets_are_whole_consecutive_items() -> None:
    assert plan_buckets([4, 4, 4, 10, 1, 1], 8) == [[0, 1], [2], [3], [4, 5]]
    assert plan_buckets([], 8) == []
    stats = SwapStats(copy_seconds=2.0, exposed_seconds=0.5, host_bytes=100, buffer_bytes=30)
    assert stats.overlap_ratio == 0.75 and stats.bytes_saved == 70
    assert SwapStats().overlap_ratio == 1.0


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_swap_is_bit_identical_to_no_swap(dtype: str, tmp_path: Path,
                                          reference: dict[str, dict[str, torch.Tensor]]) -> None:
    tr = _run(tmp_path, dtype, True)  # the CPU thread engine, one bucket per optimizer at bucketMb 256
    assert isinstance(tr.opts, SwapOptimizers)
    assert_identical(reference[dtype], _states(tr))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_swap_under_random_copy_delays_is_bit_identical(dtype: str, tmp_path: Path, jittery: None,
                                                        reference: dict[str, dict[str, torch.Tensor]]) -> None:
    tr = _run(tmp_path, dtype, True)
    assert isinstance(tr.opts, SwapOptimizers) and len(tr.opts.buckets) >= 8
    assert_identical(reference[dtype], _states(tr))
    stats = tr.opts.last
    assert stats is not None and stats.copy_seconds > 0 and 0 <= stats.overlap_ratio <= 1
    # every state lives in its host copy between steps; the device held two bucket buffers during the step
    state_bytes = sum(v.numel() * v.element_size() for k, v in _states(tr).items()
                      if not k.startswith("param.") and v.ndim > 0)
    assert stats.host_bytes == state_bytes and stats.bytes_saved == state_bytes - stats.buffer_bytes
    per_param: dict[str, int] = {}
    for k, v in _states(tr).items():
        if not k.startswith("param.") and v.ndim > 0:
            name = k.rsplit(".", 1)[0]
            per_param[name] = per_param.get(name, 0) + v.numel() * v.element_size()
    # two buffers of the largest bucket: bucketMb, or one parameter's states or Newton-Schulz batch if larger
    names = {id(p): n for n, p in tr.model.named_parameters()}
    per_bucket = [sum(per_param.get(names[id(p)], 0) for p in b.params) for b in tr.opts.buckets]
    assert 0 < stats.buffer_bytes <= 2 * (max(per_bucket) + 64 * 16) < state_bytes


@pytest.mark.parametrize("broken", ["copy-in wait", "buffer release"])
def test_a_missing_wait_is_caught(broken: str, tmp_path: Path, jittery: None, monkeypatch: pytest.MonkeyPatch,
                                  reference: dict[str, dict[str, torch.Tensor]]) -> None:
    """Updating a bucket before its copy-in landed, or copying into a buffer before its previous bucket was
    written back, changes the result under the delayed link: the comparison above would fail."""
    if broken == "copy-in wait":
        monkeypatch.setattr(SwapOptimizers, "_await_copy_in", lambda _self, _h: None)
    else:
        real = LatencyCopyEngine.copy_many

        def no_after(self: Any, pairs: Any, *, after: Any = (), to_host: bool = False) -> Any:
            return real(self, pairs, after=(), to_host=to_host)

        monkeypatch.setattr(LatencyCopyEngine, "copy_many", no_after)
    got = _states(_run(tmp_path, "fp32", True))
    assert any(not torch.equal(v, got[k]) for k, v in reference["fp32"].items())


def test_checkpoint_and_resume_with_swap_equals_an_uninterrupted_run(tmp_path: Path, jittery: None,
                                                                     reference: dict[str, dict[str, torch.Tensor]]
                                                                     ) -> None:
    ckpt = {"checkpoint": {"dir": str(tmp_path / "ckpt"), "intervalSteps": 3, "exportHf": False}}
    first = _run(tmp_path, "fp32", True, steps=3, **ckpt)
    assert first.last_checkpoint == 3
    second = Trainer(_cfg(tmp_path / "ckpt", "fp32", True, **ckpt), tmp_path, measure_peak=False,
                     log=lambda _m: None)
    second.run(STEPS)
    assert second.step == STEPS
    assert_identical(reference["fp32"], _states(second))


class _Counting(ThreadCopyEngine):
    """Counts transfers (one per copy_many) by direction."""

    def __init__(self) -> None:
        super().__init__(lanes=2)
        self.counts = {False: 0, True: 0}

    def copy_many(self, pairs: Any, *, after: Any = (), to_host: bool = False) -> Any:
        self.counts[to_host] += 1
        return super().copy_many(pairs, after=after, to_host=to_host)


def test_the_first_copy_in_starts_in_the_backward() -> None:
    """The first gradient of a backward starts the next step's first copy-in (its states do not depend on
    the gradients); the step then copies the other buckets in, and the result equals no prefetch."""
    torch.manual_seed(0)
    init = [torch.randn(s) for s in ((8, 8), (8, 16), (16, 24), (4, 12))]  # four shapes: four buckets
    results = []
    for prefetch in (True, False):
        params = [torch.nn.Parameter(x.clone()) for x in init]
        engine = _Counting()
        opts = SwapOptimizers(Optimizers(Muon(params), None), buffers=2, bucket_bytes=8 * 8 * 4, engine=engine,
                              device_kind="cpu", prefetch=prefetch)
        for step in range(3):
            sum((p.square() * (step + 1)).sum() for p in params).backward()  # type: ignore[union-attr]
            if step and prefetch:  # states exist from the first step on: bucket 0 is on its way in
                assert engine.counts[False] == 4 * (step - 1) + 1
            opts.step()
            opts.zero_grad()
            assert engine.counts == {False: 4 * step, True: 4 * (step + 1)}  # no copy-in twice
        opts.close()
        engine.close()
        results.append([p.detach().clone() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_newton_schulz_batches_are_greedy_per_shape() -> None:
    # (short, long) side joins tall and wide matrices and stacks; up to cap elements, a larger one alone
    shapes = [(4, 8), (8, 4), (2, 4, 8), (4, 4), (4, 8), (8, 4), (64, 64)]
    assert ns_batches(shapes, cap=96) == [[0, 1], [2, 4], [3], [5], [6]]
    assert ns_batches(shapes, cap=10**6) == [[0, 1, 2, 4, 5], [3], [6]]
    # greedy from a batch boundary forms the same batches again: a bucket of whole batches batches alike
    assert ns_batches(shapes[2:], cap=96) == [[0, 2], [1], [3], [4]]


def test_small_buckets_batch_newton_schulz_as_without_swap(monkeypatch: pytest.MonkeyPatch) -> None:
    """With several Newton-Schulz batches per shape (a small cap) and buckets of one batch each, swap on equals
    swap off bit for bit at 2 threads, where CPU GEMMs round a matrix differently by batch size."""
    monkeypatch.setattr(muon_mod, "NS_BATCH_ELEMENTS", 10 * 64 * 64)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        shapes = [(64, 64)] * 24 + [(128, 64)] * 3 + [(2, 64, 128)] * 2
        init = [torch.randn(s) for s in shapes]
        grads = [[torch.randn(s) for s in shapes] for _ in range(3)]
        results = []
        for swapped in (False, True):
            params = [torch.nn.Parameter(x.clone()) for x in init]
            opts = Optimizers(Muon(params), None)
            if swapped:
                opts = SwapOptimizers(opts, buffers=2, bucket_bytes=64 * 64 * 4, engine=ThreadCopyEngine(lanes=2),
                                      device_kind="cpu", prefetch=False)
                assert len(opts.buckets) == 5  # square: 10, 10 and 4; 3 tall + a stack (10 x 64 x 64), a stack
            for step in grads:
                for p, g in zip(params, step, strict=True):
                    p.grad = g.clone()
                opts.step()
            results.append([p.detach().clone() for p in params])
        assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))
    finally:
        torch.set_num_threads(threads)
