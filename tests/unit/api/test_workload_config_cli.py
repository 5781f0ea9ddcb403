"""Every workload CLI reads its job manifest (`--config`), takes `--set a.b=v` overrides (camelCase paths, YAML
values, a precise error for a bad path) and prints the resolved config; an unknown field names the closest
valid one in `trex validate` and in each CLI; the shipped sample configs load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from trex.config_base import ConfigError, apply_override, load_section, parse_value
from trex.evaluation.cli import main as eval_main
from trex.evaluation.config import EvalConfig
from trex.kernels.cli import main as kernels_main
from trex.kernels.config import KernelTuneConfig
from trex.ordata.cli import main as ordata_main
from trex.ordata.config import ORDataConfig
from trex.trainer.cli import main as train_main
from trex.trainer.config import TrainerConfig
from trex_operator.api import API_VERSION
from trex_operator.validate import check_document

ROOT = Path(__file__).resolve().parents[3]
Main = Callable[[list[str]], int]
# (entry point, its argv before the options, config model, kind, section of the job's spec)
CLIS: dict[str, tuple[Main, list[str], Any, str, str]] = {
    "train": (train_main, [], TrainerConfig, "TrainJob", "trainer"),
    "eval": (eval_main, [], EvalConfig, "EvalJob", "evaluation"),
    "ordata": (ordata_main, ["generate"], ORDataConfig, "ORDataJob", "ordata"),
    "kernels": (kernels_main, ["tune"], KernelTuneConfig, "KernelTuneJob", "kernels"),
}
MANIFESTS = {"train": "trainjob.yaml", "eval": "evaljob.yaml", "ordata": "ordatajob.yaml",
             "kernels": "kerneltunejob.yaml"}
OVERRIDES = {"train": ("data.seed=99", ["data", "seed"], 99),
             "eval": ("model.sampling.temperature=0.5", ["model", "sampling", "temperature"], 0.5),
             "ordata": ("shards.numShards=4", ["shards", "numShards"], 4),
             "kernels": ("budget.seconds=3e1", ["budget", "seconds"], 30.0)}


def _run(cli: str, args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    main, head = CLIS[cli][0], CLIS[cli][1]
    capsys.readouterr()
    rc = main([*head, *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _dig(data: Any, keys: list[str]) -> Any:
    for k in keys:
        data = data[k]
    return data


@pytest.mark.parametrize("cli", list(CLIS))
def test_each_cli_reads_its_job_manifest_with_overrides(cli: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, _, model, kind, section = CLIS[cli]
    manifest = ROOT / "examples" / "quickstart" / MANIFESTS[cli]
    doc = yaml.safe_load(manifest.read_text())
    assert doc["kind"] == kind
    assignment, path, value = OVERRIDES[cli]
    rc, out, err = _run(cli, ["--config", str(manifest), "--set", assignment, "--print-config"], capsys)
    assert rc == 0, err
    printed = yaml.safe_load(out)
    assert _dig(printed, path) == value
    # the printed config reads back as the manifest's own section with the one override applied
    expected = dict(doc["spec"][section])
    apply_override(model, expected, assignment)
    assert load_section(model, printed) == load_section(model, expected)


@pytest.mark.parametrize("cli", list(CLIS))
def test_each_cli_names_a_bad_override_and_an_unknown_field(cli: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    _, _, _, kind, section = CLIS[cli]
    manifest = ROOT / "examples" / "quickstart" / MANIFESTS[cli]
    first = OVERRIDES[cli][1][0]
    typo = first[:-1] + first[-1] * 2  # e.g. "data" -> "dataa"
    rc, _, err = _run(cli, ["--config", str(manifest), "--set", f"{typo}.x=1", "--print-config"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--set {typo}.x: '{typo}' is not a field of the top level; did you mean '{first}'?" in err
    # an unknown field in the file itself: the closest valid name, through the same path as `trex validate`
    doc = yaml.safe_load(manifest.read_text())
    doc["spec"][section][typo] = {}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    rc, _, err = _run(cli, ["--config", str(bad), "--print-config"], capsys)
    assert rc == 2 and f"{typo}: unknown field; did you mean '{first}'?" in err, err
    # another kind's manifest is refused by name
    other = next(k for k in CLIS if k != cli)
    rc, _, err = _run(cli, ["--config", str(ROOT / "examples" / "quickstart" / MANIFESTS[other]), "--print-config"],
                      capsys)
    assert rc == 2 and f"a {CLIS[other][3]!r} manifest; this command reads a {kind}" in err, err


@pytest.mark.parametrize("cli", list(CLIS))
def test_the_sample_configs_load_and_round_trip(cli: str, capsys: pytest.CaptureFixture[str]) -> None:
    model = CLIS[cli][2]
    path = ROOT / "configs" / f"{cli}.yaml"
    rc, out, err = _run(cli, ["--config", str(path), "--print-config"], capsys)
    assert rc == 0, err
    assert load_section(model, yaml.safe_load(out)) == load_section(model, yaml.safe_load(path.read_text()))


@pytest.mark.parametrize(("text", "value"), [
    ("3e-4", 3e-4), ("1E3", 1000.0), ("-2.5", -2.5), ("10", 10), ("true", True), ("null", None),
    ("[rmsnorm_fwd, rope_fwd]", ["rmsnorm_fwd", "rope_fwd"]), ("{min: 1, max: 2}", {"min": 1, "max": 2}),
    ("sft", "sft"), ("'10'", "10"), ("", ""),
])
def test_set_values_are_yaml_scalars_with_every_float_spelling(text: str, value: Any) -> None:
    got = parse_value(text)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(("assignment", "message"), [
    ("optimizer.adamw.lrr=1", "--set optimizer.adamw.lrr: 'lrr' is not a field of optimizer.adamw; did you mean 'lr'?"),
    ("data.microBatchSize.x=1", "--set data.microBatchSize.x: data.microBatchSize is a int, not a mapping"),
    ("data.seqLenCurriculum.3.seqLen=8", "--set data.seqLenCurriculum.3.seqLen: data.seqLenCurriculum is a list "
                                         "of 0 items; '3' is not an index in it"),
    ("maxSteps", "--set 'maxSteps': expected PATH=VALUE"),
    ("max_steps=3", "did you mean 'maxSteps'?"),
])
def test_a_bad_override_path_is_named(assignment: str, message: str) -> None:
    data: dict[str, Any] = {"data": {"microBatchSize": 2, "seqLenCurriculum": []}}
    with pytest.raises(ConfigError) as exc:
        apply_override(TrainerConfig, data, assignment)
    assert message in str(exc.value)


def test_overrides_reach_list_items_and_create_sections() -> None:
    data: dict[str, Any] = {"benchmarks": [{"name": "nl4opt", "path": "a.jsonl"}]}
    apply_override(EvalConfig, data, "benchmarks.0.limit=5")
    apply_override(EvalConfig, data, "execution.workers=2")
    assert data == {"benchmarks": [{"name": "nl4opt", "path": "a.jsonl", "limit": 5}], "execution": {"workers": 2}}


@pytest.mark.parametrize(("kind", "spec", "line"), [
    ("TrainJob", {"trainer": {"maxStep": 1}}, "spec.trainer.maxStep: unknown field; did you mean 'maxSteps'?"),
    ("ORDataJob", {"ordata": {"families": [{"name": "diet", "sise": {}}]}},
     "spec.ordata.families.0.sise: unknown field; did you mean 'size'?"),
    ("EvalJob", {"evaluation": {"benchmarks": [{"name": "nl4opt", "path": "x", "limt": 1}],
                                "model": {"kind": "reference"}}},
     "spec.evaluation.benchmarks.0.limt: unknown field; did you mean 'limit'?"),
    ("KernelTuneJob", {"kernels": {"budget": {"trails": 3}}},
     "spec.kernels.budget.trails: unknown field; did you mean 'trials'?"),
    ("TrainJob", {"trainer": {}, "replica": 2}, "spec.replica: unknown field; did you mean 'replicas'?"),
    ("TrainJob", {"trainer": {"parallelism": {"zz": 1}}},
     "spec.trainer.parallelism.zz: unknown field; allowed: cp, dp, dpReplicate, ep, etp, pp, reshardAfterForward, tp"),
])
def test_validate_suggests_the_closest_field(kind: str, spec: dict[str, Any], line: str) -> None:
    doc = {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": "x"}, "spec": {"deviceType": "cpu", **spec}}
    lines = [f"{p.path}: {p.message}" for p in check_document("f.yaml", 0, doc).problems]
    assert line in lines, lines


def test_a_duplicate_key_in_a_config_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "train.yaml"
    cfg.write_text("maxSteps: 3\nmaxSteps: 4\n")
    rc, _, err = _run("train", ["--config", str(cfg), "--print-config"], capsys)
    assert rc == 2 and "duplicate key 'maxSteps'" in err, err
