"""Device selection (npu > cuda > cpu), dtype support, dist backend map, seeding and determinism.

torch is imported inside the functions so that importing :mod:`trex.runtime` stays light; torch_npu
is imported only when it is installed. Process groups are always passed in by callers, never kept here.
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

DeviceKind = Literal["npu", "cuda", "cpu"]
DeviceRequest = Literal["auto", "npu", "cuda", "cpu"]

BACKENDS: dict[str, str] = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}
"""torch.distributed backend per device kind."""


class DeviceUnavailableError(RuntimeError):
    """A device kind was requested explicitly but is not usable in this process."""


def dist_backend(kind: str) -> str:
    """The torch.distributed backend for a device kind (npu->hccl, cuda->nccl, cpu->gloo)."""
    try:
        return BACKENDS[kind]
    except KeyError:
        raise ValueError(f"unknown device kind {kind!r}; allowed: {', '.join(BACKENDS)}") from None


def npu_available() -> bool:
    """True when torch_npu is installed and reports at least one NPU (imports torch_npu only then)."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch

    importlib.import_module("torch_npu")
    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available())


def cuda_available() -> bool:
    """True when torch sees a CUDA device."""
    import torch

    return bool(torch.cuda.is_available())


def choose_kind(request: str, *, npu: bool, cuda: bool) -> DeviceKind:
    """Pure decision: the device kind for ``request`` given what is available (auto: npu > cuda > cpu)."""
    if request == "auto":
        return "npu" if npu else "cuda" if cuda else "cpu"
    if request == "npu":
        if not npu:
            raise DeviceUnavailableError("device 'npu' requested but torch_npu is not installed or sees no NPU")
        return "npu"
    if request == "cuda":
        if not cuda:
            raise DeviceUnavailableError("device 'cuda' requested but torch sees no CUDA device")
        return "cuda"
    if request == "cpu":
        return "cpu"
    raise ValueError(f"unknown device request {request!r}; allowed: auto, npu, cuda, cpu")


@dataclass(frozen=True)
class DeviceInfo:
    """The chosen device: kind, torch.device, dist backend and a human-readable name."""

    kind: DeviceKind
    index: int
    name: str

    @property
    def backend(self) -> str:
        """torch.distributed backend for this device."""
        return dist_backend(self.kind)

    def torch_device(self) -> torch.device:
        """The torch.device (cpu has no index)."""
        import torch

        return torch.device("cpu") if self.kind == "cpu" else torch.device(self.kind, self.index)

    def module(self) -> Any:
        """The torch device module (torch.cuda, torch.npu, torch.cpu) for streams, events and sync."""
        import torch

        return torch.get_device_module(self.kind)


def select_device(request: str = "auto", local_rank: int = 0) -> DeviceInfo:
    """Pick the device for this process: one rank per device, ``local_rank`` selects the index."""
    npu = request in ("auto", "npu") and npu_available()
    cuda = request in ("auto", "cuda") and not npu and cuda_available()
    kind = choose_kind(request, npu=npu, cuda=cuda)
    if kind == "cpu":
        import platform

        return DeviceInfo("cpu", 0, platform.processor() or platform.machine() or "cpu")
    import torch

    mod = torch.get_device_module(kind)
    count = int(mod.device_count())
    index = local_rank % max(count, 1)
    mod.set_device(index)
    return DeviceInfo(kind, index, str(mod.get_device_name(index)))


NPU_SOCS_WITHOUT_BF16 = re.compile(r"^Ascend(910(PremiumA|ProA|ProB|A|B)|310\w*)$")
"""SoC names (torch.npu.get_device_name) without bf16 compute: the first-generation Ascend 910 (910A/B, Pro,
Premium; the 910B1..B4 of Atlas A2 and the 910_93xx of A3 have it) and the Ascend 310 inference chips."""


def npu_bf16(soc: str) -> bool:
    """Whether the Ascend SoC named ``soc`` (e.g. Ascend910B3, Ascend910A) computes in bf16."""
    return not NPU_SOCS_WITHOUT_BF16.match(soc)


def npu_soc() -> str:
    """The SoC name of the current NPU as torch_npu reports it (e.g. Ascend910B3)."""
    import torch

    npu: Any = getattr(torch, "npu")  # noqa: B009 - registered by torch_npu, unknown to type checkers
    return str(npu.get_device_name(npu.current_device()))


