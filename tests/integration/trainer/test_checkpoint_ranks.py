"""Checkpoint integrity and extra state per rank, at 2 ranks (spawn, gloo): each rank hashes only the files it
writes and, at load, only the files it reads; a corrupt shard of rank 1 is named by rank 1 on every rank; a resume
restores each rank's own RNG streams (torch, numpy, python), equal to what the uninterrupted run draws next."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers.gloo import gloo_rank
from torch import nn

WORLD = 2


class Sharded(nn.Module):
    """One parameter, rows sharded over the ranks (so each rank's DCP shard holds different bytes)."""

    def __init__(self, mesh: Any) -> None:
        from torch.distributed.tensor import Shard, distribute_tensor

        super().__init__()
        full = torch.arange(64 * 48, dtype=torch.float32).reshape(64, 48)
        self.w = nn.Parameter(distribute_tensor(full, mesh, [Shard(0)], src_data_rank=None))


def _draws() -> list[float]:
    return [torch.rand(()).item(), float(np.random.rand()), random.random(), torch.randn(()).item()]


def _worker(rank: int, out: str, phase: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from trex.runtime.device import rng_state, set_rng_state
    from trex.trainer.checkpoint import CheckpointCorruptError, CheckpointManager

    torch.set_num_threads(1)
    root = Path(out)
    with gloo_rank(rank, WORLD, f"{out}/rendezvous-{phase}"):
        model = Sharded(init_device_mesh("cpu", (WORLD,)))
        mgr = CheckpointManager(root / "ckpt", group=dist.group.WORLD)
        result: dict[str, Any] = {}
        if phase == "save":
            torch.manual_seed(100 + rank)
            np.random.seed(200 + rank)
            random.seed(300 + rank)
            _draws()
            with torch.no_grad():
                model.w.to_local().mul_(rank + 2)
            mgr.save(1, model, [], {"rng": rng_state(), "rank": rank})
            result = {"hashed": mgr.hashed_bytes, "next": _draws(), "local": model.w.to_local().tolist()}
        elif phase == "resume":
            torch.manual_seed(0)
            np.random.seed(0)
            random.seed(0)
            with torch.no_grad():
                model.w.to_local().zero_()
            step = mgr.latest_step()
            after_latest = mgr.hashed_bytes
            loaded, _, _ = mgr.load_latest(model, [])
            assert loaded is not None and step == 1
            set_rng_state(loaded.extra["rng"])
            result = {"hashed_latest": after_latest, "hashed": mgr.hashed_bytes, "next": _draws(),
                      "rank": loaded.extra["rank"], "local": model.w.to_local().tolist()}
        else:
            try:
                mgr.load(root / "ckpt" / "step-00000001", model, [])
                result = {"error": None}
            except CheckpointCorruptError as e:
                result = {"error": str(e)}
            result["hashed"] = mgr.hashed_bytes
        (root / f"{phase}-{rank}.json").write_text(json.dumps(result))


def _spawn(out: Path, phase: str) -> dict[int, dict[str, Any]]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(str(out), phase), nprocs=WORLD, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return {r: json.loads((out / f"{phase}-{r}.json").read_text()) for r in range(WORLD)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[int, dict[str, Any]]]]:
    out = tmp_path_factory.mktemp("ckpt-ranks")
    saved = _spawn(out, "save")
    resumed = _spawn(out, "resume")
    shard = out / "ckpt" / "step-00000001" / "__1_0.distcp"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size: only the hash can tell
    shard.write_bytes(bytes(raw))
    corrupt = _spawn(out, "corrupt")
    return out, {"save": saved, "resume": resumed, "corrupt": corrupt}


def _size(out: Path, name: str) -> int:
    return (out / "ckpt" / "step-00000001" / name).stat().st_size


def test_resume_restores_each_ranks_own_streams(runs: tuple[Path, dict[str, dict[int, dict[str, Any]]]]) -> None:
    _, r = runs
    for rank in range(WORLD):
        assert r["resume"][rank]["rank"] == rank
        assert r["resume"][rank]["next"] == r["save"][rank]["next"]  # what the uninterrupted run drew
        assert r["resume"][rank]["local"] == r["save"][rank]["local"]
    assert all(a != b for a, b in zip(r["resume"][0]["next"], r["resume"][1]["next"], strict=True))


def test_each_rank_hashes_only_its_own_files(runs: tuple[Path, dict[str, dict[int, dict[str, Any]]]]) -> None:
    out, r = runs
    meta = _size(out, ".metadata")
    mine = {rank: _size(out, f"__{rank}_0.distcp") + _size(out, f"extra-{rank:05d}.pt") for rank in range(WORLD)}
    assert r["save"][0]["hashed"] == mine[0] + meta
    assert r["save"][1]["hashed"] == mine[1]
    for rank in range(WORLD):
        assert r["resume"][rank]["hashed_latest"] == 0  # latest_step reads the manifest only
        assert r["resume"][rank]["hashed"] == mine[rank] + meta  # each file it reads, once


def test_corrupt_shard_of_rank_1_is_named_by_rank_1(runs: tuple[Path, dict[str, dict[int, dict[str, Any]]]]) -> None:
    out, r = runs
    for rank in range(WORLD):
        err = r["corrupt"][rank]["error"]
        assert err.startswith("rank 1: checkpoint step-00000001: file __1_0.distcp fails its sha256 check"), err
    assert r["corrupt"][0]["hashed"] == _size(out, "__0_0.distcp") + _size(out, "extra-00000.pt") + _size(out, ".metadata")
