"""The spawned-test helper: a rank that fails surfaces its error instead of hanging the ranks waiting for it in a
collective (which the old `finally: dist.barrier()` pattern did: a barrier against an all-reduce waits forever)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers.gloo import gloo_rank


def _worker(rank: int, out: str) -> None:
    torch.set_num_threads(1)
    with gloo_rank(rank, 2, f"{out}/rendezvous"):
        if rank == 1:
            raise ValueError("rank 1 read a half-written file")
        t = torch.ones(1)
        dist.all_reduce(t)  # rank 1 never joins this


def test_a_failing_rank_surfaces_its_error_instead_of_hanging(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="rank 1 read a half-written file"):
        mp.spawn(_worker, args=(str(tmp_path),), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
