"""Bad manifests refused cheaply: a job referencing itself, reference cycles (modelFrom, dataFrom, opd
teachers) across documents and files and in the cluster, a YAML anchor bomb and an over-size file each get
one precise line (validate) or a Failed phase with a DependencyCycle condition and Event (operator)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml
from trex.config_base import ConfigError, StrictLoader, read_yaml
from trex_operator import refgraph
from trex_operator.engine import plan_job
from trex_operator.plan import Observed
from trex_operator.validate import main

ROOT = Path(__file__).resolve().parents[3]
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def train(name: str, **refs: Any) -> dict[str, Any]:
    """The quickstart SFT TrainJob renamed, with ``refs`` (dataFrom, modelFrom, ...) in place of its dataFrom."""
    doc = yaml.safe_load((ROOT / "examples/quickstart/trainjob.yaml").read_text())
    doc["metadata"]["name"] = name
    del doc["spec"]["dataFrom"]
    doc["spec"]["trainer"]["data"]["train"] = "/data/x.jsonl"
    doc["spec"].update(refs)
    return doc


def opd(name: str, teacher: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples/quickstart/trainjob-opd.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["trainer"]["opd"]["teachers"] = [{"name": teacher, "weight": 1.0}]
    return doc


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *files: list[dict[str, Any]]) -> tuple[int, list[str]]:
    paths = []
    for i, docs in enumerate(files):
        p = tmp_path / f"m{i}.yaml"
        p.write_text(yaml.safe_dump_all(docs))
        paths.append(str(p))
    code = main(["-q", *paths])
    return code, capsys.readouterr().out.splitlines()


def test_self_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run(tmp_path, capsys, [train("a", modelFrom={"name": "a"})])
    assert code == 1 and len(lines) == 1
    assert lines[0].endswith("TrainJob/a: spec.modelFrom: TrainJob/a references itself; each job would wait for "
                             "its own output forever")


def test_two_job_cycle_in_one_multi_document_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run(tmp_path, capsys, [train("a", modelFrom={"name": "b"}), train("b", modelFrom={"name": "a"})])
    assert code == 1 and len(lines) == 2
    assert "TrainJob/a: spec.modelFrom: TrainJob/a is part of a dependency cycle TrainJob/a -> TrainJob/b -> " \
           "TrainJob/a" in lines[0]
    assert "TrainJob/b -> TrainJob/a -> TrainJob/b" in lines[1]


def test_teacher_cycle_across_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run(tmp_path, capsys, [opd("s", "t")], [train("t", modelFrom={"name": "s"})])
    assert code == 1 and len(lines) == 2
    assert "spec.trainer.opd.teachers[0]: TrainJob/s is part of a dependency cycle TrainJob/s -> TrainJob/t -> " \
           "TrainJob/s" in lines[0]


def test_chain_and_other_namespaces_are_no_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = train("a", modelFrom={"name": "b"})
    other["metadata"]["namespace"] = "elsewhere"
    code, lines = run(tmp_path, capsys, [train("a", modelFrom={"name": "b"}), train("b", modelFrom={"name": "c"}),
                                         train("c"), other, train("b2", modelFrom={"name": "a"})])
    assert (code, lines) == (0, [])


def test_anchor_bomb_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = ["a: &a [" + ",".join(['"lol"'] * 9) + "]"]
    for prev, cur in zip("abcdefghi", "bcdefghij", strict=True):
        rows.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    bomb = "apiVersion: trex.dev/v1alpha1\nkind: TrainJob\nmetadata: {name: bomb}\nspec:\n  labels:\n" + \
        "\n".join("    " + r for r in rows) + "\n"
    assert 500 <= len(bomb) <= 600
    p = tmp_path / "bomb.yaml"
    p.write_text(bomb)
    assert main(["-q", str(p)]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert "not valid YAML: aliases expand the document by" in line and "(at most 100000)" in line
    with pytest.raises(yaml.YAMLError, match="aliases expand"):
        yaml.load(bomb, Loader=StrictLoader)
    with pytest.raises(ConfigError, match="aliases expand"):
        read_yaml(p)


def test_modest_aliases_still_load() -> None:
    assert yaml.load("a: &x {k: [1, 2]}\nb: *x\n", Loader=StrictLoader) == {"a": {"k": [1, 2]}, "b": {"k": [1, 2]}}
    with pytest.raises(yaml.YAMLError, match="recursive alias"):
        yaml.load("a: &x [*x]\n", Loader=StrictLoader)


def test_over_size_file_is_refused_before_parsing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "big.yaml"
    p.write_text(yaml.safe_dump(train("a")) + "# " + "x" * (3 << 20) + "\n")
    assert main(["-q", str(p)]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{p}: <file>: <root>: the file is ") and "refuses requests over 3145728 (3 MiB)" in line
    with pytest.raises(ConfigError, match="at most 3145728"):
        read_yaml(p)


def test_operator_fails_a_cycle_in_the_cluster_with_condition_and_event() -> None:
    a, b = train("a", modelFrom={"name": "b"}), train("b", modelFrom={"name": "a"})
    for doc in (a, b):
        doc["metadata"].update(namespace="ns", uid="u-" + doc["metadata"]["name"])
    plan = plan_job(a, Observed(now=NOW, refs={("TrainJob", "b"): b}))
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "DependencyCycle"
    ring = "TrainJob/a -> TrainJob/b -> TrainJob/a"
    cond = [c for c in plan.status["conditions"] if c["type"] == "WaitingForDependency"]
    assert cond and cond[0]["reason"] == "DependencyCycle" and ring in cond[0]["message"]
    assert [(e.type, e.reason) for e in plan.events if ring in e.message] == [("Warning", "DependencyCycle")]
    self_ref = train("s", modelFrom={"name": "s"})
    self_ref["metadata"].update(namespace="ns", uid="u-s")
    plan = plan_job(self_ref, Observed(now=NOW, refs={("TrainJob", "s"): self_ref}))
    assert plan.status["reason"] == "DependencyCycle" and "TrainJob/s references itself" in plan.status["message"]
    waiting = plan_job(a, Observed(now=NOW, refs={("TrainJob", "b"): train("b")}))
    assert waiting.status["phase"] == "Pending" and waiting.status["reason"] == "WaitingForDependency"


def test_find_cycle_is_bounded_on_long_chains() -> None:
    chain = {("TrainJob", f"j{i}"): [("spec.modelFrom", ("TrainJob", f"j{i + 1}"))] for i in range(1000)}
    assert refgraph.find_cycle(("TrainJob", "j0"), lambda n: chain.get(n, [])) is None
    chain[("TrainJob", "j3")] = [("spec.modelFrom", ("TrainJob", "j0"))]
    found = refgraph.find_cycle(("TrainJob", "j0"), lambda n: chain.get(n, []))
    assert found is not None and refgraph.describe(found[1]) == " -> ".join(f"TrainJob/j{i}" for i in (0, 1, 2, 3, 0))
