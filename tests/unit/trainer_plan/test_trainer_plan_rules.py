"""The one validity rule (trainer.rules.job_problems) as `trex validate`, the operator's models, `trex train`
and `trex plan` apply it: unsupported fields and plans that exceed the device are one line naming the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from trex.config_base import format_validation_error, load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.mfu import DEVICES, GIB
from trex.trainer.plan import plan_memory, with_swap
from trex.trainer.rules import job_problems
from trex_operator.api import TrainJob, memory_bytes
from trex_operator.plan_cli import main as plan_main

REPO = Path(__file__).resolve().parents[3]


def _job(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "trex.dev/v1alpha1", "kind": "TrainJob", "metadata": {"name": "j"}, "spec": spec}


def _problems(spec: dict[str, Any]) -> list[str]:
    try:
        load_section(TrainJob, _job(spec))
    except ValidationError as e:
        return format_validation_error(e)
    return []


def _flash(**over: Any) -> dict[str, Any]:
    trainer: dict[str, Any] = {"model": {"preset": "v4-flash", "dtype": "bf16"}, "parallelism": {"ep": 64},
                               "data": {"seqLen": 640, "microBatchSize": 1, "globalBatchSize": 128}}
    trainer.update(over)
    return {"replicas": 16, "devicesPerReplica": 8, "deviceType": "npu", "trainer": trainer}


def test_memory_rule_names_the_numbers_the_device_and_what_to_change() -> None:
    cfg = load_section(TrainerConfig, _flash()["trainer"])
    plan = plan_memory(cfg, 128, DEVICES["910b"])
    assert not plan.fits and with_swap(plan, True).fits
    [line] = _problems(_flash())
    assert line.startswith("spec.trainer.parallelism: needs 67 GiB per device; Ascend 910B has 64 GiB: ")
    assert "or enable optimizer.swap (brings it to 54.8 GiB)" in line
    # the same job on 141 GB H200s fits
    assert _problems({**_flash(), "deviceType": "gpu", "deviceModel": "h200"}) == []


def test_swap_makes_the_job_fit_and_is_accepted() -> None:
    assert _problems(_flash(optimizer={"swap": {"enabled": True}})) == []
    small = {"deviceType": "npu", "trainer": {"optimizer": {"swap": {"enabled": True}}}}
    assert _problems(small) == []
    assert job_problems(load_section(TrainerConfig, small["trainer"]), 1) == []
    # too long even with the states in host memory: the message names swap and what else to change
    [over] = _problems(_flash(optimizer={"swap": {"enabled": True}},
                              data={"seqLen": 2048, "microBatchSize": 1, "globalBatchSize": 128}))
    assert over.startswith("spec.trainer.parallelism: needs ") and "even with the optimizer states in host" in over
    assert "set trainer.recompute" in over


def test_recompute_shrinks_the_planned_activations_and_swap_the_states() -> None:
    def plan(**over: Any) -> Any:
        return plan_memory(load_section(TrainerConfig, _flash(**over)["trainer"]), 128, DEVICES["910b"])

    none, sel, full = plan(), plan(recompute="selective"), plan(recompute="full")
    assert full.activations < sel.activations < none.activations
    assert (none.params, none.grads, none.muon_state) == (full.params, full.grads, full.muon_state)
    swapped = plan(optimizer={"swap": {"enabled": True, "buffers": 3, "bucketMb": 64}})
    # bf16 at 128 ranks: FSDP2 shards every parameter (edp 2), so every parameter shard is an fp32 master, and
    # swap keeps a bf16 copy of it on the device instead
    assert swapped.masters == none.masters == none.params and swapped.device_params == none.params // 2
    assert swapped.persistent == (none.persistent - none.muon_state - none.adamw_state - none.params // 2
                                  + swapped.swap_buffers)
    assert swapped.swap_saved == none.muon_state + none.adamw_state + none.params // 2 - swapped.swap_buffers
    assert swapped.swap_buffers >= 3 * 64 * 2**20
    one = plan_memory(load_section(TrainerConfig, _flash(optimizer={"swap": {"enabled": True}})["trainer"]), 1,
                      DEVICES["910b"])
    assert one.masters == 0 and one.device_params == one.params  # one process: bf16 throughout, no masters


def test_pp_and_what_opd_cannot_split_are_rejected_before_any_pod() -> None:
    assert _problems({"devicesPerReplica": 2, "trainer": {"parallelism": {"pp": 2}}}) == [
        "spec.trainer.parallelism.pp: 2: pipeline parallelism is not run by `trex train` yet; set 1"]
    opd = {"mode": "opd", "opd": {"teachers": [{"path": "/t"}]}}
    assert _problems({"trainer": opd}) == []
    assert _problems({"devicesPerReplica": 2, "trainer": opd}) == []  # dp2: two of the four prompts per rank
    [three] = _problems({"devicesPerReplica": 3, "trainer": opd})
    assert three == ("spec.trainer.opd.promptsPerStep: 4 is not a multiple of the 3 data-parallel rank(s) (each rank "
                     "samples whole prompts)")
    grpo = {"mode": "grpo", "data": {"train": "/p"}, "grpo": {"promptsPerStep": 3}}
    [odd] = _problems({"devicesPerReplica": 2, "trainer": grpo})
    assert odd.startswith("spec.trainer.grpo.promptsPerStep: 3 is not a multiple of the 2 data-parallel rank(s)")
    assert _problems({"trainer": {**opd, "opd": {"teachers": [{"name": "sft"}]}}}) == []


def test_device_model_and_cpu_memory_limits() -> None:
    [bad] = _problems({"deviceType": "gpu", "deviceModel": "910b", "trainer": {}})
    assert bad == "spec.deviceModel: '910b' is a npu device; deviceType is 'gpu'"
    small = {"model": {"preset": "small-cpu"}, "data": {"seqLen": 512, "microBatchSize": 4, "globalBatchSize": 8}}
    [tight] = _problems({"devicesPerReplica": 2, "resources": {"limits": {"memory": "256Mi"}}, "trainer": small})
    assert tight.startswith("spec.trainer.parallelism: needs ") and "CPU has 128.0 MiB" in tight
    assert _problems({"devicesPerReplica": 2, "resources": {"limits": {"memory": "8Gi"}}, "trainer": small}) == []
    assert _problems({"devicesPerReplica": 2, "trainer": small}) == []  # no limit: capacity unknown, not checked
    [q] = _problems({"resources": {"limits": {"memory": "3n"}}, "trainer": small})
    assert q.startswith("spec.resources.limits.memory: '3n' is not a memory quantity")
    assert memory_bytes("64Gi") == 64 * GIB and memory_bytes("1e9") == 10**9 and memory_bytes("500M") == 5 * 10**8


def test_trex_plan_tables_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_main([str(REPO / "examples" / "trainjob-v4-flash-npu.yaml")]) == 0
    out = capsys.readouterr().out
    assert "512 x Ascend 910C die" in out and "parameters (bf16 copies; 2.12 GiB fp32 masters in host memory)  " in out and "fit: yes" in out
    assert plan_main([str(REPO / "examples" / "invalid" / "16-out-of-memory.yaml")]) == 1
    out = capsys.readouterr().out
    assert "fit: no" in out and "problem: parallelism: needs" in out
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"trainer": {"model": {"preset": "tiny"}, "parallelism": {"ep": 2}}}))
    assert plan_main([str(cfg), "--world", "2", "--device", "h100"]) == 0
    out = capsys.readouterr().out
    assert "2 x NVIDIA H100 SXM" in out and "edp 1 x ep 2" in out and "NVIDIA H100 SXM memory" in out
    assert plan_main([str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_trex_train_applies_the_same_rule(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"preset": "tiny"}, "parallelism": {"pp": 2}}))
    out = subprocess.run([sys.executable, "-m", "trex", "train", "--config", str(cfg)], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO / 'workloads'}:{REPO / 'operator'}",
                                         "WORLD_SIZE": "2"}, timeout=300)
    assert out.returncode == 2
    assert "parallelism.pp: 2: pipeline parallelism is not run" in out.stderr
