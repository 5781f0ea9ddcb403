"""`trex eval report DIR [--against DIR2]` on real run folders: it rebuilds the reports from the samples and
compares two runs, with the delta column computed from each run's own samples."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from trex.evaluation.cli import main as eval_main
from trex.evaluation.runner import SAMPLES


def _row(md: Path) -> list[str]:
    line = next(x for x in md.read_text().splitlines() if x.startswith("| nl4opt |"))
    return [c.strip() for c in line.strip("| ").split(" | ")]


def test_report_rebuilds_and_compares_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "small.jsonl"
    data.write_text("\n".join(json.dumps({"en_question": f"q{i}", "en_answer": a})
                              for i, a in enumerate(["3", "-2.5", "0", "7"])) + "\n")
    run = tmp_path / "run"
    assert eval_main(["--benchmark", f"nl4opt={data}", "--model", "reference", "--out", str(run),
                      "--workers", "1", "--quiet"]) == 0
    (run / "report.md").unlink()
    capsys.readouterr()

    assert eval_main(["report", str(run)]) == 0
    printed = capsys.readouterr().out.split()
    assert str(run / "report.md") in printed and str(run / "report.html") in printed
    assert _row(run / "report.md")[:5] == ["nl4opt", "strict@v1", "4", "4", "100.0%"]  # reference answers: 4 of 4

    # An earlier run where one of the four answers was wrong: 75 %, so the delta is +25.0 pp.
    earlier = tmp_path / "earlier"
    shutil.copytree(run, earlier)
    records = [json.loads(x) for x in (earlier / SAMPLES).read_text().splitlines() if x.strip()]
    records[0]["category"] = "wrong"
    (earlier / SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in records))
    assert eval_main(["report", str(earlier)]) == 0
    assert _row(earlier / "report.md")[4] == "75.0%"
    assert eval_main(["report", str(run), "--against", str(earlier)]) == 0
    assert _row(run / "report.md")[-1] == "+25.0 pp"
    assert (run / "comparison.png").stat().st_size > 0
