"""The API foundation: light imports, generated CRDs, structural schemas, examples, `trex validate`."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel
from trex.config_base import TrexModel, load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.rules import parallelism_problems
from trex_operator import crdgen
from trex_operator.api import KIND_INFO, KINDS, TrainJob

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted([*REPO.glob("examples/*.yaml"), *REPO.glob("examples/quickstart/*.yaml")])
INVALID = sorted(REPO.glob("examples/invalid/*.yaml"))
HEAVY = ("torch", "kopf", "gurobipy", "highspy", "triton", "transformers")


def _imported_modules(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True)
    mods = set()
    for line in out.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+\d+ \|\s+(\S.*)$", line)
        if m:
            mods.add(m.group(1).strip())
    assert mods, "importtime printed nothing"
    return mods


@pytest.mark.parametrize("code", ["import trex", "import trex.cli; trex.cli.main(['--help'])",
                                  "import trex_operator.api"])
def test_light_imports(code: str) -> None:
    mods = _imported_modules(code)
    heavy = sorted(m for m in mods if m.split(".")[0] in HEAVY)
    assert heavy == [], f"{code!r} imports heavy modules: {heavy[:5]}"


def test_trex_help_lists_every_command() -> None:
    out = subprocess.run([sys.executable, "-m", "trex", "--help"], capture_output=True, text=True, check=True).stdout
    for cmd in ("validate", "crds", "train", "kernels", "ordata", "eval", "operator", "demo"):
        assert re.search(rf"^\s+{cmd}\s", out, re.M), cmd
    bad = subprocess.run([sys.executable, "-m", "trex", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown command 'nope'" in bad.stderr


def test_checked_in_crds_equal_fresh_generation() -> None:
    fresh = crdgen.render_all()
    for folder in (REPO / "crds", REPO / "charts" / "trex" / "crds"):
        on_disk = {p.name: p.read_text(encoding="utf-8") for p in folder.glob("*.yaml")}
        assert on_disk == fresh, f"{folder} drifted from the models: run `make crds`"


@pytest.mark.parametrize("kind", list(KINDS))
def test_crd_passes_kubernetes_validate(kind: str) -> None:
    kubernetes_validate.validate(crdgen.build_crd(kind), "1.35", strict=True)


def _walk(node: dict[str, Any], path: str = "") -> list[str]:
    """Structural-schema violations (apiextensions rules that the CRD object schema does not check)."""
    errs = []
    for banned in ("$ref", "anyOf", "oneOf", "allOf", "not", "const", "$defs"):
        if banned in node:
            errs.append(f"{path}: {banned} is not allowed")
    if "type" not in node and not node.get("x-kubernetes-int-or-string") and not node.get(
            "x-kubernetes-preserve-unknown-fields"):
        errs.append(f"{path}: no type")
    if "properties" in node and "additionalProperties" in node:
        errs.append(f"{path}: properties and additionalProperties together")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in node and not isinstance(node[key], bool):
            errs.append(f"{path}: {key} must be a boolean in OpenAPI v3.0")
    for name, sub in node.get("properties", {}).items():
        errs += _walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        errs += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        errs += _walk(node["additionalProperties"], f"{path}.*")
    return errs


@pytest.mark.parametrize("kind", list(KINDS))
def test_crd_schema_is_structural(kind: str) -> None:
    crd = crdgen.build_crd(kind)
    version = crd["spec"]["versions"][0]
    assert _walk(version["schema"]["openAPIV3Schema"]) == []
    assert version["subresources"] == {"status": {}}
    assert "trex" in crd["spec"]["names"]["categories"]
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names[0] == "Phase" and names[-1] == "Age"
    assert {"TrainJob": "MFU", "EvalJob": "Pass@1"}.get(kind, "Phase") in names


def _strict_jsonschema(node: Any) -> Any:
    """The CRD schema as the API server applies it with strict field validation (the local API server's
    translation, which its own tests check against kubectl's behaviour)."""
    from trex_operator.local.apimachinery import strict_jsonschema

    return strict_jsonschema(node)


def _schema_errors(doc: dict[str, Any]) -> list[str]:
    kind = doc.get("kind")
    if kind not in KIND_INFO:
        return [f"no CRD serves kind {kind!r}"]
    schema = crdgen.build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft4Validator(_strict_jsonschema(copy.deepcopy(schema)))
    return [e.message for e in validator.iter_errors(doc)]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_accepted_by_schema_and_models(path: Path) -> None:
    docs = list(yaml.safe_load_all(path.read_text()))
    assert docs
    for doc in docs:
        assert _schema_errors(doc) == []
        load_section(KINDS[doc["kind"]], doc)


def test_examples_cover_every_kind() -> None:
    kinds = {d["kind"] for p in EXAMPLES for d in yaml.safe_load_all(p.read_text()) if d}
    assert kinds == set(KINDS)
    assert len(INVALID) >= 8


# Each invalid example: the field that rejects it and the words of its one-line message (every one of them).
INVALID_EXPECT = {
    "01-typo-in-field.yaml": ("spec.trainer.maxStep", "unknown field; did you mean 'maxSteps'?"),
    "02-wrong-type.yaml": ("spec.replicas", "wrong type (str): expected a valid integer"),
    "03-impossible-parallelism.yaml": ("spec.trainer.parallelism.tp", "tp x pp = 3 does not divide the world size 16"),
    "04-ep-not-dividing-experts.yaml": ("spec.trainer.parallelism.ep", "ep=6 does not divide the routed expert count 8"),
    "05-bad-reference-name.yaml": ("spec.dataFrom.name", "'My_Data' is not a valid DNS-1123 label"),
    "06-negative-count.yaml": ("spec.ordata.count", "must be greater than 0"),
    "07-missing-section.yaml": ("spec.trainer", "required field is missing"),
    "08-unknown-kind.yaml": ("kind", "unknown kind 'TrainingJob'; allowed: TrainJob, KernelTuneJob, ORDataJob, EvalJob"),
    "09-npu-devices-per-replica.yaml": ("spec.devicesPerReplica",
                                        "6 is not allowed for deviceType npu; allowed: 1, 2, 4, 8, 16"),
    "10-backend-device-mismatch.yaml": ("spec.deviceType",
                                        "kernels.backend 'cuda-triton' needs deviceType 'gpu', got 'cpu'"),
    "11-bad-enum.yaml": ("spec.evaluation.protocol",
                         "invalid value 'loose'; allowed: 'strict', 'orlm', 'mamo', 'optibench' or 'sirl'"),
    "12-bad-object-name.yaml": ("metadata.name", "'Bad_Name' is not a valid DNS-1123 label"),
    "13-pipeline-parallel.yaml": ("spec.trainer.parallelism.pp", "pipeline parallelism is not run"),
    "14-swap-optimizer.yaml": ("spec.trainer.parallelism", "even with the optimizer states in host memory"),
    "15-opd-samples-not-splitting.yaml": ("spec.trainer.opd.samplesPerPrompt", "not a multiple of tp=2"),
    "16-out-of-memory.yaml": ("spec.trainer.parallelism", "per device; Ascend 910B has 64 GiB: raise ep"),
    "17-kernel-dtype-missing.yaml": ("spec.kernels.dtypes", "npu-ascendc has no bf16 template for rope_fwd"),
    "17-think-max-without-prompt.yaml": ("spec.evaluation.thinkMaxPrompt", "required when reasoningMode is think-max"),
    "18-host-memory.yaml": ("spec.resources.limits.memory", "phase export needs 4.92 GiB of host memory per rank"),
    "18-grpo-inprocess-replica.yaml": ("spec.trainer.rollout.engine", "decodes on a whole unsharded replica per rank"),
    "19-vllm-without-servers.yaml": ("spec.trainer.rollout.servers", "engine vllm needs at least one server URL"),
}


# The invalid examples pydantic itself rejects (not a trex validator): the error type it reports.
MODEL_ERROR_TYPES = {"01-typo-in-field.yaml": "extra_forbidden", "02-wrong-type.yaml": "int_type",
                     "06-negative-count.yaml": "greater_than", "07-missing-section.yaml": "missing",
                     "11-bad-enum.yaml": "literal_error"}


def test_every_invalid_example_has_an_expectation() -> None:
    assert sorted(INVALID_EXPECT) == sorted(p.name for p in INVALID)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_examples_rejected(path: Path) -> None:
    from pydantic import ValidationError
    from trex_operator.validate import check_document

    text = path.read_text()
    marker = re.search(r"rejected-by:\s*([a-z, ]+)", text)
    assert marker, f"{path.name} must say what rejects it"
    by = {w.strip() for w in marker.group(1).split(",")}
    doc = yaml.safe_load(text)
    field, words = INVALID_EXPECT[path.name]
    # `trex validate` and the admission path: the first problem names exactly this field, with these words.
    problems = check_document(str(path), 0, doc).problems
    assert problems, f"{path.name}: accepted"
    assert (problems[0].path, words in problems[0].message) == (field, True), [p.line() for p in problems]
    # The models (used by the operator) reject it too, with the same words in their error.
    if doc.get("kind") not in KINDS:
        assert field == "kind"  # no model serves the kind: the kind check above is what rejects it
    else:
        with pytest.raises(ValidationError) as err:
            load_section(KINDS[doc["kind"]], doc)
        [error] = err.value.errors()
        loc = ".".join(map(str, error["loc"]))
        if error["type"] == "value_error":  # a validator's "field: message", raised at the section it checks
            named = re.match(r"Value error, ([A-Za-z][\w.]*): ", error["msg"])
            assert (f"{loc}.{named.group(1)}" if named else loc, words.split(": ")[-1] in error["msg"]) == (
                field, True), error
        else:  # pydantic's own check: the field and its error type
            assert (loc, error["type"]) == (field, MODEL_ERROR_TYPES[path.name]), error
    if "schema" in by:
        assert _schema_errors(doc), f"{path.name}: the CRD schema accepted it"


def test_validate_cli_valid_and_invalid() -> None:
    ok = subprocess.run([sys.executable, "-m", "trex", "validate", *map(str, EXAMPLES)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, "-m", "trex", "validate", *map(str, INVALID)], capture_output=True, text=True,
                         cwd=REPO)
    assert bad.returncode == 1
    assert "Traceback" not in bad.stdout + bad.stderr
    lines = bad.stdout.strip().splitlines()
    files_with_problems = {line.split(":")[0] for line in lines}
    assert files_with_problems == {str(p) for p in INVALID}
    for line in lines:
        file, obj, field, message = (part.strip() for part in line.split(":", 3))
        assert file.endswith(".yaml") and "/" in obj and field and message
    for name, (field, words) in INVALID_EXPECT.items():
        assert any(name in ln and f": {field}: " in ln and words in ln for ln in lines), (name, lines)


def test_validate_cli_bad_files(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("kind: [unclosed\n")
    (tmp_path / "scalar.yaml").write_text("42\n")
    out = subprocess.run([sys.executable, "-m", "trex", "validate", str(tmp_path / "broken.yaml"),
                          str(tmp_path / "scalar.yaml"), str(tmp_path / "absent.yaml")], capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "not valid YAML" in out.stdout and "expected a mapping" in out.stdout and "cannot read" in out.stdout


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    if model in seen:
        return
    seen.add(model)
    for field in model.model_fields.values():
        for t in _types(field.annotation):
            if isinstance(t, type) and issubclass(t, BaseModel):
                _models(t, seen)


def _types(tp: Any) -> list[Any]:
    args = getattr(tp, "__args__", None)
    if args:
        return [x for a in args for x in _types(a)]
    return [tp]


def test_every_field_is_documented_strict_and_closed() -> None:
    seen: set[type[BaseModel]] = set()
    for m in KINDS.values():
        _models(m, seen)
    assert len(seen) > 30
    for model in seen:
        if not issubclass(model, TrexModel):
            continue
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
        # status.results keeps the workloads' own summary keys beside its typed ones
        if model.__name__ not in ("ObjectMeta", "JobStatus", "Results", "BenchmarkResult"):
            assert model.model_config.get("extra") == "forbid", model.__name__
            assert model.model_config.get("strict") is True, model.__name__


def _train(replicas: int, devices: int, micro: int = 16, **par: int) -> dict[str, Any]:
    # deviceType cpu without a memory limit: the memory plan is not checked (its own tests cover it)
    return {"apiVersion": "trex.dev/v1alpha1", "kind": "TrainJob", "metadata": {"name": "t"},
            "spec": {"replicas": replicas, "devicesPerReplica": devices, "deviceType": "cpu",
                     "trainer": {"model": {"preset": "v4-flash"}, "parallelism": par,
                                 "data": {"microBatchSize": micro, "globalBatchSize": 256}}}}


@pytest.mark.parametrize(("replicas", "devices", "par", "ok"), [
    (2, 8, {"tp": 1, "ep": 16}, True),             # edp = 1, dp = 16
    (2, 8, {"tp": 2, "ep": 8}, True),              # folding: ep x etp = 8 on 16 ranks
    (2, 8, {"tp": 4, "pp": 2, "ep": 8}, True),     # dp = 2; MoE: 16 / (8 x 2) = 1
    (2, 8, {"tp": 2, "dp": 4}, False),             # dp x tp x pp = 8 != 16
    (2, 8, {"ep": 32}, False),                     # ep larger than the world
    (2, 8, {"ep": 8, "etp": 4}, False),            # ep x etp = 32 > 16
    (4, 8, {"ep": 32}, True),                      # 256 experts / 32
    (3, 8, {"ep": 24}, False),                     # 24 divides 24 ranks but not 256 experts
    (1, 8, {"pp": 8}, True),
    (1, 16, {"tp": 8}, True),                      # dp 2 x tp 8
    (1, 16, {"tp": 16}, False),                    # tp 16 does not divide the 8 output groups of V4 attention
    (1, 8, {"tp": 8, "dpReplicate": 2}, False),    # dp = 1 is not a multiple of 2 replicate groups
    (2, 8, {"tp": 2, "dpReplicate": 2}, True),     # HSDP: dp 8 = 2 replicate groups x 4 shards
])
def test_parallel_folding_rules(replicas: int, devices: int, par: dict[str, int], ok: bool) -> None:
    doc = _train(replicas, devices, 16, **par)
    cfg = load_section(TrainerConfig, doc["spec"]["trainer"])
    assert (parallelism_problems(cfg, replicas * devices) == []) is ok
    if ok and par.get("pp", 1) == 1:
        load_section(TrainJob, doc)
    else:  # a folding problem, or pp > 1, which `trex train` does not run yet
        with pytest.raises(ValueError):
            load_section(TrainJob, doc)


def test_tp_must_divide_the_micro_batch_of_moe_layers() -> None:
    odd = _train(1, 8, 2, tp=4)
    odd["spec"]["trainer"]["data"]["seqLen"] = 127  # 254 tokens: the MoE layers split a micro-batch's tokens
    with pytest.raises(ValueError, match=r"parallelism.tp.*microBatchSize"):
        load_section(TrainJob, odd)
    load_section(TrainJob, _train(1, 8, 4, tp=4))
    load_section(TrainJob, _train(1, 8, 1, tp=4))  # micro-batch 1: 128 tokens split over 4 ranks


def test_fp64_reference_runs_are_cpu_only() -> None:
    doc = _train(1, 8, 4)
    doc["spec"]["trainer"]["model"]["dtype"] = "fp64"
    load_section(TrainJob, doc)  # a CPU job
    doc["spec"]["deviceType"] = "gpu"
    with pytest.raises(ValueError, match=r"trainer.model.dtype: fp64 is for CPU reference runs"):
        load_section(TrainJob, doc)
