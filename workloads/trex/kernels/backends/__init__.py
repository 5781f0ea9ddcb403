"""Kernel backends behind one interface: cpu-c (gcc + OpenMP), cuda-triton, npu-ascendc."""

from __future__ import annotations

from typing import Any

from trex.kernels.backends.base import Backend, BackendUnavailable, Compiled, DeviceFacts

__all__ = ["Backend", "BackendUnavailable", "Compiled", "DeviceFacts", "coverage", "get_backend"]


def get_backend(name: str, **options: Any) -> Backend:
    """Instantiate a backend by its config name (imports its toolchain lazily)."""
    if name == "cpu-c":
        from trex.kernels.backends.cpu_c import CpuCBackend

        return CpuCBackend(**options)
    if name == "cuda-triton":
        from trex.kernels.backends.triton import TritonBackend

        return TritonBackend(**options)
    if name == "npu-ascendc":
        from trex.kernels.backends.ascendc import AscendCBackend

        return AscendCBackend(**options)
    raise ValueError(f"backend {name!r} unknown; expected cpu-c, cuda-triton or npu-ascendc")


def coverage(name: str) -> dict[str, tuple[str, ...]]:
    """Kernel -> dtypes the backend ``name`` has templates for (what `trex validate` checks a job against)."""
    from trex.kernels.suite import SUITE

    if name == "cpu-c":
        from trex.kernels.backends.cpu_c import _TEMPLATES

        return {k: SUITE[k].dtypes for k in _TEMPLATES}
    if name == "cuda-triton":
        from trex.kernels.backends.triton import TRITON_KERNELS

        return {k: SUITE[k].dtypes for k in TRITON_KERNELS}
    if name == "npu-ascendc":
        from trex.kernels.backends.ascendc import ASCEND_KERNEL_DTYPES

        return dict(ASCEND_KERNEL_DTYPES)
    raise ValueError(f"backend {name!r} unknown; expected cpu-c, cuda-triton or npu-ascendc")
