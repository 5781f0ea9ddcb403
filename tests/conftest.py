"""Repository-wide test fixtures and helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_BENCHMARKS = REPO.parent / "shared" / "benchmarks"

# The helpers folder holds reusable test servers and drivers.
sys.path.insert(0, str(REPO / "tests" / "helpers"))
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def shared_benchmarks() -> Path:
    """The public OR benchmark files (tests using them skip when the folder is absent)."""
    if not SHARED_BENCHMARKS.is_dir():
        pytest.skip("../shared/benchmarks is not present")
    return SHARED_BENCHMARKS
