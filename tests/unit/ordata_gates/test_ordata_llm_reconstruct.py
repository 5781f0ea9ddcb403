"""LLM reconstructor against a scripted OpenAI-compatible server on loopback, gated for real."""

from __future__ import annotations

import asyncio
import itertools
import textwrap
from typing import Any

import pytest
from scripted_openai import ScriptedOpenAI
from trex.ordata.config import EndpointConfig
from trex.ordata.gates import ast_gate, execution_gate, llm_review, objective_gate
from trex.ordata.llm_reconstruct import ReconstructionError, parse_answer, reconstruct
from trex.sandbox import Limits, run_python

PROBLEM = ("A hiker can pack four items with values 10, 13, 7 and 8 and weights 3, 4, 2 and 3 kilograms. "
           "The backpack holds at most 7 kilograms. Which items maximise the total value?")
VALUES, WEIGHTS, CAPACITY = [10, 13, 7, 8], [3, 4, 2, 3], 7


def reference_optimum() -> float:
    """Brute force over all subsets (independent of any solver)."""
    return float(max(sum(v * p for v, p in zip(VALUES, pick, strict=True))
                     for pick in itertools.product((0, 1), repeat=4)
                     if sum(w * p for w, p in zip(WEIGHTS, pick, strict=True)) <= CAPACITY))


def answer(sense: str = "GRB.MAXIMIZE") -> str:
    code = textwrap.dedent(f"""
        import json
        import gurobipy as gp
        from gurobipy import GRB
        v, w = {VALUES}, {WEIGHTS}
        m = gp.Model()
        m.Params.OutputFlag = 0
        x = m.addVars(4, vtype=GRB.BINARY, name="x")
        m.setObjective(gp.quicksum(v[i] * x[i] for i in range(4)), {sense})
        m.addConstr(gp.quicksum(w[i] * x[i] for i in range(4)) <= {CAPACITY})
        m.optimize()
        print("TREX_RESULT " + json.dumps({{"status": "optimal", "objective": m.ObjVal, "values": {{}}}}))
    """).strip()
    return ("## Variables\nx_i in {0,1}: item i is packed.\n\n## Objective\nmaximize sum v_i x_i\n\n"
            "## Constraints\nsum w_i x_i <= 7\n\nA first draft:\n```python\nprint('draft')\n```\n"
            f"The final program:\n```python\n{code}\n```\n")


def endpoint(url: str, timeout_s: float = 30.0) -> EndpointConfig:
    return EndpointConfig(url=url, model="scripted-model", temperature=0.0, max_tokens=512, timeout_s=timeout_s)


def gate(code: str) -> str:
    g = ast_gate(code)
    if g.accepted:
        run = run_python(code, limits=Limits(timeout_s=60.0))
        g = execution_gate(run)
        if g.accepted:
            g = objective_gate(run.objective, reference_optimum(), 1e-6)
    return g.outcome


def test_correct_answer_is_reconstructed_and_accepted() -> None:
    with ScriptedOpenAI(lambda req: answer()) as srv:
        rec = reconstruct(PROBLEM, endpoint(srv.url), seed=7)
        req = srv.requests[0]
    assert req["model"] == "scripted-model" and req["seed"] == 7 and req["max_tokens"] == 512
    assert req["temperature"] == 0.0
    assert req["messages"][0]["role"] == "system" and "TREX_RESULT" in req["messages"][0]["content"]
    assert PROBLEM in req["messages"][1]["content"]
    assert "print('draft')" not in rec.code and "m.optimize()" in rec.code  # the last block wins
    assert rec.formulation.startswith("## Variables") and "## Constraints" in rec.formulation
    assert rec.usage["completion_tokens"] > 0 and rec.usage["attempts"] == 1
    assert gate(rec.code) == "accepted"


def test_wrong_answer_is_caught_by_the_objective_gate() -> None:
    with ScriptedOpenAI(lambda req: answer("GRB.MINIMIZE")) as srv:
        rec = reconstruct(PROBLEM, endpoint(srv.url))
    assert gate(rec.code) == "objective.mismatch"


def test_answer_without_code_block_is_llm_no_code() -> None:
    with ScriptedOpenAI(lambda req: "The optimum is 23; pack items 1 and 2.") as srv, \
            pytest.raises(ReconstructionError) as info:
        reconstruct(PROBLEM, endpoint(srv.url))
    assert info.value.reason == "llm.no_code"


def test_server_error_then_success_is_retried() -> None:
    calls = {"n": 0}

    def handler(req: dict[str, Any]) -> str | tuple[int, Any]:
        calls["n"] += 1
        return (500, {"error": "overloaded"}) if calls["n"] == 1 else answer()

    with ScriptedOpenAI(handler) as srv:
        rec = reconstruct(PROBLEM, endpoint(srv.url), backoff_s=0.01)
    assert calls["n"] == 2 and rec.usage["attempts"] == 2
    assert "m.optimize()" in rec.code


def test_persistent_errors_and_client_errors_are_llm_http_error() -> None:
    with ScriptedOpenAI(lambda req: (503, "unavailable")) as srv, pytest.raises(ReconstructionError) as info:
        reconstruct(PROBLEM, endpoint(srv.url), retries=2, backoff_s=0.01)
    assert info.value.reason == "llm.http_error" and len(srv.requests) == 3
    with ScriptedOpenAI(lambda req: (400, {"error": "bad request"})) as srv, pytest.raises(ReconstructionError) as info:
        reconstruct(PROBLEM, endpoint(srv.url), retries=2, backoff_s=0.01)
    assert info.value.reason == "llm.http_error" and len(srv.requests) == 1  # 4xx is not retried


def test_slow_endpoint_is_llm_timeout() -> None:
    async def slow(req: dict[str, Any]) -> str:
        await asyncio.sleep(1.5)
        return answer()

    with ScriptedOpenAI(slow) as srv, pytest.raises(ReconstructionError) as info:
        reconstruct(PROBLEM, endpoint(srv.url, timeout_s=0.3))
    assert info.value.reason == "llm.timeout"


def test_parse_answer_variants() -> None:
    form, code = parse_answer("Variables: x\n```py\nx = 1\n```")
    assert (form, code) == ("Variables: x", "x = 1\n")
    with pytest.raises(ReconstructionError, match=r"llm\.no_code"):
        parse_answer("```python\n\n```")  # empty block
    with pytest.raises(ReconstructionError, match=r"llm\.no_code"):
        parse_answer("```\nx = 1\n```")  # untagged blocks are not code answers


async def test_optional_llm_review_through_the_endpoint() -> None:
    verdicts = iter(["ACCEPT", "REJECT: capacity is never stated", "maybe"])
    async with ScriptedOpenAI(lambda req: next(verdicts)) as srv:
        ep = endpoint(srv.url)
        results = [await llm_review(PROBLEM, "Variables ... Objective ... Constraints ...", ep) for _ in range(3)]
        assert "Formulation:" in srv.requests[0]["messages"][1]["content"]
    assert [r.outcome for r in results] == ["accepted", "review.llm_rejected", "review.llm_error"]
    assert results[1].detail == "capacity is never stated"
