"""What `trex eval` tells the user: the first failed request's cause on the console (not only in
errors.jsonl), progress lines without an absurd first rate, and an HTML report with the run date, the
endpoint and a drill-down of every sample (prompt, response, program, sandbox output, verdict)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from helpers.scripted_openai import ScriptedOpenAI
from trex.evaluation.cli import main as eval_main

ROOT = Path(__file__).resolve().parents[3]


def _dataset(path: Path, answers: list[str]) -> Path:
    path.write_text("\n".join(json.dumps({"en_question": f"question number {i}", "en_answer": a})
                              for i, a in enumerate(answers)) + "\n")
    return path


def test_the_first_failed_request_is_explained_on_the_console(tmp_path: Path) -> None:
    data = _dataset(tmp_path / "d.jsonl", ["1", "2", "3"])

    def refuse(req: dict[str, Any]) -> Any:
        return (401, {"error": {"message": "invalid api key sk-test"}})

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "workloads"), str(ROOT / "operator")])}
    with ScriptedOpenAI(refuse) as srv:
        r = subprocess.run([sys.executable, "-m", "trex", "eval", "--benchmark", f"nl4opt={data}",
                            "--model", f"openai:{srv.url}#m", "--set", "model.retries=0",
                            "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1, r.stderr
    failed = [line for line in r.stderr.splitlines() if line.startswith("model request failed")]
    assert len(failed) == 1, r.stderr  # the first one, not one line per failure
    assert "nl4opt/0 sample 0 (HTTP 401)" in failed[0] and "invalid api key" in failed[0], failed
    assert "errors.jsonl" in failed[0]
    assert len((tmp_path / "out" / "errors.jsonl").read_text().splitlines()) == 3
    progress = [line for line in r.stderr.splitlines() if line.startswith("[eval]")]
    assert progress[0] == "[eval] 0/3 (0.0%)", progress  # the clock starts before the first request


def test_the_html_report_drills_down_to_every_sample(tmp_path: Path) -> None:
    data = _dataset(tmp_path / "d.jsonl", ["3", "-2.5"])
    out = tmp_path / "out"
    assert eval_main(["--benchmark", f"nl4opt={data}", "--model", "reference", "--out", str(out), "--quiet"]) == 0
    page = (out / "report.html").read_text()
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    run = json.loads((out / "run.json").read_text())
    assert page.count("<details>") == len(samples) == 2
    assert f"Run started {run['started']}; endpoint: reference." in page
    assert run["started"][:4].isdigit() and run["started"].endswith("+00:00")
    for s in samples:
        assert "question number" in s["prompt"]
        assert f"nl4opt / {s['item_id']} #0: <span class='ok'>correct</span>" in page
        for text in (s["prompt"], s["code"], s["execution"]["stdout_tail"].strip()):
            assert text and _escaped(text.splitlines()[0]) in page
        assert f"exit code {s['execution']['exit_code']}" in page
    md = (out / "report.md").read_text()
    assert f"Run started {run['started']}; endpoint: reference." in md


def _escaped(text: str) -> str:
    import html

    return html.escape(text)
