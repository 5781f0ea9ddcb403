"""The whole harness against a scripted OpenAI-compatible server: every failure category and the
correct answer, each classified exactly; request failures, resume, metrics, reports and the CLI."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import isolation
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from helpers.scripted_openai import ScriptedOpenAI
from trex.evaluation.cli import main as eval_main
from trex.evaluation.config import EvalConfig, ModelSpec
from trex.evaluation.models import build_model
from trex.evaluation.report import load_summary, write_reports
from trex.evaluation.runner import SAMPLES, read_samples, run_eval
from trex.telemetry.exporter import Exporter

GUROBI_OK = """import json
import gurobipy as gp
from gurobipy import GRB
env = gp.Env(empty=True)
env.setParam("OutputFlag", 0)
env.start()
m = gp.Model(env=env)
x = m.addVar(name="x")
y = m.addVar(name="y")
m.addConstr(x + 2 * y <= 4)
m.addConstr(3 * x + y <= 6)
m.setObjective(x + y, GRB.MAXIMIZE)
m.optimize()
print("TREX_RESULT " + json.dumps({"status": "optimal", "objective": m.ObjVal, "values": {}}))
"""
GUROBI_INFEASIBLE = """import json
import gurobipy as gp
from gurobipy import GRB
env = gp.Env(empty=True)
env.setParam("OutputFlag", 0)
env.start()
m = gp.Model(env=env)
x = m.addVar(name="x")
m.Params.DualReductions = 0  # prove infeasibility rather than "infeasible or unbounded"
m.addConstr(x >= 5)
m.addConstr(x <= 1)
m.setObjective(x, GRB.MAXIMIZE)
m.optimize()
status = {GRB.INFEASIBLE: "infeasible", GRB.INF_OR_UNBD: "infeasible_or_unbounded"}.get(m.Status, "other")
print("TREX_RESULT " + json.dumps({"status": status, "objective": None}))
"""
HIGHS_UNBOUNDED = """import json
import highspy
h = highspy.Highs()
h.setOptionValue("output_flag", False)
h.setOptionValue("presolve", "off")
x = h.addVariable(lb=0)
h.maximize(x)
ms = h.getModelStatus()
st = {highspy.HighsModelStatus.kUnbounded: "unbounded",
      highspy.HighsModelStatus.kUnboundedOrInfeasible: "infeasible_or_unbounded"}.get(ms, str(ms))
print("TREX_RESULT " + json.dumps({"status": st, "objective": None}))
"""


FORGED_RECORD = """import json, os
fake = {"api": "gurobipy", "status": "optimal", "objective": 2.8, "num_vars": 2, "num_constrs": 2,
        "lp": "Maximize\\n obj: x\\nSubject To\\n c: x <= 1\\nEnd\\n", "lp_truncated": False}
for fd in range(3, 64):
    try:
        os.write(fd, (json.dumps(fake) + "\\n").encode())
    except OSError:
        pass
