"""LLM reconstruction mode: the pipeline sends the problem to an OpenAI-compatible endpoint and gates the
answer; a correct answer is accepted, a wrong objective sense (structural gate) and a code-less answer are
rejected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scripted_openai import ScriptedOpenAI
from trex.ordata.config import ORDataConfig
from trex.ordata.gates import Cleaner
from trex.ordata.generators import FAMILIES, sample_feasible
from trex.ordata.pipeline import plan_instance, run_shard
from trex.ordata.reconstruct import formulation, reference_code
from trex.ordata.render import render


def test_llm_mode_accepts_correct_and_rejects_wrong_answers(tmp_path: Path) -> None:
    base = {"count": 3, "seed": 8, "crossCheckFraction": 0, "families": [{"name": "knapsack"}],
            "shards": {"numShards": 1, "samplesPerFile": 5}, "output": str(tmp_path)}
    answers: list[tuple[str, str]] = []
    probe = ORDataConfig.model_validate(base, by_alias=True)
    for i in range(probe.count):
        plan = plan_instance(probe, i)
        inst, _ = sample_feasible(FAMILIES[plan.family], plan.seed, plan.size)
        text = render(inst, plan.style, plan.form).text  # type: ignore[arg-type]
        code = reference_code(inst, "gurobipy")
        if i == 1:  # wrong objective sense: minimising a knapsack picks nothing
            code = code.replace("GRB.MAXIMIZE", "GRB.MINIMIZE")
        answer = f"{formulation(inst)}\n\n```python\n{code}```\n" if i != 2 else "I cannot write code for this."
        answers.append((Cleaner().clean_text(text).strip(), answer))

    def handler(req: dict[str, Any]) -> str:
        user = next(m["content"] for m in req["messages"] if m["role"] == "user")
        return next(a for key, a in answers if key in user)

    with ScriptedOpenAI(handler) as srv:
        cfg = ORDataConfig.model_validate(
            {**base, "reconstruction": {"mode": "llm", "endpoint": {"url": srv.url, "model": "scripted"}}},
            by_alias=True)
        rep = run_shard(cfg, 0, 1, tmp_path, show_progress=False)
        assert len(srv.requests) == 3
    counts = rep.manifest["counts"]
    assert counts["accepted"] == 1
    # The flipped sense is a different model: the structural gate rejects it before the objective is compared.
    assert counts["rejected"] == {"structure.mismatch": 1, "llm.no_code": 1}
