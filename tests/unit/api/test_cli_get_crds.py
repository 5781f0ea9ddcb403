"""`trex get` (a manifest's printer columns, as `kubectl get` lists them) and `trex crds --out/--chart/--check`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from trex_operator.crdgen import main as crds_main
from trex_operator.crdgen import render_all

REPO = Path(__file__).resolve().parents[3]


def test_get_lists_status_columns_as_kubectl_would(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each kind's printer columns read from the object's status (the CRD's jsonPaths), one table per kind."""
    train = yaml.safe_load((REPO / "examples/quickstart/trainjob.yaml").read_text())
    train["status"] = {"phase": "Running", "progress": {"step": 3, "mfu": 0.25, "loss": 1.5}}
    ev = yaml.safe_load((REPO / "examples/quickstart/evaljob.yaml").read_text())
    ev["status"] = {"phase": "Succeeded", "results": {"passAt1": 0.5}}
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump_all([train, ev]))
    from trex.cli import main as trex_main

    assert trex_main(["get", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    tables: dict[str, list[list[str]]] = {}
    current = ""
    for line in out:
        if line.startswith("# "):
            current = line[2:]
            tables[current] = []
        elif line.strip():
            tables[current].append(line.split())
    assert tables["trainjobs.trex.dev"] == [["NAME", "PHASE", "STEP", "MFU", "LOSS", "AGE"],
                                           ["quickstart-train", "Running", "3", "0.25", "1.5", "<new>"]]
    assert tables["evaljobs.trex.dev"] == [["NAME", "PHASE", "PROGRESS", "PASS@1", "AGE"],
                                          ["quickstart-eval", "Succeeded", "<none>", "0.5", "<new>"]]


def test_crds_out_chart_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--out and --chart both receive every CRD, byte-equal to the checked-in ones; --check passes on them and
    names each stale or missing file (exit 1) once one is edited or removed."""
    out, chart = tmp_path / "crds", tmp_path / "chart" / "crds"
    assert crds_main(["--out", str(out), "--chart", str(chart)]) == 0
    names = sorted(render_all())
    assert names == sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    for d in (out, chart):
        assert sorted(p.name for p in d.iterdir()) == names
        assert all((d / n).read_text() == (REPO / "crds" / n).read_text() for n in names)
    capsys.readouterr()
    assert crds_main(["--out", str(out), "--chart", str(chart), "--check"]) == 0
    assert capsys.readouterr().out == ""
    (out / names[0]).write_text((out / names[0]).read_text() + "# edited\n")
    (chart / names[1]).unlink()
    assert crds_main(["--out", str(out), "--chart", str(chart), "--check"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{out / names[0]}: differs from the models; run `make crds`",
        f"{chart / names[1]}: differs from the models; run `make crds`"]
