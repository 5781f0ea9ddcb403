"""A sandbox test whose isolation backend is missing skips visibly, or fails where ``make test`` requires it."""

from __future__ import annotations

import _pytest.outcomes
import isolation
import pytest


def test_missing_backend_skips_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation, "available", lambda mode: mode == "audit")
    monkeypatch.delenv(isolation.REQUIRE_VAR, raising=False)
    with pytest.raises(_pytest.outcomes.Skipped, match=r"^kernel-fs isolation: bubblewrap cannot run here"):
        isolation.need("kernel-fs")
    with pytest.raises(_pytest.outcomes.Skipped, match=r"^namespaces isolation: user namespaces are not available"):
        isolation.need("namespaces")
    isolation.need("audit")  # always there: no skip


def test_missing_backend_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation, "available", lambda mode: mode == "audit")
    monkeypatch.setenv(isolation.REQUIRE_VAR, "1")
    with pytest.raises(pytest.fail.Exception, match="TREX_REQUIRE_KERNEL_FS=1 requires it"):
        isolation.need("kernel-fs")
    assert "kernel-fs=NO, namespaces=NO, audit=yes; kernel-fs required" in isolation.summary()


def test_opt_out_is_named_in_the_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation, "available", lambda mode: mode == "audit")
    monkeypatch.setenv(isolation.REQUIRE_VAR, "0")
    monkeypatch.setenv("TREX_ALLOW_NO_BWRAP", "1")
    monkeypatch.setenv("TREX_SANDBOX_MODE", "audit")
    assert isolation.summary() == (
        "sandbox isolation: default audit; kernel-fs=NO, namespaces=NO, audit=yes; "
        "kernel-fs NOT required: opted out by TREX_ALLOW_NO_BWRAP=1 (missing modes skip)")
