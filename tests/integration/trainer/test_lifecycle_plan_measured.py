"""The lifecycle plan's per-rank disk bytes against measured runs at world 1 and 2 (spawn, gloo, dp2) of a small
V4-shaped model (FP8 attention, FP4 routed experts, DeepSeek's original names): the bytes the sliced HF load read
(the slice reader's own count) and the bytes of the export files each rank wrote under exportQuant fp8-fp4. The
plan is an upper bound of the most loaded rank within 15 % plus a stated constant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig

OVERRIDES = dict(attention="csa", vocabSize=2048, hiddenSize=256, numHeads=4, qLoraRank=128, qkNopeHeadDim=96,
                 qkRopeHeadDim=32, vHeadDim=128, hcMult=2, numLayers=2, layerTypes=["csa", "hca"],
                 csaCompressEvery=4, hcaCompressEvery=8, csaTopK=4, csaWindow=8, csaIndexerHeads=2,
                 csaIndexerDim=64, nRoutedExperts=8, expertsPerToken=2, moeIntermediateSize=256, oGroups=2,
                 oLoraRank=64, mtpDepth=1, nHashLayers=1, scoring="sqrt-softplus")
CONSTANT = 64 * 1024
"""What the plan leaves out: the safetensors headers, config.json and the buffers (hash-routing table, router
biases: 32 KiB for this shape)."""


def _cfg() -> TrainerConfig:
    return load_section(TrainerConfig, {"model": {"preset": "tiny", "dtype": "fp32", "overrides": OVERRIDES},
                                        "checkpoint": {"exportQuant": "fp8-fp4", "initFromHf": "hf"}})


def _worker(rank: int, world: int, out: str) -> None:
    from trex.trainer import hf
    from trex.trainer.build import distributed_model
    from trex.trainer.config import resolved_model_values
    from trex.trainer.hf_export import save_hf_distributed
    from trex.trainer.model import ModelArgs
    from trex.trainer.model.model import build_model_from_args
    from trex.trainer.parallel.mesh import ParallelDims, build_meshes

    torch.set_num_threads(1)
    args = ModelArgs.from_values(resolved_model_values(_cfg().model))
    root = Path(out)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{out}/rdv-{world}", rank=rank, world_size=world)
        dims = ParallelDims(world=world, dp_shard=world)
        model: Any = distributed_model(args, dims, build_meshes(dims, "cpu"), torch.float32, torch.device("cpu"),
                                       0)[0]
        stats = hf.load_hf_sharded(model, root / "hf")
    else:
        model = build_model_from_args(args, seed=0)
        stats = hf.load_hf_into(model, root / "hf")
    target = root / f"export-{world}"
    if rank == 0:
        target.mkdir()
    if world > 1:
        dist.barrier()
    state = model.state_dict()
    save_hf_distributed(state, model.args, target, {k: v.dtype for k, v in state.items()}, quant="fp8-fp4",
                        layout="original")
    (root / f"read-{world}-{rank}.json").write_text(json.dumps(stats.bytes_read))
    if world > 1:
        dist.destroy_process_group()


def test_planned_load_and_export_bytes_match_measured(tmp_path: Path) -> None:
    from trex.trainer.config import resolved_model_values
    from trex.trainer.hf import save_hf
    from trex.trainer.mfu import DEVICES
    from trex.trainer.model import ModelArgs
    from trex.trainer.model.model import build_model_from_args
    from trex.trainer.plan import plan_lifecycle, plan_memory

    cfg = _cfg()
    source = build_model_from_args(ModelArgs.from_values(resolved_model_values(cfg.model)), seed=1)
    save_hf(source, tmp_path / "hf", layout="original", quant="fp8-fp4")
    folder = sum(f.stat().st_size for f in (tmp_path / "hf").glob("*.safetensors"))
    rows = {}
    for world in (1, 2):
        mp.spawn(_worker, args=(world, str(tmp_path)), nprocs=world, join=True)  # type: ignore[attr-defined,no-untyped-call]
        read = max(json.loads((tmp_path / f"read-{world}-{r}.json").read_text()) for r in range(world))
        files = sorted((tmp_path / f"export-{world}").glob("*.safetensors"))
        assert len(files) == world  # each rank writes its own file
        written = max(f.stat().st_size for f in files)
        mem = plan_memory(cfg, world, DEVICES["cpu"], 2**40)
        life = {p.name: p for p in plan_lifecycle(cfg, world, mem, source="fp8-fp4").phases}
        rows[world] = (read, life["load"].read_bytes, written, life["export"].written_bytes)
    for world, (read, plan_read, written, plan_written) in rows.items():
        assert read <= plan_read + CONSTANT and plan_read <= 1.15 * read + CONSTANT, (world, rows)
        assert written <= plan_written + CONSTANT and plan_written <= 1.15 * written + CONSTANT, (world, rows)
    assert rows[1][0] <= folder  # world 1 reads the folder's tensors, once
    assert rows[2][0] < 0.6 * rows[1][0]  # and each of 2 ranks about half