def supports_dtype(kind: str, dtype: str, soc: str | None = None) -> bool:
    """Whether ``dtype`` ("fp32", "bf16", "fp16", "fp64") is a sensible compute dtype on ``kind``.

    On npu, bf16 depends on the SoC (``soc``; None asks torch_npu for the current device's).
    """
    if dtype == "fp32":
        return True
    if dtype == "fp64":
        return kind == "cpu"
    if dtype == "bf16":
        if kind == "cuda":
            import torch

            return bool(torch.cuda.is_bf16_supported())
        if kind == "npu":
            return npu_bf16(npu_soc() if soc is None else soc)
        return kind == "cpu"
    if dtype == "fp16":
        return kind in ("npu", "cuda")
    raise ValueError(f"unknown dtype {dtype!r}; allowed: fp32, bf16, fp16, fp64")


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""x86 CPU flags whose presence means native bf16 dot products (bf16 GEMMs about 2x fp32 throughput)."""


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first processor in a /proc/cpuinfo text (empty when none are listed)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def fast_bf16(kind: str) -> bool:
    """Whether bf16 GEMMs beat fp32 on ``kind``: accelerators with bf16 units, CPUs with AVX512-BF16/AMX."""
    if kind in ("npu", "cuda"):
        return supports_dtype(kind, "bf16")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = cpu_flags(f.read())
    except OSError:
        return False
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def torch_dtype(name: str) -> torch.dtype:
    """torch dtype for "fp32" / "bf16" / "fp16" / "fp64"."""
    import torch

    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; allowed: {', '.join(table)}") from None


def seed_everything(seed: int, kind: str = "cpu") -> None:
    """Seed python, numpy, torch and the device generator."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if kind != "cpu":
        torch.get_device_module(kind).manual_seed_all(seed)


def set_deterministic(enabled: bool, kind: str = "cpu") -> None:
    """Switch deterministic kernels on or off (warn-only so unsupported ops do not abort a run).

    On npu, HCCL reads HCCL_DETERMINISTIC when its communicators start: once a process group exists the
    variable must already be set (the operator sets it in the pods; :func:`init_distributed` takes it too).
    """
    import torch

    torch.use_deterministic_algorithms(enabled, warn_only=True)
    if kind == "cuda":
        torch.backends.cudnn.deterministic = enabled
        torch.backends.cudnn.benchmark = not enabled
        if enabled:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if kind == "npu" and enabled:
        import torch.distributed as dist

        if dist.is_initialized() and os.environ.get("HCCL_DETERMINISTIC", "").lower() != "true":
            raise DeviceUnavailableError("deterministic: true on npu needs HCCL_DETERMINISTIC=true before the "
                                         "process group starts; export it (trex's operator sets it in the pods)")
        os.environ["HCCL_DETERMINISTIC"] = "true"


def rng_state(kind: str = "cpu") -> dict[str, Any]:
    """Every RNG state (python, numpy, torch, device) so a resumed run draws the same numbers."""
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if kind != "cpu":
        state["device"] = torch.get_device_module(kind).get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], kind: str = "cpu") -> None:
    """Restore the states captured by :func:`rng_state`."""
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if kind != "cpu" and "device" in state:
        torch.get_device_module(kind).set_rng_state_all(state["device"])


def local_rank(rank: int, nproc_per_node: int) -> int:
    """Index of this rank's device on its node (ranks are numbered node by node)."""
    return rank % max(nproc_per_node, 1)


def hccl_env(deterministic: bool) -> dict[str, str]:
    """HCCL variables that must be in the environment before the process group starts."""
    return {"HCCL_DETERMINISTIC": "true"} if deterministic else {}


def init_distributed(kind: str, rank: int, world_size: int, master_addr: str, master_port: int,
                     timeout_s: float = 1800.0, deterministic: bool = False) -> Any:
    """Join the job's default process group (backend from the device kind) and return it for callers to pass on.

    On npu the HCCL environment (:func:`hccl_env`) is set first: HCCL reads it when communicators start.
    """
    from datetime import timedelta

    import torch.distributed as dist

    if kind == "npu":
        os.environ.update(hccl_env(deterministic))
    dist.init_process_group(backend=dist_backend(kind), init_method=f"tcp://{master_addr}:{master_port}",
                            rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    return dist.group.WORLD


def stream_and_event(kind: str) -> tuple[Any, Any]:
    """A side stream and an event of the device module (CPU's module gives no-op ones)."""
    import torch

    mod = torch.get_device_module(kind)
    return mod.Stream(), mod.Event()
