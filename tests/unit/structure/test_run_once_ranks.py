"""Made-once files under torch.distributed (the tokenizer cache, the token store): every rank joins the barrier
whatever it sees on disk. A rank that arrives after rank 0 has written the file once skipped it and went on to
the next collective while rank 0 waited at the barrier: the job hung (seen in a spawned OPD test)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers.gloo import gloo_rank
from trex.text.tokenizer import load_or_train

TEXTS = [f"maximise {k} x subject to x <= {k + 1}" for k in range(40)]


def _worker(rank: int, out: str) -> None:
    torch.set_num_threads(1)
    cache = Path(out) / "cache"
    with gloo_rank(rank, 2, f"{out}/rendezvous", timeout_s=30):
        if rank == 1:  # arrive late: rank 0 has trained and written the tokenizer already
            while not list(cache.glob("tokenizer-*.json")):
                time.sleep(0.05)
        tok = load_or_train(None, TEXTS, 300, cache, "late-rank")
        t = torch.tensor([float(tok.get_vocab_size())])
        dist.all_reduce(t)  # the next collective: both ranks reach it only if both joined the barrier
        (Path(out) / f"{rank}.txt").write_text(f"{int(t.item())} {tok.get_vocab_size()}")


def test_a_rank_that_finds_the_file_made_still_joins_the_barrier(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    got = [(tmp_path / f"{r}.txt").read_text().split() for r in range(2)]
    assert got[0] == got[1] and int(got[0][0]) == 2 * int(got[0][1])  # one tokenizer, read by both