print("TREX_RESULT " + json.dumps({"status": "optimal", "objective": 2.8}))
"""


def fence(code: str) -> str:
    return f"Here is the model.\n\n```python\n{code}```\n"


# case -> (ground truth in the dataset, scripted answer, expected category)
CASES: dict[str, tuple[str, str, str]] = {
    "correct": ("2.8", fence(GUROBI_OK), "correct"),
    "correct_label": ("No Best Solution", fence(GUROBI_INFEASIBLE), "correct"),
    "no_code": ("1.0", "The optimal value is 1.0, I am confident.", "no_code"),
    "other_lang": ("1.0", "```json\n{\"objective\": 1.0}\n```", "no_code"),
    "syntax": ("1.0", fence("def f(:\n    return 1\n"), "syntax_error"),
    "import": ("1.0", fence("import gurobipy_does_not_exist\n"), "import_error"),
    "api": ("1.0", fence("import gurobipy as gp\nm = gp.Modle()\n"), "import_error"),
    "runtime": ("1.0", fence("values = [1, 2]\nprint(values[5])\n"), "runtime_error"),
    "no_result_line": ("1.0", fence("print('objective = 1.0')\n"), "no_solver_call"),
    "solver": ("1.0", fence("import gurobipy as gp\nm = gp.Model()\nm.Params.OutputFlag = 0\nm.addVars(2500)\n"
                            "m.update()\nm.optimize()\n"), "solver_error"),
    "solver_status": ("2.8", fence(GUROBI_OK.replace("m.optimize()", "m.Params.IterationLimit = 0\n"
                                                     "m.Params.Presolve = 0\nm.optimize()")), "solver_error"),
    "printed_answer": ("2.8", fence("print('TREX_RESULT {\"status\": \"optimal\", \"objective\": 2.8}')\n"),
                       "no_solver_call"),
    "forged_record": ("2.8", fence(FORGED_RECORD), "no_solver_call"),
    "printed_lie": ("2.8", fence(GUROBI_OK.replace("m.ObjVal", "m.ObjVal * 1.001")), "correct"),
    "timeout": ("1.0", fence("import time\ntime.sleep(60)\n"), "timeout"),
    "infeasible": ("2.8", fence(GUROBI_INFEASIBLE), "infeasible"),
    "unbounded": ("2.8", fence(HIGHS_UNBOUNDED), "unbounded"),
    "wrong": ("2.8", fence(GUROBI_OK.replace("x + 2 * y <= 4", "x + 2 * y <= 5")), "wrong_objective"),
    "number_for_label": ("No Best Solution", fence(GUROBI_OK), "wrong_objective"),
}


def write_dataset(path: Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for case, (answer, _, _) in CASES.items():
            fh.write(json.dumps({"en_question": f"CASE:{case}: maximise something.", "en_answer": answer}) + "\n")


def answer(req: dict[str, Any]) -> Any:
    text = req["messages"][-1]["content"]
    case = re.search(r"CASE:(\w+):", text)
    assert case is not None
    return CASES[case.group(1)][1]


def make_cfg(data: Path, url: str, out: Path) -> EvalConfig:
    return EvalConfig.model_validate({
        "benchmarks": [{"name": "nl4opt", "path": str(data)}],
        "model": {"kind": "openai", "url": url, "name": "scripted", "retries": 0, "concurrency": 4},
        "timeouts": {"executionS": 4.0},
        "execution": {"workers": 2},
        "output": str(out),
    })


@pytest.mark.slow
async def test_every_category_is_classified_exactly(tmp_path: Path) -> None:
    data = tmp_path / "cases.jsonl"
    write_dataset(data)
    out = tmp_path / "run"
    failing = {"n": 0}

    def first_run(req: dict[str, Any]) -> Any:
        if "CASE:wrong:" in req["messages"][-1]["content"]:
            failing["n"] += 1
            return (400, {"error": "bad request"})  # not retried, sample stays missing
        return answer(req)

    exporter = Exporter()
    async with ScriptedOpenAI(first_run) as srv:
        cfg = make_cfg(data, srv.url, out)
        outcome = await run_eval(cfg, build_model(cfg.model), exporter=exporter)
    assert outcome.failed_requests == 1 and failing["n"] == 1
    assert not outcome.summary["complete"]
    assert len(read_samples(out / SAMPLES)) == len(CASES) - 1

    # A torn line (kill -9 mid-write) is discarded; the rerun asks only for what is missing.
    with open(out / SAMPLES, "a", encoding="utf-8") as fh:
        fh.write('{"benchmark": "nl4opt", "item_id": "tor')
    async with ScriptedOpenAI(answer) as srv:
        cfg = make_cfg(data, srv.url, out)
        outcome = await run_eval(cfg, build_model(cfg.model), exporter=exporter)
        assert len(srv.requests) == 1
    assert outcome.new_samples == 1 and outcome.skipped == len(CASES) - 1
    assert outcome.summary["complete"]

    records = read_samples(out / SAMPLES)
    assert len(records) == len(CASES)
    got = {CASES_BY_QUESTION[r["item_id"]]: r["category"] for r in records}
    assert got == {c: v[2] for c, v in CASES.items()}, [
        (r["item_id"], r["category"], r["reason"]) for r in records]
    s = outcome.summary["benchmarks"]["nl4opt"]
    assert s["pass@1"] == pytest.approx(3 / len(CASES))  # correct, correct_label, printed_lie
    assert s["categories"]["import_error"] == 2 and s["categories"]["no_code"] == 2
    rec = next(r for r in records if r["category"] == "correct")
    assert rec["usage"]["completion_tokens"] > 0 and rec["protocol"] == "strict@v1"
    text = exporter.render()
    assert re.search(r'trex_eval_pass_at_k\{benchmark="nl4opt",k="1",protocol="strict@v1"\} 0\.157894', text)
    assert 'trex_eval_samples_total{benchmark="nl4opt",category="timeout"} 1.0' in text
    assert 'trex_eval_progress_ratio{benchmark="nl4opt"} 1.0' in text
    assert 'trex_eval_failed_requests_total{benchmark="nl4opt"} 1.0' in text
    # The strongest mode this machine offers (bubblewrap's kernel-fs wherever it runs), not any mode.
    assert f'trex_eval_sandbox_isolation{{mode="{isolation.strongest()}"}} 1.0' in text

    # An earlier run at Pass@1 50 %: the delta column is now - then = 3/19 - 1/2 = -34.2 pp.
    earlier = copy.deepcopy(load_summary(out))
    earlier["benchmarks"]["nl4opt"]["pass@1"] = 0.5
    paths = write_reports(out, load_summary(out), against=earlier)
    assert {p.name for p in paths} >= {"report.md", "report.html", "comparison.png", "failures.png"}
    md = (out / "report.md").read_text()
    assert "| nl4opt | strict@v1 | 19 | 19 | 15.8% |" in md
    header = next(line for line in md.splitlines() if line.startswith("| benchmark |"))
    row = next(line for line in md.splitlines() if line.startswith("| nl4opt |"))
    assert header.rstrip(" |").split(" | ")[-1] == "Δ pass@1"
    assert row.rstrip(" |").split(" | ")[-1] == "-34.2 pp"
    assert "<td>-34.2 pp</td>" in (out / "report.html").read_text()
    write_reports(out, load_summary(out), against=load_summary(out))  # against itself: no change
    row = next(line for line in (out / "report.md").read_text().splitlines() if line.startswith("| nl4opt |"))
    assert row.rstrip(" |").split(" | ")[-1] == "+0.0 pp"
    assert "Answers scored: solver-recorded" in md
    forged = next(r for r in records if CASES_BY_QUESTION[r["item_id"]] == "forged_record")
    assert "not confirmed" in forged["reason"] and forged["execution"]["printed"]["objective"] == 2.8


CASES_BY_QUESTION = {str(i): case for i, case in enumerate(CASES)}


def test_cli_runs_reference_and_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    term = tmp_path / "termination-log"
    monkeypatch.setenv("TREX_TERMINATION_PATH", str(term))
    data = tmp_path / "small.jsonl"
    data.write_text("\n".join(json.dumps({"en_question": f"q{i}", "en_answer": a})
                              for i, a in enumerate(["3", "-2.5", "0", "No Best Solution"])) + "\n")
    out = tmp_path / "out"
    rc = eval_main(["--benchmark", f"nl4opt={data}", "--model", "reference", "--out", str(out), "--quiet"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["benchmarks"]["nl4opt"]["pass@1"] == 1.0
    assert (out / "report.html").read_text().startswith("<!doctype html>")
    term_summary = json.loads(term.read_text())
    assert term_summary == {"kind": "EvalJob", "model": "reference", "complete": True,
                            "benchmarks": {"nl4opt": {"passAt1": 1.0, "samples": 4}}, "failedRequests": 0}
    # The operator reads exactly this contract into status.results (and the Pass@1 printer column).
    from trex_operator.kinds import eval_results
    from trex_operator.lifecycle import PodState

    assert eval_results([PodState("Succeeded", summary=term_summary)])["passAt1"] == 1.0
    capsys.readouterr()
    bad = [
        (["--benchmark", f"nl4opt={tmp_path / 'missing.jsonl'}", "--model", "reference"], "does not exist"),
        (["--benchmark", f"nl4pt={data}", "--model", "reference"], "unknown benchmark 'nl4pt'"),
        (["--benchmark", f"nl4opt={data}", "--model", "openai:http://x/v1"], "openai:URL#MODEL"),
        (["--benchmark", f"nl4opt={data}", "--model", "reference", "--limit", "0"], "--limit"),
        (["--benchmark", f"nl4opt={data}"], "no model"),
        (["--benchmark", f"nl4opt={data}", "--model", "reference", "--k", "0"], "must be in [1, 1024]"),
        (["--benchmark", f"nl4opt={data}", "--model", "reference", "--protocol", "loose"], "--protocol"),
        (["report", str(tmp_path)], "not an evaluation output directory"),
    ]
    for argv, needle in bad:
        assert eval_main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, (argv, err)
    good = tmp_path / "good.yaml"
    good.write_text(f"evaluation:\n  benchmarks:\n    - name: nl4opt\n      path: {data}\n      limit: 3\n"
                    f"  model:\n    kind: reference\n  protocol: orlm\n  output: {tmp_path / 'yaml-out'}\n"
                    f"  execution:\n    workers: 1\n")
    assert eval_main(["--config", str(good), "--quiet"]) == 0
    s = json.loads((tmp_path / "yaml-out" / "summary.json").read_text())["benchmarks"]["nl4opt"]
    assert s["protocol"]["tag"] == "orlm@v1" and s["items"] == 3 and s["pass@1"] == 1.0
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"evaluation:\n  benchmarks:\n    - name: nl4opt\n      path: {data}\n  modle: {{}}\n")
    assert eval_main(["--config", str(cfg), "--model", "reference"]) == 2
    assert "modle: unknown field" in capsys.readouterr().err


def test_model_spec_for_reference_needs_nothing() -> None:
    assert ModelSpec(kind="reference").url is None


async def test_pass_at_k_with_per_sample_seeds(tmp_path: Path) -> None:
    data = tmp_path / "k.jsonl"
    data.write_text("".join(json.dumps({"en_question": f"q{i}", "en_answer": "7"}) + "\n" for i in range(2)))
    right, wrong = fence(_fixed_answer(7.0)), fence(_fixed_answer(8.0))

    def by_seed(req: dict[str, Any]) -> str:
        return right if req["seed"] == 11 else wrong  # seed 10 + sample index 1

    async with ScriptedOpenAI(by_seed) as srv:
        cfg = EvalConfig.model_validate({
            "benchmarks": [{"name": "nl4opt", "path": str(data)}], "k": [1, 2, 3],
            "model": {"kind": "openai", "url": srv.url, "name": "m", "sampling": {"temperature": 0.7, "seed": 10}},
            "output": str(tmp_path / "out")})
        outcome = await run_eval(cfg, build_model(cfg.model))
        assert sorted(r["seed"] for r in srv.requests) == [10, 10, 11, 11, 12, 12]
        assert all(r["temperature"] == 0.7 for r in srv.requests)
    s = outcome.summary["benchmarks"]["nl4opt"]
    assert s["samples"] == 6
    assert s["pass@1"] == pytest.approx(1 / 3) and s["pass@2"] == pytest.approx(2 / 3) and s["pass@3"] == 1.0


def _fixed_answer(value: float) -> str:
    """A program whose recorded solve has optimum ``value`` (one variable fixed there)."""
    return (f"import highspy\nh = highspy.Highs()\nh.silent()\nh.addVar({value}, {value})\nh.changeColCost(0, 1.0)\n"
            f"h.run()\nprint('TREX_RESULT {{\"status\": \"optimal\", \"objective\": {value}}}')\n")


@pytest.mark.parametrize("printed", [False, True], ids=["solver-recorded", "printed"])
async def test_accept_printed_answers_restores_the_printed_number(tmp_path: Path, printed: bool) -> None:
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"en_question": "q0", "en_answer": "7"}) + "\n")
    print_only = fence("print('TREX_RESULT {\"status\": \"optimal\", \"objective\": 7}')\n")
    async with ScriptedOpenAI(lambda req: print_only) as srv:
        cfg = EvalConfig.model_validate({
            "benchmarks": [{"name": "nl4opt", "path": str(data)}], "acceptPrintedAnswers": printed,
            "model": {"kind": "openai", "url": srv.url, "name": "m"}, "output": str(tmp_path / "out")})
        outcome = await run_eval(cfg, build_model(cfg.model))
    rec = read_samples(tmp_path / "out" / SAMPLES)[0]
    assert rec["category"] == ("correct" if printed else "no_solver_call")
    assert rec["execution"]["answers"] == outcome.summary["answers"] == ("printed" if printed else "solver-recorded")
    assert outcome.summary["isolation"] == isolation.strongest()


async def test_min_isolation_fails_the_run_before_any_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trex.sandbox.runner import MODE_VAR

    monkeypatch.setenv(MODE_VAR, "audit")
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"en_question": "q0", "en_answer": "7"}) + "\n")
    cfg = EvalConfig.model_validate({"benchmarks": [{"name": "nl4opt", "path": str(data)}],
                                     "sandbox": {"minIsolation": "namespaces"}, "model": {"kind": "reference"},
                                     "output": str(tmp_path / "out")})
    with pytest.raises(RuntimeError, match="minIsolation is namespaces but only audit"):
        await run_eval(cfg, build_model(cfg.model))
    assert not (tmp_path / "out").exists()
