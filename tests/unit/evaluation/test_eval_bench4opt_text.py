"""evaluation.bench4OptText picks the question text of each Bench4Opt instance: wp.txt (the default) or
wp_concise.txt, falling back to wp.txt for an instance without a concise text (two published ones)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trex.evaluation.config import EvalConfig
from trex.evaluation.runner import load_datasets


def _instance(root: Path, family: str, name: str, concise: bool) -> None:
    d = root / "LP" / family / name
    d.mkdir(parents=True)
    (d / "wp.txt").write_text(f"long text of {name}")
    if concise:
        (d / "wp_concise.txt").write_text(f"concise text of {name}")
    (d / "data.json").write_text("{}")
    (d / "model.lp").write_text("Maximize\n obj: x\nSubject To\n c: x <= 1\nEnd\n")


@pytest.mark.parametrize(("text", "expected"), [
    (None, ["long text of a", "long text of b"]),
    ("wp", ["long text of a", "long text of b"]),
    ("wp_concise", ["concise text of a", "long text of b"]),
])
def test_bench4opt_text_chooses_the_question(tmp_path: Path, text: str | None, expected: list[str]) -> None:
    root = tmp_path / "bench4opt"
    _instance(root, "fam", "a", concise=True)
    _instance(root, "fam", "b", concise=False)
    cfg = EvalConfig.model_validate({"benchmarks": [{"name": "bench4opt", "path": str(root)}],
                                     "model": {"kind": "reference"}, "output": str(tmp_path / "out"),
                                     **({"bench4OptText": text} if text else {})})
    [ds] = load_datasets(cfg)
    assert sorted(item.question for item in ds.items) == expected


def test_bench4opt_text_rejects_other_values(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"bench4OptText[\s\S]*'wp' or 'wp_concise'"):
        EvalConfig.model_validate({"benchmarks": [{"name": "bench4opt", "path": str(tmp_path)}],
                                   "model": {"kind": "reference"}, "bench4OptText": "short"})
