"""Shared fixtures for the kernel tests: one compiled-kernel cache per test session (hermetic)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernel-cache")


@pytest.fixture(scope="session")
def cpu_backend(kernel_cache: Path):  # type: ignore[no-untyped-def]
    from trex.kernels.backends.base import DeviceFacts
    from trex.kernels.backends.cpu_c import CpuCBackend

    # fixed nominal facts: these tests check behaviour, not this host's measured speed
    facts = DeviceFacts(name="cpu:test", peak_flops=2e11, bandwidth=2e10,
                        caches={"L1": 32 << 10, "L2": 1 << 20, "L3": 32 << 20},
                        level_bandwidth={"L1": 2e11, "L2": 1e11, "L3": 5e10}, cores=2, source="nominal")
    return CpuCBackend(cache_dir=kernel_cache, facts=facts, cores=2)
