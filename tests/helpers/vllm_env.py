"""The vLLM environment the real-server tests start servers from (`make test` creates it with scripts/vllm-venv.sh)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def vllm_venv() -> Path:
    """TREX_VLLM_VENV (relative to the repository) or `.venv-vllm`. Missing: the test is skipped, or fails under
    TREX_REQUIRE_VLLM=1 (CI), so a broken install step cannot pass as a skip."""
    venv = Path(os.environ.get("TREX_VLLM_VENV", REPO / ".venv-vllm"))
    venv = venv if venv.is_absolute() else REPO / venv
    if not (venv / "bin" / "python").exists():
        why = f"no vLLM environment at {venv} (scripts/vllm-venv.sh creates it)"
        if os.environ.get("TREX_REQUIRE_VLLM", "") == "1":
            pytest.fail(f"{why}, and TREX_REQUIRE_VLLM=1 requires it (set TREX_ALLOW_NO_VLLM=1 to opt out)")
        pytest.skip(why)
    return venv
