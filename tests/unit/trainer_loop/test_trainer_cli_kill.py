"""`trex train` as a process: kill -9 after a checkpoint, resume, and match an uninterrupted run; bad configs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from trex.trainer.cli import main

CFG = {
    "trainer": {
        "model": {"preset": "tiny"},
        "maxSteps": 30,
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 2},
        "checkpoint": {"dir": "ckpt", "intervalSteps": 4, "keepLast": 2},
        "logging": {"intervalSteps": 10},
    }
}


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", TREX_TERMINATION_PATH=str(tmp / "termination-log"))
    env.pop("TREX_CONFIG", None)
    return env


def _cmd(cfg: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "trex", "train", "--config", str(cfg), "--out", str(out)]


def _final_losses(path: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        out[rec["step"]] = rec["loss"]  # a resumed run rewrites the steps after its checkpoint
    return out


def _model_tensors(ckpt: Path, tmp: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = tmp / f"{ckpt.parent.parent.name}-{ckpt.name}.pt"
    dcp_to_torch_save(str(ckpt), str(target))
    state = torch.load(target, weights_only=False)
    return {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}


@pytest.mark.slow
def test_kill_minus_nine_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    ref = subprocess.run(_cmd(cfg, ref_dir), env=_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert ref.returncode == 0, ref.stderr

    proc = subprocess.Popen(_cmd(cfg, run_dir), env=_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    manifest = run_dir / "ckpt" / "step-00000004" / "manifest.json"
    deadline = time.monotonic() + 120
    while not manifest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    # Kept: polling for the step-4 checkpoint, not a hook; 26 more steps would have to pass before the kill for a
    # race, and then the exit code below fails loudly rather than passing.
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert not (run_dir / "ckpt" / "step-00000030").exists()

    resumed = subprocess.run(_cmd(cfg, run_dir), env=_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr
    ref_losses = _final_losses(ref_dir / "ckpt" / "metrics.jsonl")
    assert sorted(ref_losses) == list(range(1, 31))
    assert _final_losses(run_dir / "ckpt" / "metrics.jsonl") == ref_losses
    a = _model_tensors(ref_dir / "ckpt" / "step-00000030", tmp_path)
    b = _model_tensors(run_dir / "ckpt" / "step-00000030", tmp_path)
    assert a.keys() == b.keys() and any("e_score_correction_bias" in k for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    summary = json.loads((tmp_path / "termination-log").read_text())
    assert summary["result"] == "Succeeded" and summary["step"] == 30 and summary["lastCheckpointStep"] == 30


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"maxStep": 3}, "maxStep"),
        ({"optimizer": {"muon": {"lr": "fast"}}}, "optimizer.muon.lr"),
        ({"data": {"microBatchSize": 3, "globalBatchSize": 4}}, "globalBatchSize"),
        ({"optimizer": {"batchRamp": [{"step": 5, "globalBatchSize": 3}]}}, "optimizer.batchRamp[0].globalBatchSize"),
        ({"data": {"seqLen": 5000}}, "data.seqLen"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_bad_config_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             patch: dict[str, object], field: str) -> None:
    body = {**CFG["trainer"], **patch}
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({"trainer": body}))
    rc = main(["--config", str(cfg), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert field in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_missing_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_143(tmp_path: Path) -> None:
    body = {**CFG["trainer"], "maxSteps": 500, "checkpoint": {"dir": "ckpt", "intervalSteps": 3}}
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"trainer": body}))
    proc = subprocess.Popen(_cmd(cfg, tmp_path / "run"), env=_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    manifest = tmp_path / "run" / "ckpt" / "step-00000003" / "manifest.json"
    deadline = time.monotonic() + 120
    while not manifest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    # Kept: polling as above; 497 steps stand between the step-3 checkpoint and a run that ends by itself.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    summary = json.loads((tmp_path / "termination-log").read_text())
    assert summary["result"] == "Interrupted" and 3 <= summary["step"] < 500
    assert summary["lastCheckpointStep"] == summary["step"]
    assert (tmp_path / "run" / "ckpt" / f"step-{summary['step']:08d}" / "manifest.json").is_file()


@pytest.mark.slow
def test_two_pods_join_through_the_env_contract(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    body = {**CFG["trainer"], "maxSteps": 3, "data": {"seqLen": 32, "microBatchSize": 1, "globalBatchSize": 2},
            "checkpoint": {"dir": str(tmp_path / "ckpt"), "intervalSteps": 3}}
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"trainer": body}))
    procs = []
    for rank in (0, 1):
        env = _env(tmp_path) | {"WORLD_SIZE": "2", "RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                                "MASTER_PORT": str(port), "TREX_CONFIG": str(cfg),
                                "TREX_TERMINATION_PATH": str(tmp_path / f"term-{rank}")}
        procs.append(subprocess.Popen([sys.executable, "-m", "trex", "train", "--out", str(tmp_path)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    errs = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    shards = sorted(p.name for p in (tmp_path / "ckpt" / "step-00000003").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]
    sums = [json.loads((tmp_path / f"term-{r}").read_text()) for r in (0, 1)]
    assert [s["rank"] for s in sums] == [0, 1] and sums[0]["loss"] == sums[1]["loss"]
    assert sums[0]["tokens"] == 3 * 2 * 32
    assert len((tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()) == 3  # rank 0 only


def test_malformed_training_data_exits_2_naming_file_and_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "corpus.jsonl"
    data.write_text('{"text": "fine"}\n{"text": "also fine"}\n{"text": oops}\n')
    body = {**CFG["trainer"], "data": {"train": str(data), "seqLen": 32, "microBatchSize": 2, "globalBatchSize": 2}}
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"trainer": body}))
    assert main(["--config", str(cfg), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "data.train" in err and "corpus.jsonl:3: invalid JSON" in err and len(err.splitlines()) == 1
