"""The reference model scores 100 % through the whole harness: Bench4Opt under ORGEval (a subset: one
instance per family plus every kind of ground-truth status; the full 425 run in
benchmarks/eval_throughput.py --full), and the answer-only benchmarks with every label kind."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from trex.evaluation.benchmarks import load_benchmark
from trex.evaluation.config import EvalConfig
from trex.evaluation.models import ReferenceModel
from trex.evaluation.runner import SAMPLES, read_samples, run_eval
from trex.verify.formats.bench4opt import reference_truth

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "benchmarks"


def subset_folder(tmp: Path) -> tuple[Path, Counter[str]]:
    """Copy one instance per family, plus the first of each ground-truth status, into plain folders."""
    ds = load_benchmark("bench4opt", SHARED / "bench4opt")
    families: set[str] = set()
    statuses: Counter[str] = Counter()
    for it in ds.items:
        assert it.reference_lp is not None
        st = reference_truth(it.reference_lp).status
        if it.category in families and st in statuses:
            continue
        families.add(it.category)
        statuses[st] += 1
        d = tmp / it.id
        d.mkdir(parents=True)
        (d / "wp.txt").write_text(it.question)
        (d / "data.json").write_text(it.files["data.json"])
        (d / "model.lp").write_text(it.reference_lp)
    return tmp, statuses


@pytest.mark.slow
@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/benchmarks not present")
async def test_reference_scores_100_on_bench4opt_subset(tmp_path: Path) -> None:
    folder, statuses = subset_folder(tmp_path / "b4o")
    assert {"optimal", "infeasible", "infeasible_or_unbounded"} <= set(statuses)
    cfg = EvalConfig.model_validate({"benchmarks": [{"name": "bench4opt", "path": str(folder)}],
                                     "model": {"kind": "reference"}, "output": str(tmp_path / "out"),
                                     "execution": {"workers": 2}})
    outcome = await run_eval(cfg, ReferenceModel())
    s = outcome.summary["benchmarks"]["bench4opt"]
    n = sum(statuses.values())
    assert s["items"] == n >= 16 and s["samples"] == n
    assert s["pass@1"] == 1.0 and s["structural_accuracy"] == 1.0
    assert s["objective_accuracy_feasible"] == 1.0 and s["feasible_samples"] == statuses["optimal"]
    recs = read_samples(tmp_path / "out" / SAMPLES)
    assert all(r["execution"]["lp_collected"] and r["structural_reason"] == "WL-equivalent" for r in recs)


@pytest.mark.parametrize("protocol", ["strict", "orlm", "mamo", "sirl"])
async def test_reference_scores_100_on_answer_only_items(tmp_path: Path, protocol: str) -> None:
    data = tmp_path / "items.jsonl"
    answers = ["1160.0", "-2.5", "0", "1e-9", "123456789.125", "No Best Solution"]
    data.write_text("".join(json.dumps({"en_question": f"q{i}", "en_answer": a}) + "\n" for i, a in enumerate(answers)))
    cfg = EvalConfig.model_validate({"benchmarks": [{"name": "nl4opt", "path": str(data)}], "protocol": protocol,
                                     "model": {"kind": "reference"}, "output": str(tmp_path / "out")})
    outcome = await run_eval(cfg, ReferenceModel())
    s = outcome.summary["benchmarks"]["nl4opt"]
    assert s["pass@1"] == 1.0 and s["samples"] == len(answers)


async def test_reference_on_named_values(tmp_path: Path) -> None:
    data = tmp_path / "optibench.json"
    data.write_text(json.dumps([{"index": 0, "question": "q", "type": "linear-notable",
                                 "results": {"Number of trips": "10.0", "Max fish": "3000.0"}}]))
    cfg = EvalConfig.model_validate({"benchmarks": [{"name": "optibench", "path": str(data)}],
                                     "protocol": "optibench", "model": {"kind": "reference"},
                                     "output": str(tmp_path / "out")})
    outcome = await run_eval(cfg, ReferenceModel())
    assert outcome.summary["benchmarks"]["optibench"]["pass@1"] == 1.0
