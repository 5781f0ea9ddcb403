"""Gradient clipping (optimizer.gradClip): the distributed clip over sharded, replicated and plain gradients
(gloo, 2 ranks) against torch.nn.utils.clip_grad_norm_ on the full gradients in one process, and gradClip: 0
(no clipping: the norm is reported, the gradients are left as they are) on both paths."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from trex.trainer.optim.build import clip_grad_norm


def _full_grads() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(6, 4, generator=g, dtype=torch.float64) * 3, torch.randn(5, generator=g, dtype=torch.float64),
            torch.randn(3, 3, generator=g, dtype=torch.float64)]


def _reference(max_norm: float) -> tuple[float, list[torch.Tensor]]:
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in _full_grads()]
    for p, g in zip(params, _full_grads(), strict=True):
        p.grad = g.clone()
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if max_norm > 0 else float(
        torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))
    return norm, [p.grad.clone() for p in params if p.grad is not None]


def _worker(rank: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        for max_norm in (1.0, 0.0):
            _clip_on_ranks(rank, out, mesh, max_norm)
    finally:
        dist.destroy_process_group()


def _clip_on_ranks(rank: int, out: str, mesh: Any, max_norm: float) -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from trex.trainer.parallel.grads import clip_grads

    full = _full_grads()
    # a row-sharded gradient, a replicated one (counted once, not twice) and a plain local one
    sharded = torch.nn.Parameter(distribute_tensor(torch.zeros(6, 4, dtype=torch.float64), mesh, [Shard(0)]))
    sharded.grad = distribute_tensor(full[0], mesh, [Shard(0)])
    replicated = torch.nn.Parameter(distribute_tensor(torch.zeros(5, dtype=torch.float64), mesh, [Replicate()]))
    replicated.grad = distribute_tensor(full[1], mesh, [Replicate()])
    plain = torch.nn.Parameter(torch.zeros(3, 3, dtype=torch.float64))
    plain.grad = full[2].clone()
    norm = clip_grads([sharded, replicated, plain], max_norm)
    grads = [sharded.grad.full_tensor(), replicated.grad.full_tensor(), plain.grad]
    if rank == 0:
        torch.save({"norm": norm, "grads": grads}, Path(out) / f"clip-{max_norm}.pt")


def test_distributed_clip_matches_one_process(tmp_path: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    for max_norm in (1.0, 0.0):
        _check(tmp_path, max_norm)


def _check(tmp_path: Path, max_norm: float) -> None:
    got = torch.load(tmp_path / f"clip-{max_norm}.pt")
    norm, grads = _reference(max_norm)
    assert norm > 1.0  # the gradients are large enough that gradClip 1 clips them
    assert got["norm"] == pytest.approx(norm, rel=1e-12)
    for a, b in zip(got["grads"], grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)
    if max_norm == 0.0:  # gradClip: 0 leaves every gradient as it was
        for a, b in zip(got["grads"], _full_grads(), strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("max_norm", [1.0, 0.0], ids=["gradClip-1", "gradClip-0"])
def test_single_process_clip_matches_torch(max_norm: float) -> None:
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in _full_grads()]
    for p, g in zip(params, _full_grads(), strict=True):
        p.grad = g.clone()
    norm, grads = _reference(max_norm)
    assert clip_grad_norm(params, max_norm) == pytest.approx(norm, rel=1e-12)
    for p, ref, orig in zip(params, grads, _full_grads(), strict=True):
        torch.testing.assert_close(p.grad, ref, rtol=1e-12, atol=0)
        if max_norm == 0.0:
            assert p.grad is not None and torch.equal(p.grad, orig)
