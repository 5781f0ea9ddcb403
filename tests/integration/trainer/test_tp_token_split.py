"""Token-split tensor parallelism against one process, float64, spawn + gloo: under tp the MoE layers split each
micro-batch's tokens (batch x sequence flattened) over the tp ranks, so tp runs at micro-batch 1.

- tp2 at micro-batch 1 (a sequence's tokens on both tp ranks) and at micro-batch 3 (a sequence cut across the
  two ranks' slices), on a DeepSeek-V4 model (sliding, CSA and HCA layers, mHC, a hash-routed layer, MTP) with
  the sequence-balance loss and aux-free bias updates on: losses and every parameter after 3 optimizer steps
  equal the single-process run to 1e-10.
- Validate: tp2 at micro-batch 1 is accepted when the tokens divide; otherwise one line naming the field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer
from trex.trainer.rules import job_problems

STEPS = 3
RUNS = {"mb1": 1, "mb3": 3}
"""name -> micro-batch size (two micro-batches a step)."""


def _raw(ckpt: Path, tp: int, micro: int, seq: int = 32) -> dict[str, Any]:
    return {
        "model": {"preset": "tiny", "dtype": "fp64", "overrides": {
            "attention": "csa", "hcMult": 2, "mtpDepth": 1, "numLayers": 2, "nDenseLayers": 1, "nHashLayers": 1,
            "qLoraRank": 16, "vHeadDim": 24, "layerTypes": ["csa", "hca"]}},
        "maxSteps": STEPS, "parallelism": {"tp": tp},
        "data": {"seqLen": seq, "microBatchSize": micro, "globalBatchSize": 2 * micro},
        "optimizer": {"schedule": {"warmupSteps": 1}, "adamw": {"eps": 1e-8}},
        "routing": {"biasUpdateSpeed": 0.01, "sequenceBalanceWeight": 0.01},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(ckpt), "intervalSteps": 100, "exportHf": False},
    }


def _run(cfg: TrainerConfig, out: Path, group: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
    tr = Trainer(cfg, out, group=group, measure_peak=False, log=lambda _m: None)
    res = tr.run(STEPS)
    return [r.loss for r in res.history], tr.full_state_dict()


def _worker(rank: int, world: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
    try:
        root = Path(out)
        for name, micro in RUNS.items():
            losses, state = _run(load_section(TrainerConfig, _raw(root / name, 2, micro)), root, dist.group.WORLD)
            if rank == 0:
                (root / f"{name}.json").write_text(json.dumps(losses))
                torch.save(state, root / f"{name}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tp-tokens")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(2, str(out)), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_tp2_token_split_matches_single_process(name: str, runs: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    ref_losses, ref_state = _run(load_section(TrainerConfig, _raw(tmp_path / "ckpt", 1, RUNS[name])), tmp_path, None)
    losses = json.loads((runs / f"{name}.json").read_text())
    assert len(losses) == STEPS
    assert losses == pytest.approx(ref_losses, abs=1e-10, rel=0)
    state = torch.load(runs / f"{name}.pt")
    assert sorted(state) == sorted(ref_state)
    for key, want in ref_state.items():
        assert float((state[key].double() - want.double()).abs().max()) < 1e-10, key
    biases = [k for k in ref_state if k.endswith("e_score_correction_bias")]
    assert biases and any(float(ref_state[k].abs().max()) > 0 for k in biases)  # the bias update ran


def test_validate_accepts_tp_at_micro_batch_one_when_the_tokens_divide() -> None:
    def problems(seq: int, **data: Any) -> list[tuple[str, str]]:
        raw = _raw(Path("unused"), 2, 1, seq)
        raw["model"] = {"preset": "tiny"}
        raw["data"].update(data)
        return job_problems(load_section(TrainerConfig, raw), 2)

    assert problems(32) == []
    [(field, message)] = problems(33)
    assert field == "parallelism.tp" and "\n" not in message
    assert "does not divide the 33 tokens of a micro-batch (data.microBatchSize 1 x data.seqLen 33)" in message
    [(field, message)] = problems(32, seqLenCurriculum=[{"step": 1, "seqLen": 17}])
    assert field == "parallelism.tp" and "data.seqLenCurriculum[0].seqLen 17" in message
