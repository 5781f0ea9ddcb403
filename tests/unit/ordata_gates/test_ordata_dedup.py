"""Dedup and decontamination: exact and near duplicates, distinct texts, benchmark overlap."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from trex.ordata.config import DedupConfig
from trex.ordata.dedup import OVERLAP, Deduper, load_benchmark_texts, shingles

BENCH = Path(__file__).resolve().parents[3].parent / "shared" / "benchmarks"

PROBLEM_A = (
    "A furniture workshop builds tables and chairs from oak and pine. Each table requires four hours of "
    "carpentry, two hours of finishing and thirty board feet of oak, while each chair requires two hours of "
    "carpentry, one hour of finishing and ten board feet of pine. The workshop has one hundred and twenty "
    "carpentry hours, sixty finishing hours, nine hundred board feet of oak and five hundred board feet of "
    "pine available every week. Tables sell for a profit of seventy dollars and chairs for a profit of thirty "
    "dollars. Local contracts require that at least ten chairs are delivered every week and the showroom can "
    "display at most twenty tables at a time. How many tables and chairs should the workshop build each week "
    "to maximise its total weekly profit?"
)
# Two words changed ("builds" -> "makes", "maximise" -> "maximize"): a paraphrase, still a near duplicate.
PROBLEM_A_EDIT = PROBLEM_A.replace("builds", "makes").replace("maximise", "maximize")
PROBLEM_B = (
    "A hospital schedules nurses over seven days. Each nurse works five consecutive days followed by two days "
    "off. The minimum number of nurses needed on Monday through Sunday is 17, 13, 15, 19, 14, 16 and 11. "
    "Find the smallest total number of nurses that covers the requirement on every day of the week."
)


def jaccard(a: str, b: str) -> float:
    """Exact Jaccard similarity of the shingle sets: the reference the MinHash estimate approximates."""
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb)


def test_exact_duplicates_by_hash_and_by_text() -> None:
    d = Deduper(near_threshold=0.85, num_perm=128)
    assert d.check_and_add("a", "hash-1", PROBLEM_A) is None
    assert d.check_and_add("b", "hash-1", PROBLEM_B) == ("exact", "a")  # same IR, different rendering
    assert d.check_and_add("c", "hash-2", "  " + PROBLEM_A.upper().replace(" ", "  ") + "\n") == ("exact", "a")
    assert len(d) == 1


def test_near_duplicate_paraphrase_is_flagged() -> None:
    assert jaccard(PROBLEM_A, PROBLEM_A_EDIT) > 0.9  # reference similarity well above the threshold
    d = Deduper(near_threshold=0.85, num_perm=128)
    assert d.check_and_add("a", "h1", PROBLEM_A) is None
    assert d.check_and_add("b", "h2", PROBLEM_A_EDIT) == ("near", "a")


def test_distinct_texts_are_not_flagged() -> None:
    assert jaccard(PROBLEM_A, PROBLEM_B) < 0.1
    # Same story, different numbers and products: below the threshold too.
    other = (PROBLEM_A.replace("tables", "desks").replace("chairs", "stools").replace("seventy", "eighty")
             .replace("thirty", "forty").replace("ten", "twelve").replace("twenty", "fifteen")
             .replace("four hours", "three hours").replace("sixty", "ninety"))
    assert jaccard(PROBLEM_A, other) < 0.6
    d = Deduper(near_threshold=0.85, num_perm=128)
    assert d.check_and_add("a", "h1", PROBLEM_A) is None
    assert d.check_and_add("b", "h2", PROBLEM_B) is None
    assert d.check_and_add("c", "h3", other) is None
    assert len(d) == 3


def _write_formats(root: Path) -> None:
    (root / "a.jsonl").write_text(json.dumps({"en_question": PROBLEM_A, "en_answer": 1}) + "\n\n")
    (root / "b.json").write_text(json.dumps([{"question": PROBLEM_B}, {"type": "no question here"}]))
    (root / "c.jsonl").write_text(json.dumps({"id": 1, "Question": "Minimise cost of 3 trucks."}) + "\n")
    inst = root / "bench4opt" / "LP" / "Diet Problem" / "Diet Problem_[x]"
    inst.mkdir(parents=True)
    (inst / "wp.txt").write_text("A dietitian must plan meals with at least 50 grams of protein.")
    (inst / "data.json").write_text(json.dumps({"protein": [1, 2]}))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"A concise problem statement about 7 warehouses."
        info = tarfile.TarInfo("MILP/Facility/F_[y]/wp_concise.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (root / "b4o.tar.gz").write_bytes(buf.getvalue())


def test_load_benchmark_formats(tmp_path: Path) -> None:
    _write_formats(tmp_path)
    items = dict(load_benchmark_texts([tmp_path]))
    assert items["a.jsonl:0"] == PROBLEM_A
    assert items["b.json:0"] == PROBLEM_B
    assert items["c.jsonl:0"] == "Minimise cost of 3 trucks."
    assert items["b4o.tar.gz:MILP/Facility/F_[y]/wp_concise.txt"].endswith("7 warehouses.")
    assert any(k.endswith("wp.txt") and "dietitian" in v for k, v in items.items())
    assert len(items) == 5  # data.json and the item without a question field contribute nothing
    with pytest.raises(FileNotFoundError, match="decontaminate"):
        load_benchmark_texts([tmp_path / "missing"])


def test_benchmark_copy_with_small_edits_is_flagged(tmp_path: Path) -> None:
    _write_formats(tmp_path)
    d = Deduper(DedupConfig(near_threshold=0.85, num_perm=128, decontaminate=[str(tmp_path / "a.jsonl")]))
    assert d.benchmark_items == 1
    assert d.check_and_add("g1", "h1", PROBLEM_A_EDIT) == (OVERLAP, "a.jsonl:0")
    assert d.check_and_add("g2", "h2", PROBLEM_B) is None  # not in the loaded benchmark


@pytest.mark.skipif(not (BENCH / "nl4opt" / "NL4OPT.jsonl").exists(), reason="shared benchmarks absent")
def test_real_nl4opt_item_with_edits_is_flagged() -> None:
    path = BENCH / "nl4opt" / "NL4OPT.jsonl"
    d = Deduper(DedupConfig(decontaminate=[str(path)]))
    assert d.benchmark_items >= 200
    original = json.loads(path.read_text().splitlines()[17])["en_question"]
    words = original.split()
    words[3], words[-2] = "certain", "overall"  # two words changed
    edited = " ".join(words)
    assert jaccard(original, edited) > 0.85
    kind, other = d.check_and_add("gen-1", "h", edited) or ("", "")
    assert kind == OVERLAP
    assert jaccard(dict(load_benchmark_texts([path]))[other], edited) > 0.85
    assert d.check_and_add("gen-2", "h2", PROBLEM_A) is None


def test_invalid_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="near_threshold"):
        Deduper(near_threshold=1.5)
    with pytest.raises(ValueError, match="num_perm"):
        Deduper(num_perm=4)
