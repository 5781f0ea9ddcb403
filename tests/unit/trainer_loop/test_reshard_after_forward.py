"""parallelism.reshardAfterForward (gloo, 2 ranks): true (the default) frees each FSDP block's gathered
parameters after its forward, false keeps them gathered for the backward; the losses are the same either way."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer


def _cfg(ckpt: Path, reshard: bool) -> TrainerConfig:
    return load_section(TrainerConfig, {
        "model": {"preset": "tiny", "overrides": {"numLayers": 1, "mtpDepth": 0}}, "maxSteps": 2,
        "parallelism": {"reshardAfterForward": reshard},
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 4},
        "optimizer": {"schedule": {"warmupSteps": 1}, "muon": {"nsDtype": "fp32"}}, "stability": {"enabled": False},
        "checkpoint": {"dir": str(ckpt), "intervalSteps": 100, "exportHf": False}})


def _worker(rank: int, out: str) -> None:
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    try:
        found: dict[str, object] = {}
        for reshard in (True, False):
            tr = Trainer(_cfg(Path(out) / f"ckpt-{reshard}", reshard), out, group=dist.group.WORLD,
                         measure_peak=False, log=lambda _m: None)
            losses = [r.loss for r in tr.run(2).history]
            block = tr.model.layers[0]
            with torch.no_grad():
                tr.model(torch.zeros(1, 8, dtype=torch.long), logits=False)
            # after a forward: the block's parameters are its shards again (DTensor) or still gathered
            found[str(reshard)] = {"losses": losses,
                                   "sharded": all(isinstance(p, DTensor) for p in block.parameters())}
        if rank == 0:
            Path(out, "found.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


def test_reshard_after_forward_false_keeps_the_block_gathered(tmp_path: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    found = json.loads((tmp_path / "found.json").read_text())
    assert (found["True"]["sharded"], found["False"]["sharded"]) == (True, False)
    assert found["False"]["losses"] == found["True"]["losses"]
