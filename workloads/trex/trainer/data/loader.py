"""Deterministic, resumable loaders: documents shuffled per epoch by (seed, epoch), packed, read in order.

:class:`PackedLoader` (text) cuts one stream of documents into windows; :class:`SampleLoader` (chat / SFT)
packs whole samples per window.

State is (epoch, offset in tokens into that epoch's stream); a resumed loader yields exactly the
batches the uninterrupted one would have.

Both read documents through :class:`Docs` (a list in memory, or a
:class:`~trex.trainer.data.store.TokenStore`): the order and the packing are computed from document lengths
alone, and only the tokens of this rank's windows are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from trex.text.chat import EncodedDoc
from trex.trainer.data.packing import Stream, fit_len, pack_samples, window


@runtime_checkable
class Docs(Protocol):
    """Encoded documents by index: lengths and first loss-token positions up front, tokens on demand."""

    lengths: np.ndarray
    first_targets: np.ndarray
    total_tokens: int

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> EncodedDoc: ...

    def read(self, i: int, start: int = 0, stop: int | None = None) -> EncodedDoc:
        """Tokens [start, stop) of document ``i``."""
        ...


class MemoryDocs:
    """:class:`Docs` over a list of encoded documents held in memory."""

    def __init__(self, docs: Sequence[EncodedDoc]) -> None:
        self.docs = list(docs)
        self.lengths = np.asarray([len(d.ids) for d in self.docs], dtype=np.int64)
        firsts = [np.flatnonzero(d.mask) for d in self.docs]
        self.first_targets = np.asarray([int(h[0]) if h.size else len(d.ids)
                                         for h, d in zip(firsts, self.docs, strict=True)], dtype=np.int64)
        self.total_tokens = int(self.lengths.sum())

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> EncodedDoc:
        return self.docs[int(i)]

    def read(self, i: int, start: int = 0, stop: int | None = None) -> EncodedDoc:
        """Tokens [start, stop) of document ``i``."""
        d = self.docs[int(i)]
        return EncodedDoc(d.ids[start:stop], d.mask[start:stop])


def as_docs(docs: Sequence[EncodedDoc] | Docs) -> Docs:
    """``docs`` as :class:`Docs` (a list is wrapped in :class:`MemoryDocs`)."""
    return docs if isinstance(docs, Docs) else MemoryDocs(docs)


class PackedLoader:
    """Yields packed batches of any sequence length (the curriculum may change it between steps)."""

    def __init__(self, docs: Sequence[EncodedDoc] | Docs, seed: int) -> None:
        if not len(docs):
            raise ValueError("no documents to train on")
        self.docs = as_docs(docs)
        self.seed = seed
        self.epoch = 0
        self.offset = 0
        self._order = np.zeros(0, np.int64)
        self._ends = np.zeros(0, np.int64)
        self._order_epoch = -1
        self.total_tokens = self.docs.total_tokens

    def _epoch_index(self) -> tuple[np.ndarray, np.ndarray]:
        """This epoch's document order and the end offset of each in the epoch's stream (lengths only)."""
        if self._order_epoch != self.epoch:
            self._order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.docs))
            self._ends = np.cumsum(self.docs.lengths[self._order])
            self._order_epoch = self.epoch
        return self._order, self._ends

    def _window(self, start: int, seq_len: int) -> dict[str, np.ndarray]:
        """The window at ``start`` of the epoch stream, reading only its seq_len + 1 tokens."""
        order, ends = self._epoch_index()
        stop = start + seq_len + 1
        k = int(np.searchsorted(ends, start, side="right"))
        ids, mask, doc = [], [], []
        pos = start
        while pos < stop:
            begin = int(ends[k]) - int(self.docs.lengths[order[k]])
            piece = self.docs.read(int(order[k]), pos - begin, min(stop, int(ends[k])) - begin)
            ids.append(piece.ids)
            mask.append(piece.mask)
            doc.append(np.full(len(piece.ids), k, np.int64))
            pos, k = begin + int(self.docs.lengths[order[k]]), k + 1
        return window(Stream(np.concatenate(ids), np.concatenate(mask), np.concatenate(doc)), 0, seq_len)

    def next_batch(self, batch: int, seq_len: int, rank: int = 0, world: int = 1) -> dict[str, torch.Tensor]:
        """The next ``batch`` sequences for ``rank`` out of ``batch x world`` consumed by all ranks."""
        need = batch * world * seq_len + 1
        if need > self.total_tokens:
            raise ValueError(f"the corpus has {self.total_tokens} tokens, fewer than one global micro-batch "
                             f"({batch * world} x {seq_len}); lower data.seqLen or data.microBatchSize")
        if self.offset + need > self.total_tokens:
            self.epoch += 1
            self.offset = 0
        rows = [self._window(self.offset + (rank * batch + i) * seq_len, seq_len) for i in range(batch)]
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


class SampleLoader:
    """SFT loader: chat samples packed whole into windows (see :func:`~trex.trainer.data.packing.fit`).

    Each epoch visits the samples in an order shuffled by (seed, epoch); a window takes the next samples
    while they fit and is padded; a sample longer than the window is truncated or dropped by the packing
    policy. State is (epoch, cursor into that epoch's order), so a resumed loader yields exactly the batches
    the uninterrupted one would have, whatever sequence length each step asks for.
    """

    def __init__(self, docs: Sequence[EncodedDoc] | Docs, seed: int, pad_id: int) -> None:
        if not len(docs):
            raise ValueError("no documents to train on")
        self.docs = as_docs(docs)
        self.seed = seed
        self.pad_id = pad_id
        self.epoch = 0
        self.cursor = 0
        self.counts = {"whole": 0, "truncated": 0, "dropped": 0}
        """Samples placed whole, truncated and dropped so far (in this process)."""
        self.total_tokens = self.docs.total_tokens
        self._order: np.ndarray | None = None
        self._order_epoch = -1

    def _next_doc(self) -> int:
        if self._order is None or self._order_epoch != self.epoch:
            self._order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.docs))
            self._order_epoch = self.epoch
        return int(self._order[self.cursor])

    def _advance(self) -> None:
        self.cursor += 1
        if self.cursor == len(self.docs):
            self.epoch, self.cursor = self.epoch + 1, 0

    def _plan_row(self, seq_len: int) -> list[int]:
        """The documents of the next window (from lengths alone); one longer than seq_len is truncated."""
        picked: list[int] = []
        used = 0
        for _ in range(len(self.docs)):  # at most one pass: a pass of dropped samples means none can fit
            doc = self._next_doc()
            length = int(self.docs.lengths[doc])
            verdict = fit_len(length, int(self.docs.first_targets[doc]), seq_len)
            if verdict == "dropped":
                self.counts["dropped"] += 1
                self._advance()
                continue
            if verdict == "truncated":
                if picked:
                    break  # it starts the next window
                self.counts["truncated"] += 1
                self._advance()
                return [doc]
            if used + length > seq_len:
                break
            picked.append(doc)
            used += length
            self.counts["whole"] += 1
            self._advance()
        if not picked:
            raise ValueError(f"data.seqLen: no sample's prompt fits a window of {seq_len} tokens")
        return picked

    def _row(self, picked: list[int], seq_len: int) -> dict[str, np.ndarray]:
        """The packed window of ``picked`` (a truncated sample reads only the seq_len + 1 tokens it uses)."""
        if len(picked) == 1 and int(self.docs.lengths[picked[0]]) > seq_len:
            return pack_samples([self.docs.read(picked[0], 0, seq_len + 1)], seq_len, self.pad_id)
        return pack_samples([self.docs.read(i) for i in picked], seq_len, self.pad_id)

    def next_batch(self, batch: int, seq_len: int, rank: int = 0, world: int = 1) -> dict[str, torch.Tensor]:
        """The next ``batch`` windows for ``rank`` out of ``batch x world`` planned for all ranks (every rank
        plans all of them from the lengths, to stay in step, and reads the tokens of its own only)."""
        plans = [self._plan_row(seq_len) for _ in range(batch * world)][rank * batch:(rank + 1) * batch]
        rows = [self._row(p, seq_len) for p in plans]
        return {k: torch.from_numpy(np.stack([r[k] for r in rows])) for k in rows[0]}

    def state_dict(self) -> dict[str, Any]:
        """Data position: epoch and cursor (and the seed it applies to)."""
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        if int(state["seed"]) != self.seed:
            raise ValueError(f"checkpoint data seed {state['seed']} differs from data.seed {self.seed}")
        if "cursor" not in state:
            raise ValueError("checkpoint data position is a token offset (text packing), not an SFT sample cursor")
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
