"""Device choice, backend map, dtype support, seeding/RNG state, determinism switch, copy engines."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from trex.runtime.copy_engine import StreamCopyEngine, ThreadCopyEngine, make_copy_engine
from trex.runtime.device import (
    DeviceUnavailableError,
    choose_kind,
    dist_backend,
    init_distributed,
    npu_available,
    npu_bf16,
    rng_state,
    seed_everything,
    select_device,
    set_deterministic,
    set_rng_state,
    stream_and_event,
    supports_dtype,
    torch_dtype,
)


def test_choice_prefers_npu_then_cuda_then_cpu() -> None:
    assert choose_kind("auto", npu=True, cuda=True) == "npu"
    assert choose_kind("auto", npu=False, cuda=True) == "cuda"
    assert choose_kind("auto", npu=False, cuda=False) == "cpu"
    assert choose_kind("cpu", npu=True, cuda=True) == "cpu"
    assert choose_kind("cuda", npu=True, cuda=True) == "cuda"
    with pytest.raises(DeviceUnavailableError, match="'npu' requested"):
        choose_kind("npu", npu=False, cuda=True)
    with pytest.raises(DeviceUnavailableError, match="'cuda' requested"):
        choose_kind("cuda", npu=False, cuda=False)
    with pytest.raises(ValueError, match="allowed: auto, npu, cuda, cpu"):
        choose_kind("tpu", npu=False, cuda=False)


def test_backend_map_and_dtypes() -> None:
    assert [dist_backend(k) for k in ("npu", "cuda", "cpu")] == ["hccl", "nccl", "gloo"]
    with pytest.raises(ValueError, match="unknown device kind"):
        dist_backend("tpu")
    assert supports_dtype("cpu", "fp32") and supports_dtype("npu", "bf16", soc="Ascend910B3") and not supports_dtype("cpu", "fp16")
    assert torch_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError, match="allowed: fp32, bf16, fp16"):
        torch_dtype("fp8")


def test_select_cpu_and_streams() -> None:
    info = select_device("cpu")
    assert info.kind == "cpu" and info.backend == "gloo" and info.torch_device() == torch.device("cpu")
    assert info.module() is torch.cpu
    stream, event = stream_and_event("cpu")
    assert stream is not None and event is not None


def test_npu_probe_does_not_import_torch_npu_when_absent() -> None:
    if "torch_npu" in sys.modules:
        pytest.skip("torch_npu is installed here")
    assert npu_available() is False
    assert "torch_npu" not in sys.modules


def test_runtime_import_is_light() -> None:
    code = "import sys, trex.runtime.device, trex.runtime.copy_engine; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_seeding_and_rng_state_round_trip() -> None:
    def draw() -> tuple[float, float, list[float]]:
        return random.random(), float(np.random.rand()), torch.rand(3).tolist()

    seed_everything(123)
    a = draw()
    seed_everything(123)
    assert draw() == a
    state = rng_state("cpu")
    b = draw()
    draw()
    set_rng_state(state, "cpu")
    assert draw() == b


def test_determinism_switch() -> None:
    before = torch.are_deterministic_algorithms_enabled()
    try:
        set_deterministic(True)
        assert torch.are_deterministic_algorithms_enabled()
        set_deterministic(False)
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("engine_kind", ["thread", "stream"])
def test_copy_engines_copy_everything(engine_kind: str) -> None:
    engine = ThreadCopyEngine() if engine_kind == "thread" else StreamCopyEngine("cpu")
    srcs = [torch.randn(64, 33) * i for i in range(6)]
    dsts = [torch.empty_like(s) for s in srcs]
    handles = [engine.copy(d, s) for d, s in zip(dsts, srcs, strict=True)]
    handles[-1].wait()
    engine.synchronize()
    assert all(h.done() for h in handles)
    for d, s in zip(dsts, srcs, strict=True):
        assert torch.equal(d, s)
    many = [torch.zeros(5), torch.zeros(2, 2)]
    engine.copy_many([(many[0], torch.ones(5)), (many[1], torch.full((2, 2), 3.0))]).wait()
    assert many[0].sum() == 5 and many[1].sum() == 12
    with pytest.raises(ValueError, match="shape mismatch"):
        engine.copy(torch.zeros(3), torch.zeros(4))
    engine.close()


def test_thread_engine_copies_off_the_calling_thread() -> None:
    import threading

    engine = make_copy_engine("cpu")
    assert isinstance(engine, ThreadCopyEngine)
    seen: list[str] = []

    src = torch.ones(4)
    dst = torch.zeros(4)
    # a copy submitted after a blocking task runs after it, on the worker thread
    gate = threading.Event()
    def blocker() -> None:
        seen.append(threading.current_thread().name)
        gate.wait(5)

    engine._pools[0].submit(blocker)
    h = engine.copy(dst, src)
    assert not h.done() and dst.sum() == 0  # still queued behind the blocked worker
    gate.set()
    h.wait()
    assert dst.sum() == 4 and seen and seen[0].startswith("trex-copy")
    engine.close()


@pytest.mark.parametrize(("soc", "bf16"), [
    ("Ascend910A", False), ("Ascend910B", False), ("Ascend910ProA", False), ("Ascend910ProB", False),
    ("Ascend910PremiumA", False), ("Ascend310P3", False), ("Ascend310B1", False),
    ("Ascend910B1", True), ("Ascend910B2C", True), ("Ascend910B3", True), ("Ascend910B4-1", True),
    ("Ascend910_9391", True), ("Ascend910_9382", True),
])
def test_npu_bf16_follows_the_soc(soc: str, bf16: bool) -> None:
    """The first-generation 910 shares huawei.com/Ascend910 with the A2/A3 chips but has no bf16 units."""
    assert npu_bf16(soc) is bf16
    assert supports_dtype("npu", "bf16", soc=soc) is bf16
    assert supports_dtype("npu", "fp32", soc=soc) and supports_dtype("npu", "fp16", soc=soc)


def test_hccl_env_is_in_place_before_the_process_group_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import torch.distributed as dist

    seen: dict[str, object] = {}

    def fake_init(backend: str, **kwargs: object) -> None:
        seen.update(backend=backend, deterministic=os.environ.get("HCCL_DETERMINISTIC"))

    monkeypatch.delenv("HCCL_DETERMINISTIC", raising=False)
    monkeypatch.setattr(dist, "init_process_group", fake_init)
    init_distributed("npu", 0, 1, "127.0.0.1", 29500, deterministic=True)
    assert seen == {"backend": "hccl", "deterministic": "true"}


def test_npu_determinism_after_the_process_group_needs_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    monkeypatch.delenv("HCCL_DETERMINISTIC", raising=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    try:
        with pytest.raises(DeviceUnavailableError, match="HCCL_DETERMINISTIC=true before the process group"):
            set_deterministic(True, "npu")
        monkeypatch.setenv("HCCL_DETERMINISTIC", "true")
        set_deterministic(True, "npu")
    finally:
        torch.use_deterministic_algorithms(False)


def test_latency_engine_orders_copies_only_by_their_dependencies() -> None:
    """Two lanes with random delays: a copy with ``after`` starts only once its dependencies have landed
    (a grouped handle counts each of its copies), and the simulated bandwidth sets each copy's duration."""
    from trex.runtime.copy_engine import LatencyCopyEngine

    engine = LatencyCopyEngine(0.01, jitter=1e-3, seed=1)  # 10 MB/s: 40 KB take 4 ms
    a, b, c = torch.zeros(10_000), torch.zeros(10_000), torch.zeros(10_000)
    first = engine.copy_many([(a, torch.ones(10_000)), (b, torch.full((10_000,), 2.0))], to_host=True)
    second = engine.copy(c, a, after=[first])  # reads a only after the grouped copy wrote it
    second.wait()
    assert torch.equal(c, torch.ones(10_000)) and len(first.leaves()) == 2
    assert second.seconds() >= 0.004 and first.seconds() >= 0.008
    with pytest.raises(ValueError, match="gbps"):
        LatencyCopyEngine(0)
    engine.close()
