"""The lifecycle plan (host memory and disk bytes per rank, phase by phase) against hand-computed figures, the host
rule of `trex validate` against a too small resources.limits.memory, `trex plan`'s table, and the measured
``phases`` of a `trex train` run's termination summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.mfu import DEVICES
from trex.trainer.plan import (
    CHECKPOINT_EXTRA_BYTES,
    EXPORT_CHUNK_BYTES,
    GATHERED_BOX_BYTES,
    GATHERED_DIGEST_BYTES,
    HASH_BLOCK_BYTES,
    RUNTIME_HOST_BYTES,
    SLICE_BYTES_PER_ELEMENT,
    Layout,
    MemoryPlan,
    ParamInfo,
    lifecycle_phases,
)

REPO = Path(__file__).resolve().parents[3]
MiB = 2**20

# q_b_proj [256, 256] tp_col (FP8), a routed expert stack [4, 64, 128] (FP4 under fp8-fp4), a norm [256].
PARAMS = (ParamInfo("layers.0.self_attn.q_b_proj.weight", (256, 256), "tp_col", "muon", "layers.0"),
          ParamInfo("layers.0.mlp.experts.down_proj", (4, 64, 128), "experts", "muon", "layers.0"),
          ParamInfo("layers.0.input_layernorm.weight", (256,), "replicated", "adamw", "layers.0"))


def _mem(device: str = "910c", swap: bool = True) -> MemoryPlan:
    # world 2 (dp2), fp32: local elements 128 x 256 + 2 x 64 x 128 + 128 = 49280
    n = 128 * 256 + 2 * 64 * 128 + 128
    return MemoryPlan(params=4 * n, grads=4 * n, muon_state=4 * (n - 128), adamw_state=8 * 128, buffers=0,
                      activations=1000, recompute="none", fsdp_gather=0, comm_buffers=0, optimizer_transient=0,
                      swap=swap, swap_buffers=0, masters=0, device=DEVICES[device], capacity=None, world=2)


def _phases(mem: MemoryPlan, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(mode="sft", model_dtype="fp32", export_quant="fp8-fp4", source="fp8-fp4", load=True,
                                export=True, tokens_per_step=3 * 33, token_bytes=3)
    args.update(kw)
    return {p.name: p for p in lifecycle_phases(PARAMS, Layout(2, 2, 1, 1, 1, 1), mem, **args)}


def test_lifecycle_phases_against_hand_computed_bytes() -> None:
    mem = _mem()
    ph = _phases(mem)
    # load: q_b rows 128 of 256 (one whole FP8 row block) x 256 cols, FP8 + 1 x 2 fp32 scales;
    # experts 2 of 4 (dim 0, no block cut): 2 x 64 x 128 FP4 = 8192 bytes + 2 x 64 x 4 fp32 scales;
    # norm 128 fp32 values.
    q_b, experts, norm = 128 * 256 + 1 * 2 * 4, 2 * 64 * 128 // 2 + 2 * 64 * 4 * 4, 128 * 4
    assert ph["load"].read_bytes == q_b + experts + norm
    swap_host = mem.muon_state + mem.adamw_state  # masters 0: an fp32 model
    largest_box = 128 * 256 * SLICE_BYTES_PER_ELEMENT + q_b
    assert ph["load"].host_bytes == RUNTIME_HOST_BYTES + swap_host + largest_box
    assert ph["step"].host_bytes == RUNTIME_HOST_BYTES + swap_host and ph["step"].read_bytes == 3 * 33 * 3
    shards = mem.params + mem.muon_state + mem.adamw_state
    assert ph["checkpoint"].written_bytes == shards + CHECKPOINT_EXTRA_BYTES and ph["checkpoint"].read_bytes == shards
    digests = 2 * (1 + 2) * GATHERED_DIGEST_BYTES  # 2 ranks x (one 16 MiB block + 2 files), gathered on each
    assert ph["checkpoint"].host_bytes == RUNTIME_HOST_BYTES + swap_host + 128 * 256 * 4 + HASH_BLOCK_BYTES + digests
    assert ph["resume"].read_bytes == 2 * shards + 4 * HASH_BLOCK_BYTES
    # export: FP8 q_b (65536 + 2 x 2 x 4), 4 FP4 experts (4096 + 64 x 4 x 4 each), fp32 norm 1024; largest first
    # to the least loaded of 2 ranks: q_b on one, the experts and the norm on the other.
    assert ph["export"].written_bytes == max(65536 + 16, 4 * (4096 + 1024) + 1024) == 65552
    boxes = 2 * 3 * GATHERED_BOX_BYTES  # 2 ranks x 3 tensors' shard boxes, gathered on each
    assert ph["export"].host_bytes == RUNTIME_HOST_BYTES + swap_host + 2 * EXPORT_CHUNK_BYTES + boxes
    assert ph["rollout"].note == "none (mode sft)"


def test_lifecycle_phases_unquantised_source_cpu_device_and_no_swap() -> None:
    mem = _mem("cpu", swap=False)
    ph = _phases(mem, source=None, export_quant="none")
    n = 128 * 256 + 2 * 64 * 128 + 128
    assert ph["load"].read_bytes == 4 * n and "upper bound" in ph["load"].note  # unknown folder: model dtype
    # on a cpu device the device plan is host memory: its persistent part always, its transients in the step
    assert ph["rollout"].host_bytes == RUNTIME_HOST_BYTES + mem.persistent
    assert ph["step"].host_bytes == RUNTIME_HOST_BYTES + mem.total
    assert ph["export"].written_bytes == 4 * 256 * 256  # q_b alone; the 4 experts and the norm on the other rank


def test_fp8_box_widening_on_a_cut_block() -> None:
    # 300 rows over dp2: rank 0 rows 0..150, rank 1 150..300: each reads two 128-row blocks (256 / 172 rows)
    p = (ParamInfo("layers.0.self_attn.q_a_proj.weight", (300, 128), "replicated", "muon", "layers.0"),)
    (load,) = [x for x in lifecycle_phases(p, Layout(2, 2, 1, 1, 1, 1), _mem(), mode="cpt", model_dtype="fp32",
                                           export_quant="none", source="fp8", load=True, export=False,
                                           tokens_per_step=0, token_bytes=2) if x.name == "load"]
    assert load.read_bytes == 256 * 128 + 2 * 1 * 4


def _flagship(**spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "trainjob-v4-flash-npu.yaml").read_text())
    doc["spec"].update(spec)
    return doc


def test_host_memory_rule_names_phase_field_and_fix() -> None:
    from trex.trainer.rules import job_problems

    doc = _flagship()
    cfg = load_section(TrainerConfig, doc["spec"]["trainer"])
    assert job_problems(cfg, 512, DEVICES["910c"], None, host_capacity=1400 * 2**30 // 16) == []
    [(field, msg)] = job_problems(cfg, 512, DEVICES["910c"], None, host_capacity=3 * 2**30)
    assert field == "resources.limits.memory"
    assert msg.startswith("phase export needs 4.") and "3.00 GiB per rank" in msg and "raise resources.limits" in msg


def test_trainjob_with_too_little_pod_memory_is_refused(tmp_path: Path) -> None:
    from trex_operator.validate import check_document

    doc = _flagship(resources={"limits": {"memory": "48Gi"}})
    problems = check_document("job.yaml", 0, doc).problems
    assert [p.path for p in problems] == ["spec.resources.limits.memory"]
    assert "phase export needs" in problems[0].message and "3.00 GiB per rank" in problems[0].message
    # without a limit the host side is not checked; with the flagship's 1400Gi it fits
    assert check_document("job.yaml", 0, _flagship(resources={})).problems == []
    assert check_document("job.yaml", 0, _flagship()).problems == []


def test_trex_plan_prints_the_lifecycle_table(capsys: pytest.CaptureFixture[str]) -> None:
    from trex_operator.plan_cli import main

    assert main([str(REPO / "examples" / "trainjob-v4-flash-sft-npu.yaml"), "--source-quant", "fp8-fp4"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and len(line.split()) > 3}
    for phase in ("load", "step", "checkpoint", "resume", "export", "rollout"):
        assert phase in rows, out
    assert "folder fp8-fp4" in rows["load"] and "exportQuant fp8-fp4" in rows["export"]
    assert "host fit: yes" in out


def test_train_run_reports_phases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trex.trainer.cli import main
    from trex.trainer.hf import load_hf_into, save_hf
    from trex.trainer.model import build_model

    trainer: dict[str, Any] = {
        "model": {"preset": "tiny"}, "maxSteps": 2,
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 2},
        "checkpoint": {"dir": "ckpt", "intervalSteps": 2, "initFromHf": str(tmp_path / "hf")},
        "logging": {"intervalSteps": 10}}
    model_cfg = load_section(TrainerConfig, trainer).model
    save_hf(build_model(model_cfg, seed=5), tmp_path / "hf")
    sliced = load_hf_into(build_model(model_cfg, seed=6), tmp_path / "hf").bytes_read  # the slice reader's count
    (tmp_path / "train.yaml").write_text(yaml.safe_dump({"trainer": trainer}))
    monkeypatch.setenv("TREX_TERMINATION_PATH", str(tmp_path / "termination-log"))
    monkeypatch.delenv("TREX_CONFIG", raising=False)
    assert main(["--config", str(tmp_path / "train.yaml"), "--out", str(tmp_path / "run")]) == 0
    phases = json.loads((tmp_path / "termination-log").read_text())["phases"]
    assert sorted(phases) == ["checkpoint", "export", "load", "step"]
    assert phases["load"]["bytesRead"] >= sliced > 0  # plain reads, counted by rchar, plus the headers
    assert phases["checkpoint"]["bytesWritten"] > 0 and phases["export"]["bytesWritten"] > 0
    assert all(p["hostPeakBytes"] > 0 and p["seconds"] >= 0 for p in phases.values())
    # the same run continued: it resumes from its checkpoint (read back and verified) instead of loading
    trainer["maxSteps"] = 3
    (tmp_path / "train.yaml").write_text(yaml.safe_dump({"trainer": trainer}))
    assert main(["--config", str(tmp_path / "train.yaml"), "--out", str(tmp_path / "run")]) == 0
    phases = json.loads((tmp_path / "termination-log").read_text())["phases"]
    assert sorted(phases) == ["checkpoint", "export", "resume", "step"]
    ckpt = sum(f.stat().st_size for f in (tmp_path / "run" / "ckpt" / "step-00000002").rglob("*") if f.is_file())
    assert phases["resume"]["bytesRead"] >= ckpt // 2 > 0


class _Allocator:
    """A device allocator's counters (torch.cuda's API): 100 bytes held, a 250-byte peak inside each phase."""

    def __init__(self) -> None:
        self.resets = 0

    def reset_peak_memory_stats(self) -> None:
        self.resets += 1

    def memory_allocated(self) -> int:
        return 100

    def max_memory_allocated(self) -> int:
        return 350


def test_phase_meter_counts_io_peaks_and_device_transients(tmp_path: Path) -> None:
    from trex.trainer.phases import PhaseMeter

    acc = _Allocator()
    meter = PhaseMeter(acc)
    blob = tmp_path / "blob"
    for _ in range(2):
        with meter.measure("checkpoint"):
            blob.write_bytes(b"x" * 300_000)
            assert len(blob.read_bytes()) == 300_000
    with meter.measure("load"):
        grown = bytearray(64 * MiB)  # the host peak sees it
        del grown
    out = meter.summary()
    assert list(out) == ["load", "checkpoint"] and acc.resets == 3
    assert out["checkpoint"]["bytesWritten"] >= 600_000 and out["checkpoint"]["bytesRead"] >= 600_000
    assert out["load"]["hostPeakBytes"] >= 64 * MiB and out["load"]["bytesWritten"] < 300_000
    assert out["checkpoint"]["deviceTransientBytes"] == 250
    assert "deviceTransientBytes" not in PhaseMeter().fields


def test_results_keep_the_phases() -> None:
    from trex_operator.kinds import results_of

    phases = {"load": {"hostPeakBytes": 1, "bytesRead": 2, "bytesWritten": 0, "seconds": 0.5}}
    assert results_of({"loss": 1.0, "phases": phases}).model_dump(by_alias=True, exclude_none=True)["phases"] == phases
