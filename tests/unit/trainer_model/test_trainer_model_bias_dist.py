"""update_expert_bias over a gloo group of 2: counts are summed across ranks before the sign rule."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        from trex.trainer.model import ModelArgs, build_model_from_args, update_expert_bias

        model = build_model_from_args(ModelArgs(num_layers=1, mtp_depth=0), seed=0)
        # rank 0 overloads expert 0, rank 1 overloads expert 7; the sums are balanced except expert 3
        counts = torch.zeros(1, 8, dtype=torch.long)
        counts[0] = torch.tensor([9, 4, 4, 1, 4, 4, 4, 2]) if rank == 0 else torch.tensor([1, 4, 4, 1, 4, 4, 4, 10])
        update_expert_bias(model, counts, speed=0.5, group=dist.group.WORLD)
        torch.save(model.moe_gates()[0][1].e_score_correction_bias, os.path.join(out_dir, f"bias{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_bias_update_uses_counts_summed_over_the_group() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(os.path.join(tmp, "init"), tmp), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
        b0 = torch.load(os.path.join(tmp, "bias0.pt"))
        b1 = torch.load(os.path.join(tmp, "bias1.pt"))
    # summed counts [10, 8, 8, 2, 8, 8, 8, 12], mean 8: sign(mean - load) * 0.5
    expected = torch.tensor([-0.5, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, -0.5])
    assert torch.equal(b0, expected) and torch.equal(b1, expected)
