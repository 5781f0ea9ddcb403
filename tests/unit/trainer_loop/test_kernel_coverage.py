"""A registry the run cannot use is refused before it runs (trex validate, the trainer's own rule, kernelsFrom
across manifests); a covering registry activates its kernels (calls counted) with the losses of eager training
and a coverage per kernel; shapesFrom resolves a TrainJob's shape classes for the tuner, and the operator records
where they came from."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from trex.config_base import load_section
from trex.kernels import registry as reg
from trex.kernels.backends.cpu_c import CpuCBackend
from trex.kernels.suite import SUITE
from trex.kernels.suite.base import shape_bucket
from trex.trainer import kernels as tk
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer
from trex.trainer.model import layers
from trex.trainer.rules import job_problems

REPO = Path(__file__).resolve().parents[3]


def _trainer(registry: Path | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"model": {"preset": "tiny", "overrides": {"nDenseLayers": 2, "mtpDepth": 0}},
                           "maxSteps": 3, "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 2},
                           "optimizer": {"schedule": {"warmupSteps": 1}, "muon": {"lr": 0.004},
                                         "adamw": {"lr": 0.0004}},
                           "deterministic": True}
    if registry is not None:
        out["kernels"] = {"registry": str(registry)}
    return out


def _registry(path: Path, shapes: list[tuple[str, dict[str, int]]], be: CpuCBackend) -> Path:
    r = reg.empty("cpu-c", "cpu:test")
    for kernel, dims in shapes:
        params = {**be.default_params(SUITE[kernel], dims), "THREADS": 1}
        reg.put(r, kernel, dims, "fp32", {"params": params, "source_hash": "", "median_s": 1e-4})
    reg.save(r, path)
    return path


@pytest.fixture
def backend(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> CpuCBackend:
    cache = tmp_path_factory.getbasetemp() / "kernel-cache"
    monkeypatch.setenv("TREX_KERNEL_CACHE", str(cache))
    return CpuCBackend(cache_dir=cache)


def _validate(*docs: dict[str, Any], tmp: Path) -> subprocess.CompletedProcess[str]:
    path = tmp / "jobs.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return subprocess.run([sys.executable, "-m", "trex.cli", "validate", "-q", str(path)], capture_output=True,
                          text=True, timeout=300)


def _job(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "trex.dev/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def test_a_registry_for_other_shapes_is_refused_in_one_line(tmp_path: Path, backend: CpuCBackend) -> None:
    """The suite's default shapes (2048-wide rows) are not the tiny model's: the trainer's rule, `trex validate`
    of a TrainJob naming the file, and of a TrainJob whose kernelsFrom KernelTuneJob tunes them, each one line."""
    other = _registry(tmp_path / "other.json", [("rmsnorm_fwd", dict(SUITE["rmsnorm_fwd"].default_shapes[0]))],
                      backend)
    cfg = load_section(TrainerConfig, _trainer(other))
    problems = job_problems(cfg, 1)
    assert len(problems) == 1 and problems[0][0] == "kernels.registry", problems
    assert "covers none of the run's" in problems[0][1] and "shapesFrom" in problems[0][1]
    res = _validate(_job("TrainJob", "tj", {"trainer": _trainer(other)}), tmp=tmp_path)
    lines = res.stdout.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and "TrainJob/tj: spec.trainer.kernels.registry: covers none" in lines[0], res

    kt = _job("KernelTuneJob", "kt", {"kernels": {"backend": "cpu-c", "suite": "none", "kernels": ["rmsnorm_fwd"]}})
    tj = _job("TrainJob", "tj", {"kernelsFrom": {"name": "kt"}, "trainer": _trainer()})
    res = _validate(kt, tj, tmp=tmp_path)
    lines = res.stdout.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and "TrainJob/tj: spec.kernelsFrom: KernelTuneJob kt tunes none" \
        in lines[0], res
    kt["spec"]["kernels"]["shapesFrom"] = {"trainJob": "tj"}  # tuned at the TrainJob's shapes: accepted
    assert _validate(kt, tj, tmp=tmp_path).returncode == 0


def test_a_covering_registry_activates_with_eager_losses_and_reports_coverage(tmp_path: Path,
                                                                              backend: CpuCBackend) -> None:
    """Registry entries for RMSNorm and SwiGLU forward at exactly the shapes shapesFrom derives: every one active,
    called in training (calls counted), the losses of eager training within the kernels' fp32 tolerance, and the
    coverage naming the run's other kernels as untuned."""
    from trex.kernels.config import KernelTuneConfig
    from trex_operator.kernel_shapes import with_shapes

    base = load_section(TrainerConfig, {**_trainer(), "checkpoint": {"dir": str(tmp_path / "e"), "resume": False}})
    tune = with_shapes(KernelTuneConfig(suite="none", kernels=["rmsnorm_fwd", "swiglu_clamp_fwd"]), base, "test")
    shapes = [(s.kernel, dict(s.dims)) for s in tune.shapes]
    assert shapes == [(k, d) for k, d in tk.run_kernel_shapes(base, "cpu") if k in ("rmsnorm_fwd", "swiglu_clamp_fwd")]
    path = _registry(tmp_path / "r.json", shapes, backend)
    cfg = load_section(TrainerConfig, {**_trainer(path), "checkpoint": {"dir": str(tmp_path / "t"), "resume": False}})
    assert job_problems(cfg, 1) == []
    eager = Trainer(base, tmp_path / "e", measure_peak=False, log=lambda _m: None)
    eager_losses = [r.loss for r in eager.run(3).history]
    logs: list[str] = []
    tr = Trainer(cfg, tmp_path / "t", measure_peak=False, log=logs.append)
    try:
        losses = [r.loss for r in tr.run(3).history]
        cov = tr.kernels.coverage()
        want = {f"fp32/{shape_bucket(d)}" for _, d in shapes}
        for name in ("rmsnorm_fwd", "swiglu_clamp_fwd"):
            assert set(cov[name]["active"]) == set(cov[name]["tuned"]) == {
                f"fp32/{b}" for b in cov[name]["run"]} and not cov[name]["refused"]
            assert set(cov[name]["active"]) <= set(cov[name]["called"]) and tr.kernels.calls[name] >= 3
        assert {f"fp32/{b}" for n in ("rmsnorm_fwd", "swiglu_clamp_fwd") for b in cov[n]["run"]} == want
        assert cov["rmsnorm_bwd"]["tuned"] == [] and cov["rmsnorm_bwd"]["run"]  # called by the run, not tuned
        assert any(m.startswith("kernels coverage") and "rmsnorm_fwd 2/2/2" in m for m in logs), logs
        assert tr.kernels.summary()["coverage"] == cov
        from trex.telemetry.exporter import Exporter

        ex = Exporter()
        tr.kernels.export(ex, "job")
        text = ex.render()
        for what, n in (("run", 2), ("tuned", 2), ("active", 2), ("refused", 0), ("called", 2)):
            assert f'trex_train_kernel_coverage{{classes="{what}",job_name="job",kernel="rmsnorm_fwd"}} {n}.0' in text, \
                text
        assert losses == pytest.approx(eager_losses, rel=1e-4) and losses != eager_losses
    finally:
        tk.install(None, {}, 1, [1], "cpu", lambda _m: None)
    assert not layers.TUNED


