"""The vocabulary-parallel reverse KL at tp2 (spawn, gloo): each rank holds half of both heads; the loss, the
per-token KL and entropy, the hidden states' gradient and each rank's share of the head gradient equal the
single-process computation over the whole vocabulary (both estimators)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from trex.trainer.distill.kl import Estimator, reverse_kl, shard_rows, token_coefficients

N, VOCAB, D_S, D_T = 19, 3000, 12, 20


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    hs, ws = torch.randn(N, D_S, generator=g, dtype=torch.float64), torch.randn(VOCAB, D_S, generator=g, dtype=torch.float64)
    ht, wt = torch.randn(N, D_T, generator=g, dtype=torch.float64), torch.randn(VOCAB, D_T, generator=g, dtype=torch.float64)
    mask = torch.ones(N, dtype=torch.bool)
    mask[:4] = False
    tokens = torch.randint(0, VOCAB, (N,), generator=g)
    return hs, ws, ht, wt, mask, tokens


def _run(estimator: Estimator, group: object = None) -> dict[str, torch.Tensor]:
    hs, ws, ht, wt, mask, tokens = _inputs()
    if group is not None:
        ws, wt = shard_rows(ws, group), shard_rows(wt, group)
    h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
    out = reverse_kl(h, w, ht, wt, token_coefficients(mask, 0.5), estimator=estimator, tokens=tokens,
                     chunk_size=6, group=group)
    out.loss.backward()
    assert h.grad is not None and w.grad is not None
    return {"loss": out.loss.detach(), "kl": out.kl, "entropy": out.entropy, "grad_h": h.grad, "grad_w": w.grad}


def _worker(rank: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    try:
        for est in ("full-vocab", "sampled-token"):
            torch.save(_run(est, dist.group.WORLD), Path(out) / f"{est}-{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kl-tp")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(str(out),), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return out


@pytest.mark.parametrize("estimator", ["full-vocab", "sampled-token"])
def test_vocab_parallel_kl_equals_single_process(estimator: Estimator, runs: Path) -> None:
    want = _run(estimator)
    half = VOCAB // 2
    for rank in (0, 1):
        got = torch.load(runs / f"{estimator}-{rank}.pt")
        for key in ("loss", "kl", "entropy", "grad_h"):
            torch.testing.assert_close(got[key], want[key], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got["grad_w"], want["grad_w"][rank * half:(rank + 1) * half], rtol=1e-10, atol=1e-12)
