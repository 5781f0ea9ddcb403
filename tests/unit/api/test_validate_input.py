"""`trex validate` input rules beyond the models: duplicate YAML keys are refused (not last-wins),
objects larger than the API server stores are refused, and a directory's invalid/ folder is skipped."""

from __future__ import annotations

from pathlib import Path

from trex_operator.validate import MAX_OBJECT_BYTES, iter_documents, manifest_files

REPO = Path(__file__).resolve().parents[3]
JOB = "apiVersion: trex.dev/v1alpha1\nkind: TrainJob\nmetadata: {name: d}\nspec:\n"


def _lines(path: Path) -> list[str]:
    return [p.line() for c in iter_documents([str(path)]) for p in c.problems]


def test_duplicate_keys_are_refused_with_both_lines(tmp_path: Path) -> None:
    f = tmp_path / "dup.yaml"
    f.write_text(JOB + "  replicas: 1\n  trainer: {}\n  replicas: 2\n")
    assert _lines(f) == [f"{f}: <file>: line 7, column 3: not valid YAML: duplicate key 'replicas' (first at line 5)"]
    f.write_text(JOB + "  replicas: 2\n  trainer: {}\n")
    assert _lines(f) == []


def test_objects_over_the_api_server_limit_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "big.yaml"
    f.write_text(JOB + "  trainer: {}\n  env:\n" + f"    - {{name: BLOB, value: {'x' * MAX_OBJECT_BYTES}}}\n")
    [line] = _lines(f)
    assert "TrainJob/d: <root>: the object is" in line and "at most 1572864" in line


def test_directories_skip_their_invalid_folder() -> None:
    files = manifest_files(REPO / "examples")
    assert files and not [f for f in files if "invalid" in f.parts]
    assert REPO / "examples" / "quickstart" / "trainjob.yaml" in files
    assert manifest_files(REPO / "examples" / "invalid")          # named explicitly, it is read
