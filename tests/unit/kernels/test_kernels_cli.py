"""Config validation names the bad field; a tiny real `trex kernels tune` run writes a loadable registry,
results, a report and a termination summary; `trex kernels report` regenerates the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from trex.config_base import load_section
from trex.kernels.cli import main
from trex.kernels.config import KernelTuneConfig


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValidationError, match="samples"):
        load_section(KernelTuneConfig, {"budget": {"samples": 5}})
    with pytest.raises(ValidationError, match=r"gateSeeds|gate_seeds"):
        load_section(KernelTuneConfig, {"gateSeeds": 2})
    with pytest.raises(ValidationError, match="kernels"):
        load_section(KernelTuneConfig, {"suite": "none"})
    with pytest.raises(ValidationError, match="bogus"):
        load_section(KernelTuneConfig, {"bogus": 1})


def test_cli_reports_invalid_flags_by_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--kernels", "not_a_kernel", "--out", "unused"]) == 2
    assert "kernels" in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_tune_run_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    from trex.kernels import registry
    from trex.kernels.backends.cpu_c import CpuCBackend
    from trex.kernels.suite import get

    monkeypatch.setenv("TREX_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TREX_TERMINATION_PATH", str(tmp_path / "termination.json"))
    out = tmp_path / "out"
    args = ["tune", "--suite", "none", "--kernels", "rope_fwd", "--budget-trials", "3", "--threads", "1",
            "--no-compile", "--out", str(out)]
    assert main(args) == 0
    err = capsys.readouterr().err  # the progress line names the problem tuned, not a tiling parameter
    assert "kernel=rope_fwd shape=" in err and "dtype=fp32" in err, err
    reg = registry.load(out / "registry.json")
    spec = get("rope_fwd")
    entry = registry.lookup(reg, "rope_fwd", spec.default_shapes[0], "fp32")
    assert entry is not None
    space = CpuCBackend(cores=2).param_space(spec, spec.default_shapes[0])
    assert entry["params"]["THREADS"] == 1 and all(entry["params"][k] in space[k] for k in entry["params"])
    # the registered source hash names a compiled artefact in the cache
    assert (tmp_path / "cache" / f"{entry['source_hash']}.so").exists()
    res = json.loads((out / "results.json").read_text())["results"][0]
    assert res["trials"] == 3 and res["eager_s"] > 0 and res["compiled_s"] is None
    assert res["n_measured"] >= 2 and len(res["predicted_vs_measured"]) == res["n_measured"]
    summary = json.loads((tmp_path / "termination.json").read_text())
    assert summary["kind"] == "KernelTuneJob" and summary["tuned"] == 1
    md = (out / "report.md").read_text()
    assert "| rope_fwd | fp32 |" in md and (out / "report.png").stat().st_size > 1000
    assert "trex_kernel_speedup{" in (out / "metrics.prom").read_text()
    # a rerun on the same output skips the finished problem (no new trials)
    state_files = list((out / "search").glob("*.json"))
    before = [json.loads(p.read_text())["trials"] for p in state_files]
    assert main(args) == 0
    assert [json.loads(p.read_text())["trials"] for p in state_files] == before
    (out / "report.md").unlink()
    assert main(["report", str(out)]) == 0 and (out / "report.md").exists()
    capsys.readouterr()


def test_yaml_config_and_flags_merge(tmp_path: Path) -> None:
    from trex.kernels.cli import _parser, build_config

    cfg_file = tmp_path / "k.yaml"
    cfg_file.write_text("kernels:\n  suite: none\n  kernels: [rope_fwd, kl_div]\n  budget: {trials: 7, samples: 40}\n"
                        "  dtypes: [fp32, bf16]\n")
    cfg = build_config(_parser().parse_args(["tune", "--config", str(cfg_file), "--budget-seconds", "12",
                                             "--out", str(tmp_path / "o")]))
    assert cfg.kernels == ["rope_fwd", "kl_div"] and cfg.dtypes == ["fp32", "bf16"]
    assert cfg.budget.trials == 7 and cfg.budget.samples == 40 and cfg.budget.seconds == 12.0
    assert cfg.output == str(tmp_path / "o")


def test_gpu_check_fails_clearly_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    import torch
    from trex.kernels.gpu_check import main as gpu_main

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present; this checks the no-GPU path")
    assert gpu_main([]) == 2
    assert "CUDA" in capsys.readouterr().err
