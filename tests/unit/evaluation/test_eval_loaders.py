"""Benchmark loaders: every published file parses with the item counts its README gives; formats
are detected from content; bad input names the file, record and field."""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections import Counter
from pathlib import Path

import pytest
from trex.evaluation.benchmarks import detect_format, load_benchmark
from trex.verify.items import parse_truth

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "benchmarks"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/benchmarks not present")

# (benchmark name, file relative to shared/benchmarks, items per its README, detected format)
PUBLISHED = [
    ("nl4opt", "nl4opt/NL4OPT.jsonl", 245, "nl4opt"),
    ("optmath", "optmath_bench/OptMATH_Bench.json", 166, "optmath"),
    ("mamo_easy", "mamo/mamo_easy_lp.jsonl", 652, "mamo"),
    ("mamo_complex", "mamo/mamo_complex_lp.jsonl", 211, "mamo"),
    ("optibench", "optibench/OptiBench.json", 605, "optibench"),
    ("nl4opt_e", "optibench/NL4OPT-E.json", 289, "optibench"),
]


@needs_shared
@pytest.mark.parametrize(("name", "rel", "count", "fmt"), PUBLISHED)
def test_published_files_parse_with_readme_counts(name: str, rel: str, count: int, fmt: str) -> None:
    path = SHARED / rel
    ds = load_benchmark(name, path)
    assert ds.count == count and ds.format == fmt
    assert detect_format(path) == fmt
    assert ds.content_hash == hashlib.sha256(path.read_bytes()).hexdigest()
    assert ds.version.startswith(path.name + "@sha256:")
    assert len({it.id for it in ds.items}) == count
    assert all(it.question for it in ds.items)
    raw = json.loads(path.read_text()) if path.suffix == ".json" else [
        json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(raw) == count
    if fmt == "optibench":
        assert all(it.named and it.truth is None for it in ds.items)
        first = raw[0]["results"]
        assert {k: t.value for k, t in ds.items[0].named.items()} == {k: float(v) for k, v in first.items()}
    else:
        key = "Answer" if fmt == "mamo" else "en_answer"
        for r, it in zip(raw, ds.items, strict=True):
            assert it.truth is not None
            if it.truth.status == "optimal":
                assert it.truth.value == float(r[key])
            else:
                assert r[key] == "No Best Solution"


@needs_shared
def test_nl4opt_label_answers_and_limit() -> None:
    ds = load_benchmark("nl4opt", SHARED / "nl4opt/NL4OPT.jsonl")
    assert Counter(it.truth.status for it in ds.items if it.truth) == {"optimal": 228, "no_solution": 17}
    assert load_benchmark("nl4opt", SHARED / "nl4opt/NL4OPT.jsonl", limit=5).count == 5


@needs_shared
def test_bench4opt_tarball_and_folders_agree(tmp_path: Path) -> None:
    tar = SHARED / "bench4opt" / "bench4opt.tar.gz"
    ds = load_benchmark("bench4opt", SHARED / "bench4opt")
    assert ds.count == 425 and ds.format == "bench4opt"
    classes = Counter(it.meta["class"] for it in ds.items)
    assert classes == {"LP": 213, "MILP": 212}
    assert len({it.category for it in ds.items}) == 16
    assert all("data.json" in it.files and it.reference_lp and "Subject To" in it.reference_lp for it in ds.items)
    assert load_benchmark("bench4opt", tar).content_hash == ds.content_hash
    # Extract three instances as plain folders: same items, same text, same files.
    picked = sorted({it.id for it in ds.items})[:3]
    with tarfile.open(tar) as tf:
        members = [m for m in tf.getmembers()
                   if m.isfile() and any(m.name.startswith(p + "/") for p in picked)]
        tf.extractall(tmp_path, members=members, filter="data")
    sub = load_benchmark("bench4opt", tmp_path)
    assert [it.id for it in sub.items] == picked
    by_id = {it.id: it for it in ds.items}
    for it in sub.items:
        assert it.question == by_id[it.id].question and it.files == by_id[it.id].files
        assert it.reference_lp == by_id[it.id].reference_lp


def _industryor(path: Path, rows: list[tuple[str, str, str]], with_id: bool) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i, (q, a, d) in enumerate(rows):
            rec: dict[str, object] = {"en_question": q, "en_answer": a, "difficulty": d}
            if with_id:
                rec["id"] = 100 + i
            fh.write(json.dumps(rec) + "\n")


@pytest.mark.parametrize(("name", "with_id"), [("industryor", False), ("industryor_fixed", True)])
def test_industryor_original_and_fixed(tmp_path: Path, name: str, with_id: bool) -> None:
    rows = [("Plan shifts.", "1250", "Easy"), ("Route trucks.", "No Best Solution", "Hard"),
            ("Blend fuel.", "-37.5", "Medium")]
    p = tmp_path / f"{name}.json"
    _industryor(p, rows, with_id)
    ds = load_benchmark(name, p)
    assert ds.format == "industryor" and detect_format(p) == "industryor"
    assert [it.category for it in ds.items] == ["Easy", "Hard", "Medium"]
    assert [it.id for it in ds.items] == (["100", "101", "102"] if with_id else ["0", "1", "2"])
    truths = [it.truth for it in ds.items]
    assert truths[0] is not None and truths[0].value == 1250.0 and truths[0].decimals == 0
    assert truths[1] is not None and truths[1].status == "no_solution"
    assert truths[2] is not None and truths[2].value == -37.5 and truths[2].decimals == 1


def test_industryor_fixed_without_difficulty(tmp_path: Path) -> None:
    p = tmp_path / "IndustryOR_fixed.json"
    p.write_text(json.dumps({"en_question": "Assign workers.", "en_answer": "14"}) + "\n"
                 + json.dumps({"en_question": "Mix diet.", "en_answer": "1.5333333333333334"}) + "\n")
    ds = load_benchmark("industryor_fixed", p)
    assert ds.format == "industryor" and [it.category for it in ds.items] == ["", ""]
    assert [it.truth.value for it in ds.items if it.truth] == [14.0, 1.5333333333333334]


def test_ordata_format(tmp_path: Path) -> None:
    p = tmp_path / "heldout.jsonl"
    p.write_text(json.dumps({"id": "a1", "question": "Q", "answer": 12.5, "family": "knapsack"}) + "\n"
                 + json.dumps({"id": "a2", "question": "Q2", "answer": "infeasible", "family": "diet"}) + "\n")
    ds = load_benchmark("ordata", p)
    assert [(it.id, it.category, it.truth.status if it.truth else None) for it in ds.items] == [
        ("a1", "knapsack", "optimal"), ("a2", "diet", "infeasible")]


def test_bad_input_names_file_record_and_field(tmp_path: Path) -> None:
    p = tmp_path / "broken.jsonl"
    p.write_text('{"en_question": "q", "en_answer": "1"}\n{"en_question": "q2"}\n')
    with pytest.raises(ValueError, match=r"broken.jsonl: record 1 has no field 'en_answer'"):
        load_benchmark("nl4opt", p)
    p.write_text('{"en_question": "q", "en_answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=r"line 2 is not valid JSON"):
        load_benchmark("nl4opt", p)
    p.write_text('{"en_question": "q", "en_answer": "about seven"}\n')
    with pytest.raises(ValueError, match=r"record 0 en_answer: answer 'about seven' is neither"):
        load_benchmark("nl4opt", p)
    p.write_text('{"en_question": "q", "en_answer": "1", "id": 3}\n{"en_question": "q", "en_answer": "2", "id": 3}\n')
    with pytest.raises(ValueError, match=r"item id '3' occurs more than once"):
        load_benchmark("nl4opt", p)
    with pytest.raises(ValueError, match="does not exist"):
        load_benchmark("nl4opt", tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("nl5opt", p)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no Bench4Opt instances"):
        load_benchmark("bench4opt", tmp_path / "empty")


def test_content_detection_overrides_a_mismatched_name(tmp_path: Path) -> None:
    p = tmp_path / "mamo_like.jsonl"
    p.write_text(json.dumps({"id": 7, "Question": "q", "Answer": "8350", "Category": "optimization",
                             "Type": "easy_lp"}) + "\n")
    ds = load_benchmark("nl4opt", p)
    assert ds.format == "mamo" and ds.items[0].id == "7" and ds.items[0].category == "easy_lp"


@pytest.mark.parametrize(("raw", "status", "value", "decimals"), [
    ("1160.0", "optimal", 1160.0, 1), ("8350", "optimal", 8350.0, 0), (-2.25, "optimal", -2.25, 2),
    ("1,234.50", "optimal", 1234.5, 2), ("$99", "optimal", 99.0, 0), ("1e3", "optimal", 1000.0, None),
    ("No Best Solution", "no_solution", None, None), ("Infeasible", "infeasible", None, None),
    ("unbounded", "unbounded", None, None), (None, "no_solution", None, None),
])
def test_parse_truth(raw: object, status: str, value: float | None, decimals: int | None) -> None:
    t = parse_truth(raw)
    assert (t.status, t.value, t.decimals) == (status, value, decimals)
