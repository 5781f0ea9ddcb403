"""OPD's KL vocabulary-parallel over the data-parallel ranks (spawn, gloo, world 2, float64): each rank holds half of
both heads' rows and its own tokens (uneven counts, one rank with none); loss, per-token KL and the gradients of the
hidden states and the head equal one process's full-vocabulary KL over all tokens to 1e-10. With a rank that
shares another's tokens (a tp rank), the result is that rank's tokens' once."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers.gloo import gloo_rank
from trex.trainer.distill.kl import reverse_kl, token_coefficients
from trex.trainer.distill.opd import VocabParallel, vocab_parallel_kl

V, DS, DT = 24, 6, 5
COUNTS = {"uneven": (5, 3), "empty": (4, 0), "shared": (4, 4)}
"""Tokens of rank 0 and rank 1 per case; "shared": rank 1 is a tp rank of rank 0 (the same tokens, not sent)."""


def _data() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {"ws": torch.randn(V, DS, generator=g, dtype=torch.float64),
            "wt": torch.randn(V, DT, generator=g, dtype=torch.float64),
            "hs": torch.randn(8, DS, generator=g, dtype=torch.float64),
            "ht": torch.randn(8, DT, generator=g, dtype=torch.float64),
            "tokens": torch.randint(0, V, (8,), generator=g)}


def _rows(case: str, rank: int) -> slice:
    a, b = COUNTS[case]
    if case == "shared":
        return slice(0, a)
    return slice(0, a) if rank == 0 else slice(a, a + b)


def _worker(rank: int, out: str) -> None:
    torch.set_num_threads(1)
    with gloo_rank(rank, 2, f"{out}/rendezvous"):
        d = _data()
        rows = V // 2
        results: dict[str, Any] = {}
        for case in COUNTS:
            total = sum(COUNTS[case]) if case != "shared" else COUNTS[case][0]
            for estimator in ("full-vocab", "sampled-token"):
                sl = _rows(case, rank)
                hs = d["hs"][sl].clone().requires_grad_()
                ws = d["ws"].clone().requires_grad_()
                coef = token_coefficients(torch.ones(hs.shape[0]), 0.7, denominator=float(total))
                shared = case == "shared"
                vp = VocabParallel(dist.group.WORLD, lambda w: w[rank * rows:(rank + 1) * rows], rank * rows,
                                   sends=not (shared and rank == 1), owner=0 if shared else rank)
                res, own = vocab_parallel_kl(hs, vp.shard(ws), d["ht"][sl], d["wt"][rank * rows:(rank + 1) * rows],
                                             coef, d["tokens"][sl], vp, estimator=estimator,  # type: ignore[arg-type]
                                             chunk_size=2) or (None, None)  # type: ignore[misc]
                assert res is not None and own is not None
                res.loss.backward()
                results[f"{case}/{estimator}"] = {
                    "loss": float((res.kl[own] * coef).sum()), "kl": res.kl[own].clone(),
                    "hs": hs.grad.clone() if hs.grad is not None else torch.zeros_like(hs), "ws": ws.grad.clone()}
        torch.save(results, Path(out, f"{rank}.pt"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("vocab-parallel")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(str(root),), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return [torch.load(root / f"{r}.pt") for r in range(2)]


@pytest.mark.parametrize("estimator", ["full-vocab", "sampled-token"])
@pytest.mark.parametrize("case", sorted(COUNTS))
def test_vocab_parallel_kl_equals_one_process(case: str, estimator: str, runs: list[dict[str, Any]]) -> None:
    d = _data()
    n = sum(COUNTS[case]) if case != "shared" else COUNTS[case][0]
    hs = d["hs"][:n].clone().requires_grad_()
    ws = d["ws"].clone().requires_grad_()
    coef = token_coefficients(torch.ones(n), 0.7)
    want = reverse_kl(hs, ws, d["ht"][:n], d["wt"], coef, estimator=estimator,  # type: ignore[arg-type]
                      tokens=d["tokens"][:n], chunk_size=3)
    want.loss.backward()
    assert hs.grad is not None and ws.grad is not None
    got = [r[f"{case}/{estimator}"] for r in runs]
    shared = case == "shared"
    parts = [got[0]] if shared else got
    torch.testing.assert_close(torch.tensor(sum(p["loss"] for p in parts), dtype=torch.float64), want.loss.detach(), atol=1e-12, rtol=0)
    torch.testing.assert_close(torch.cat([p["kl"] for p in parts]), want.kl, atol=1e-12, rtol=0)
    torch.testing.assert_close(torch.cat([p["hs"] for p in parts]), hs.grad, atol=1e-10, rtol=0)
    if shared:  # the tp rank's hidden states get the same (whole) gradient
        torch.testing.assert_close(got[1]["hs"], hs.grad, atol=1e-10, rtol=0)
    # each rank's head gradient covers its rows; summed (as FSDP2 and the tp sum do) they are the whole gradient
    torch.testing.assert_close(got[0]["ws"] + got[1]["ws"], ws.grad, atol=1e-10, rtol=0)
    assert torch.count_nonzero(got[0]["ws"][V // 2:]) == 0 and torch.count_nonzero(got[1]["ws"][:V // 2]) == 0


@pytest.mark.parametrize(("vocab", "rep", "shard", "tp"), [(129280, 8, 64, 1), (129280, 1, 128, 4), (512, 1, 2, 2),
                                                          (1000, 3, 7, 2)])
def test_vocab_rows_tile_the_vocabulary_inside_each_fsdp_shard(vocab: int, rep: int, shard: int, tp: int) -> None:
    """Every rank's rows are non-empty, inside the FSDP2 shard it holds (torch.chunk over dp_shard) and together
    they cover the vocabulary exactly once, whatever divides what (V4's 129,280 over 512 ranks)."""
    from trex.trainer.distill.teacher import vocab_rows
    from trex.trainer.parallel.mesh import ParallelDims

    dims = ParallelDims(world=rep * shard * tp, dp_replicate=rep, dp_shard=shard, tp=tp)
    chunks = torch.arange(vocab).chunk(shard)
    seen = torch.zeros(vocab, dtype=torch.long)
    for s in range(shard):
        for r in range(rep):
            for t in range(tp):
                a, b = vocab_rows(vocab, dims, r, s, t)
                assert b > a and int(chunks[s][0]) <= a and b <= int(chunks[s][-1]) + 1
                seen[a:b] += 1
    assert bool((seen == 1).all())


def test_a_vocabulary_too_small_for_the_ranks_is_named() -> None:
    from trex.config_base import load_section
    from trex.trainer.config import TrainerConfig
    from trex.trainer.distill.teacher import teacher_layout_problem
    from trex.trainer.parallel.mesh import ParallelDims

    args = load_section(TrainerConfig, {"model": {"preset": "tiny", "overrides": {"vocabSize": 6}}}).model.args
    assert teacher_layout_problem(args, ParallelDims(world=4, dp_shard=2, tp=2)) is None
    problem = teacher_layout_problem(args, ParallelDims(world=8, dp_shard=4, tp=2))
    assert problem is not None and "vocabulary 6 leaves a data-parallel x tp rank (4 x 2) no rows" in problem
