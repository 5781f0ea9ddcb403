"""ordata.render.styles, ordata.timeLimitS and ordata.sandbox.* do what they say: only the listed styles are
drawn, the solver and the cross-check get the time limit, and the reconstructed code runs under the sandbox
limits (a program past its wall-clock or memory limit is stopped; a job below minIsolation fails at start)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from trex.config_base import load_section
from trex.ordata import pipeline
from trex.ordata.config import ORDataConfig
from trex.sandbox.runner import MODE_VAR


def _cfg(**over: Any) -> ORDataConfig:
    return load_section(ORDataConfig, {"families": [{"name": "knapsack", "size": {"min": 3, "max": 3}}], **over})


def test_render_styles_are_the_only_ones_drawn() -> None:
    one = Counter(pipeline.plan_instance(_cfg(render={"styles": ["bulleted"]}), i).style for i in range(60))
    assert one == {"bulleted": 60}
    two = Counter(pipeline.plan_instance(_cfg(render={"styles": ["formal", "narrative"]}), i).style for i in range(60))
    assert set(two) == {"formal", "narrative"}  # 60 draws of two styles: both occur, no third
    assert set(Counter(pipeline.plan_instance(_cfg(), i).style for i in range(60))) == {"formal", "narrative", "bulleted"}


def test_time_limit_reaches_the_solver_and_the_cross_check(monkeypatch: pytest.MonkeyPatch) -> None:
    limits: list[tuple[str, float]] = []
    real_solve, real_cross = pipeline.solve, pipeline.cross_check

    def solve(inst: Any, solver: Any, time_limit_s: float) -> Any:
        limits.append(("solve", time_limit_s))
        return real_solve(inst, solver, time_limit_s)

    def cross_check(inst: Any, first: Any, tol: Any, time_limit_s: float) -> Any:
        limits.append(("cross_check", time_limit_s))
        return real_cross(inst, first, tol, time_limit_s)

    monkeypatch.setattr(pipeline, "solve", solve)
    monkeypatch.setattr(pipeline, "cross_check", cross_check)
    cfg = _cfg(timeLimitS=7.5, crossCheckFraction=1.0)  # every instance is cross-checked
    out = pipeline.process(pipeline.plan_instance(cfg, 0), cfg, pipeline.StageTimer())
    assert out.sample is not None, (out.reason, out.detail)
    assert set(limits) == {("solve", 7.5), ("cross_check", 7.5)}


def test_sandbox_limits_stop_the_reconstructed_code() -> None:
    slow = pipeline._execute(_cfg(sandbox={"timeoutS": 1.0, "cpuS": 30}), "import time\ntime.sleep(30)\n")
    assert (slow.timed_out, slow.killed_reason) == (True, "timeout")
    spin = pipeline._execute(_cfg(sandbox={"timeoutS": 30.0, "cpuS": 1}), "while True:\n    pass\n")
    assert spin.killed_reason == "cpu_limit"
    big = pipeline._execute(_cfg(sandbox={"memoryMb": 128}), "x = bytearray(512 * 1024 * 1024)\nprint('allocated')\n")
    assert "allocated" not in big.stdout and "MemoryError" in big.stderr
    ok = pipeline._execute(_cfg(sandbox={"memoryMb": 512}), "x = bytearray(64 * 1024 * 1024)\nprint('allocated')\n")
    assert ok.stdout == "allocated\n"


def test_min_isolation_fails_the_shard_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MODE_VAR, "audit")
    with pytest.raises(RuntimeError, match="minIsolation is namespaces but only audit"):
        pipeline.run_shard(_cfg(count=1), 0, 1, tmp_path, show_progress=False)
    assert not any(tmp_path.iterdir())  # nothing was generated
