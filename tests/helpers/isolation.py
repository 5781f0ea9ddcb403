"""Which sandbox isolation backends this machine offers, and a visible skip (or failure) when one is missing.

``make test`` sets ``TREX_REQUIRE_KERNEL_FS=1`` (unless ``TREX_ALLOW_NO_BWRAP=1``): on such a machine a
missing bubblewrap or user-namespace backend fails the test that needed it instead of skipping it, so a
broken install cannot leave the sandbox untested with a green run.
"""

from __future__ import annotations

import functools
import os
import sys

import pytest

REQUIRE_VAR = "TREX_REQUIRE_KERNEL_FS"


@functools.cache
def available(isolation: str) -> bool:
    """Whether ``isolation`` (kernel-fs, namespaces or audit) runs this interpreter here (probed once)."""
    from trex.sandbox.runner import kernel_fs_available, namespaces_available

    if isolation == "kernel-fs":
        return kernel_fs_available(sys.executable)
    if isolation == "namespaces":
        return namespaces_available()
    return isolation == "audit"


def _available(isolation: str) -> bool:
    """``available``, looked up at call time (a test replaces it to play a machine without a backend)."""
    return available(isolation)


def required() -> bool:
    """Whether this run demands every isolation backend (``TREX_REQUIRE_KERNEL_FS=1``)."""
    return os.environ.get(REQUIRE_VAR, "") == "1"


def need(isolation: str) -> None:
    """Skip the calling test with a reason when ``isolation`` cannot run here; fail instead when required."""
    if _available(isolation):
        return
    why = {"kernel-fs": "bubblewrap cannot run here", "namespaces": "user namespaces are not available here"}
    reason = f"{isolation} isolation: {why.get(isolation, 'unknown mode')}"
    if required():
        pytest.fail(f"{reason}, and {REQUIRE_VAR}=1 requires it (set TREX_ALLOW_NO_BWRAP=1 to opt out)")
    pytest.skip(f"{reason} (make test installs bubblewrap)")


def summary() -> str:
    """One line naming the isolation modes this run exercises and the one the sandbox picks by default."""
    from trex.sandbox import isolation_mode

    modes = ", ".join(f"{m}={'yes' if _available(m) else 'NO'}" for m in ("kernel-fs", "namespaces", "audit"))
    if required():
        demanded = "required (TREX_REQUIRE_KERNEL_FS=1)"
    elif os.environ.get("TREX_ALLOW_NO_BWRAP", "") == "1":
        demanded = "NOT required: opted out by TREX_ALLOW_NO_BWRAP=1 (missing modes skip)"
    else:
        demanded = "not required (missing modes skip)"
    return f"sandbox isolation: default {isolation_mode()}; {modes}; kernel-fs {demanded}"


def strongest() -> str:
    """The mode an ``auto`` sandbox must pick here: kernel-fs where bubblewrap runs (always under
    ``TREX_REQUIRE_KERNEL_FS=1``), else namespaces where user namespaces work, else audit."""
    if required() or _available("kernel-fs"):
        return "kernel-fs"
    return "namespaces" if _available("namespaces") else "audit"
