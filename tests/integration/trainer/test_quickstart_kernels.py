"""The quickstart's KernelTuneJob -> TrainJob chain run locally: `trex kernels tune --shapes-from` the quickstart
TrainJob (a short search), then `trex train` on that TrainJob's trainer section with the registry: the run's
start-up line, final coverage line and termination summary report the tuned kernels active and called."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "examples" / "quickstart"


@pytest.mark.slow
def test_quickstart_trainjob_reports_active_kernels(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TREX_KERNEL_CACHE": str(tmp_path / "cache"),
           "TREX_TERMINATION_PATH": str(tmp_path / "summary.json")}
    trex = [sys.executable, "-m", "trex.cli"]
    tune = subprocess.run([*trex, "kernels", "tune", "--config", str(QUICKSTART / "kerneltunejob.yaml"),
                           "--shapes-from", str(QUICKSTART / "trainjob.yaml"), "--out", str(tmp_path / "tuned"),
                           "--budget-trials", "5", "--budget-seconds", "60", "--threads", "1", "--no-compile"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert tune.returncode == 0, tune.stderr[-2000:]
    tuned = json.loads(tune.stdout)["kernels"]
    assert {k.split("/")[0] for k in tuned} == {"rmsnorm_fwd", "swiglu_clamp_fwd"}
    train = subprocess.run([*trex, "train", "--config", str(QUICKSTART / "trainjob.yaml"),
                            "--set", f"kernels.registry={tmp_path / 'tuned' / 'registry.json'}",
                            "--set", f"checkpoint.dir={tmp_path / 'ckpt'}", "--set", "checkpoint.exportHf=false",
                            "--max-steps", "1", "--out", str(tmp_path / "out")],
                           env=env, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    kernels = summary["kernels"]
    # every class the search tuned (the quickstart TrainJob's own) is active: none refused, none left out
    assert sorted(kernels["active"]) == sorted(tuned) and not kernels["refused"], kernels
    for name in ("rmsnorm_fwd", "swiglu_clamp_fwd"):
        cov = kernels["coverage"][name]
        assert cov["active"] and set(cov["active"]) <= set(cov["tuned"]), cov
    # RMSNorm runs at its two tuned classes (hidden and kv latent); SwiGLU at least at the shared expert's
    assert set(kernels["coverage"]["rmsnorm_fwd"]["called"]) == set(kernels["coverage"]["rmsnorm_fwd"]["active"])
    assert set(kernels["coverage"]["swiglu_clamp_fwd"]["called"]) & set(kernels["coverage"]["swiglu_clamp_fwd"]["active"])
    lines = [ln for ln in train.stderr.splitlines() if ln.startswith("kernels")]
    assert any("tuned kernel(s) active" in ln for ln in lines) and sum("coverage" in ln for ln in lines) == 2, lines