def test_operator_resolves_shapes_from_and_records_the_lineage() -> None:
    """A KernelTuneJob with shapesFrom: Pending while the TrainJob does not exist; then its rendered config tunes
    the TrainJob's shape classes (the trainer's derivation) and its lineage names the TrainJob."""
    import datetime as dt

    from trex_operator.engine import plan_job
    from trex_operator.plan import Observed

    docs = {d["kind"]: d for p in ("kerneltunejob.yaml", "trainjob.yaml")
            for d in yaml.safe_load_all((REPO / "examples/quickstart" / p).read_text())}
    kt = copy.deepcopy(docs["KernelTuneJob"])
    kt["metadata"].update(namespace="ns", uid="uid-k")
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    waiting = plan_job(copy.deepcopy(kt), Observed(now=now, refs={("TrainJob", "quickstart-train"): None}))
    assert waiting.status["reason"] == "WaitingForShapes" and not waiting.ensure
    tj = {**docs["TrainJob"], "metadata": {"name": "quickstart-train", "uid": "uid-t"}}
    plan = plan_job(copy.deepcopy(kt), Observed(now=now, refs={("TrainJob", "quickstart-train"): tj}))
    cm = next(m for m in plan.ensure if m["kind"] == "ConfigMap")
    rendered = yaml.safe_load(cm["data"]["kernels.yaml"])["kernels"]
    trainer = load_section(TrainerConfig, tj["spec"]["trainer"])
    assert [(s["kernel"], s["dims"]) for s in rendered["shapes"]] == [
        (k, d) for k, d in tk.run_kernel_shapes(trainer, "cpu") if k in ("rmsnorm_fwd", "swiglu_clamp_fwd")]
    assert rendered["shapesFrom"] is None
    (entry,) = plan.status["lineage"]
    assert (entry["kind"], entry["name"], entry["uid"]) == ("TrainJob", "quickstart-train", "uid-t")
    assert entry["detail"].startswith("shapes from: 5 shape classes")


