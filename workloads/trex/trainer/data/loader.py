"""Deterministic, resumable loader: documents shuffled per epoch by (seed, epoch), packed, read in order.

State is (epoch, offset in tokens into that epoch's stream); a resumed loader yields exactly the
batches the uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from trex.trainer.data.packing import EncodedDoc, Stream, concat, window


class PackedLoader:
    """Yields packed batches of any sequence length (the curriculum may change it between steps)."""

    def __init__(self, docs: Sequence[EncodedDoc], seed: int) -> None:
        if not docs:
            raise ValueError("no documents to train on")
        self.docs = list(docs)
        self.seed = seed
        self.epoch = 0
        self.offset = 0
        self._stream: Stream | None = None
        self._stream_epoch = -1
        self.total_tokens = sum(len(d.ids) for d in self.docs)

    def _epoch_stream(self) -> Stream:
        if self._stream is None or self._stream_epoch != self.epoch:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.docs))
            self._stream = concat(self.docs, order)
            self._stream_epoch = self.epoch
        return self._stream

    def next_batch(self, batch: int, seq_len: int, rank: int = 0, world: int = 1) -> dict[str, torch.Tensor]:
        """The next ``batch`` sequences for ``rank`` out of ``batch x world`` consumed by all ranks."""
        need = batch * world * seq_len + 1
        if need > self.total_tokens:
            raise ValueError(f"the corpus has {self.total_tokens} tokens, fewer than one global micro-batch "
                             f"({batch * world} x {seq_len}); lower data.seqLen or data.microBatchSize")
        stream = self._epoch_stream()
        if self.offset + need > len(stream):
            self.epoch += 1
            self.offset = 0
            stream = self._epoch_stream()
        rows = [window(stream, self.offset + (rank * batch + i) * seq_len, seq_len) for i in range(batch)]
        self.offset += batch * world * seq_len
        return {k: torch.from_numpy(np.stack([r[k] for r in rows])) for k in rows[0]}

    def state_dict(self) -> dict[str, Any]:
        """Data position: epoch and token offset (and the seed it applies to)."""
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        if int(state["seed"]) != self.seed:
            raise ValueError(f"checkpoint data seed {state['seed']} differs from data.seed {self.seed}")
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
