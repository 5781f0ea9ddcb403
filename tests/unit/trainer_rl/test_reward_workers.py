"""The OR verifier's parallelism: at most `workers` programs at once, rewards in input order (no sandbox:
the program runner is replaced by one that counts concurrent runs)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from trex.trainer.rl.reward import ORVerifier, RewardWeights, machine_workers
from trex.verify import program
from trex.verify.items import Item, parse_truth
from trex.verify.scoring import Execution


@pytest.mark.parametrize("workers", [1, 3])
def test_runs_at_most_workers_programs_at_once(monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    live, peak = 0, 0

    async def fake_run(code: str, item: Item, **kw: Any) -> tuple[Execution, dict[str, Any], None]:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        await asyncio.sleep(0.01)
        live -= 1
        value = float(code.split()[-1])
        return Execution(0, False, "", {"status": "optimal", "objective": value, "values": {}}), {}, None

    monkeypatch.setattr(program, "run_program", fake_run)
    items = [Item(str(i), "q", parse_truth(str(i % 4))) for i in range(12)]
    texts = [f"```python\nx = {i % 3}\n```" for i in range(12)]
    rewards = asyncio.run(ORVerifier(RewardWeights(0.0, 0.0, 1.0), workers=workers).score(texts, items))
    assert peak == workers
    assert [r.objective for r in rewards] == [float(i % 3 == i % 4) for i in range(12)]
    with pytest.raises(ValueError, match="2 completions for 1 items"):
        asyncio.run(ORVerifier(workers=1).score(["a", "b"], items[:1]))
    assert ORVerifier().workers == machine_workers()