@pytest.mark.parametrize("covering", [True, False])
def test_kernels_from_lineage_and_refusal_at_dependency_time(covering: bool) -> None:
    """The TrainJob's lineage says its KernelTuneJob was tuned at its shapes (shapesFrom names it); a KernelTuneJob
    whose tuned classes miss every one of the run's fails the TrainJob with one line naming kernelsFrom."""
    import datetime as dt

    from trex_operator.engine import plan_job
    from trex_operator.plan import Observed

    docs = {d["kind"]: d for p in ("kerneltunejob.yaml", "trainjob.yaml")
            for d in yaml.safe_load_all((REPO / "examples/quickstart" / p).read_text())}
    tj = copy.deepcopy(docs["TrainJob"])
    tj["metadata"].update(namespace="ns", uid="uid-t")
    del tj["spec"]["dataFrom"]
    bucket = "cols64-rows4096" if covering else "cols2048-rows512"  # the run's hidden-size norm, or the suite's
    kt = {**docs["KernelTuneJob"], "status": {"phase": "Succeeded", "results": {
        "backend": "cpu-c", "kernels": {f"rmsnorm_fwd/fp32/{bucket}": {"speedup": 2.0, "params": {"VEC": 16}}}}}}
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    plan = plan_job(tj, Observed(now=now, refs={("KernelTuneJob", "quickstart-kernels"): kt}))
    if covering:
        (entry,) = plan.status["lineage"]
        assert entry["detail"].endswith("tuned at this TrainJob's shapes"), entry
        assert any(m["kind"] == "Pod" for m in plan.ensure)
    else:
        assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "DependencyIncompatible")
        assert plan.status["message"].startswith("kernelsFrom: KernelTuneJob quickstart-kernels's registry covers "
                                                 "none of the run's") and "\n" not in plan.status["message"]


def test_kernels_tune_shapes_from_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`trex kernels tune --shapes-from` a TrainJob manifest or a trainer YAML gives the run's shape classes; a
    config whose shapesFrom is left unresolved is refused in one line, never tuned at the suite's shapes."""
    from trex.kernels.cli import main as kernels_main
    from trex_operator.kernel_shapes import main

    ktj = str(REPO / "examples/quickstart/kerneltunejob.yaml")
    trainer = load_section(TrainerConfig, yaml.safe_load((REPO / "examples/quickstart/trainjob.yaml").read_text())
                           ["spec"]["trainer"])
    want = [(k, d) for k, d in tk.run_kernel_shapes(trainer, "cpu") if k in ("rmsnorm_fwd", "swiglu_clamp_fwd")]
    plain = tmp_path / "trainer.yaml"
    plain.write_text(yaml.safe_dump({"trainer": trainer.model_dump(mode="json", by_alias=True)}))
    for source in (str(REPO / "examples/quickstart/trainjob.yaml"), str(plain)):
        assert main(["tune", "--config", ktj, "--shapes-from", source, "--print-config"]) == 0
        printed = yaml.safe_load(capsys.readouterr().out)
        assert [(s["kernel"], s["dims"]) for s in printed["shapes"]] == want and "shapesFrom" not in printed
    assert kernels_main(["tune", "--config", ktj, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: shapesFrom: names TrainJob quickstart-train"), err
