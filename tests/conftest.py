"""Repository-wide test fixtures and helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]
SHARED_BENCHMARKS = REPO.parent / "shared" / "benchmarks"

# The helpers folder holds reusable test servers and drivers.
sys.path.insert(0, str(REPO / "tests" / "helpers"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Property tests draw the same examples on every run (a CI failure reproduces locally; no example database);
# `HYPOTHESIS_PROFILE=explore` draws fresh ones.
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_BENCHMARK_TESTS: set[str] = set()
_BENCHMARK_OUTCOMES: dict[str, str] = {}


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


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say which sandbox isolation modes this run exercises and whether the public benchmark files exist."""
    from isolation import summary

    present = "present" if SHARED_BENCHMARKS.is_dir() else "ABSENT (their tests skip)"
    return [summary(), f"public benchmark files (../shared/benchmarks): {present}"]


def _reads_public_benchmarks(item: pytest.Item) -> bool:
    """A test reads the public benchmark files: it takes the fixture or skips when the folder is absent."""
    if "shared_benchmarks" in getattr(item, "fixturenames", ()):
        return True
    return any("benchmarks" in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Remember the tests that read the public benchmark files, to count them at the end."""
    _BENCHMARK_TESTS.update(item.nodeid for item in items if _reads_public_benchmarks(item))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record how each public-benchmark test ended (runs on the controller under xdist too)."""
    if not getattr(report, "trex_public_benchmarks", False):
        return
    if report.skipped:
        _BENCHMARK_OUTCOMES[report.nodeid] = "skipped"
    elif report.when == "call":
        _BENCHMARK_OUTCOMES[report.nodeid] = "ran"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Tag the reports of public-benchmark tests (xdist carries report attributes to the controller)."""
    outcome = yield
    if item.nodeid in _BENCHMARK_TESTS:
        outcome.get_result().trex_public_benchmarks = True


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """State how many of the public-benchmark tests ran and how many skipped (folder absent)."""
    ran = sum(1 for v in _BENCHMARK_OUTCOMES.values() if v == "ran")
    skipped = sum(1 for v in _BENCHMARK_OUTCOMES.values() if v == "skipped")
    if ran or skipped:
        why = "" if SHARED_BENCHMARKS.is_dir() else " (folder absent)"
        terminalreporter.write_line(f"public benchmark files: {ran} tests ran, {skipped} skipped{why}")
    from isolation import summary

    terminalreporter.write_line(summary())
