"""One rank of a spawned multi-process test: a gloo group whose collectives time out, and a failure that surfaces
instead of hanging the other ranks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta

import torch.distributed as dist

COLLECTIVE_TIMEOUT_S = 600
"""A collective that waits longer than this raises (gloo's default is 30 minutes, longer than a test's timeout)."""


@contextlib.contextmanager
def gloo_rank(rank: int, world: int, rendezvous: str, timeout_s: float = COLLECTIVE_TIMEOUT_S) -> Iterator[None]:
    """Join the gloo group of ``world`` ranks at the file ``rendezvous`` for the block. A rank whose block raises
    leaves at once with its exception (torch.multiprocessing.spawn reports the traceback): it must not wait in a
    barrier while the others wait in a different collective, which would hang them all without a word. A rank
    whose block ends waits for every other rank before the group is torn down."""
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    yield
    dist.barrier()
    dist.destroy_process_group()
