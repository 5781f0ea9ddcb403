"""Today's in-memory data path, kept as the reference the token store must equal: every rank reads every record,
encodes the whole corpus and packs from the whole token stream (the loaders as they were before the store).

Also the per-rank measurement of data start-up (peak RSS, bytes read) that tests and benchmarks/data_scale.py share.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from trex.prompt_contract import PAD
from trex.text.chat import EncodedDoc, encode_chat, encode_text
from trex.trainer.config import DataConfig
from trex.trainer.data.loader import PackedLoader
from trex.trainer.data.packing import Stream, concat, fit, pack_samples, window
from trex.trainer.data.sources import load_records
from trex.trainer.data.store import TokenStore


class MemoryPackedLoader:
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


class MemorySampleLoader:
    """SFT loader: chat samples packed whole into windows (see :func:`~trex.trainer.data.packing.fit`).

    Each epoch visits the samples in an order shuffled by (seed, epoch); a window takes the next samples
    while they fit and is padded; a sample longer than the window is truncated or dropped by the packing
    policy. State is (epoch, cursor into that epoch's order), so a resumed loader yields exactly the batches
    the uninterrupted one would have, whatever sequence length each step asks for.
    """

    def __init__(self, docs: Sequence[EncodedDoc], seed: int, pad_id: int) -> None:
        if not docs:
            raise ValueError("no documents to train on")
        self.docs = list(docs)
        self.seed = seed
        self.pad_id = pad_id
        self.epoch = 0
        self.cursor = 0
        self.counts = {"whole": 0, "truncated": 0, "dropped": 0}
        """Samples placed whole, truncated and dropped so far (in this process)."""
        self.total_tokens = sum(len(d.ids) for d in self.docs)
        self._order: np.ndarray | None = None
        self._order_epoch = -1

    def _next_doc(self) -> EncodedDoc:
        if self._order is None or self._order_epoch != self.epoch:
            self._order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.docs))
            self._order_epoch = self.epoch
        return self.docs[int(self._order[self.cursor])]

    def _advance(self) -> None:
        self.cursor += 1
        if self.cursor == len(self.docs):
            self.epoch, self.cursor = self.epoch + 1, 0

    def _row(self, seq_len: int) -> dict[str, np.ndarray]:
        picked: list[EncodedDoc] = []
        used = 0
        for _ in range(len(self.docs)):  # at most one pass: a pass of dropped samples means none can fit
            doc = self._next_doc()
            verdict = fit(doc, seq_len)
            if verdict == "dropped":
                self.counts["dropped"] += 1
                self._advance()
                continue
            if verdict == "truncated":
                if picked:
                    break  # it starts the next window
                self.counts["truncated"] += 1
                self._advance()
                return pack_samples([doc], seq_len, self.pad_id)
            if used + len(doc.ids) > seq_len:
                break
            picked.append(doc)
            used += len(doc.ids)
            self.counts["whole"] += 1
            self._advance()
        if not picked:
            raise ValueError(f"data.seqLen: no sample's prompt fits a window of {seq_len} tokens")
        return pack_samples(picked, seq_len, self.pad_id)

    def next_batch(self, batch: int, seq_len: int, rank: int = 0, world: int = 1) -> dict[str, torch.Tensor]:
        """The next ``batch`` windows for ``rank`` out of ``batch x world`` built for all ranks."""
        rows = [self._row(seq_len) for _ in range(batch * world)][rank * batch:(rank + 1) * batch]
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


def memory_loader(cfg: DataConfig, tok: Tokenizer) -> MemoryPackedLoader | MemorySampleLoader:
    """Today's path with a given tokenizer: every record read and encoded in memory."""
    assert cfg.train is not None
    fmt, records = load_records(cfg.train, cfg.format)
    docs = [encode_text(tok, r["text"]) if fmt == "text"
            else encode_chat(tok, r["messages"], cfg.reasoning_mode, cfg.think_max_prompt) for r in records]
    if fmt == "text":
        return MemoryPackedLoader(docs, cfg.seed)
    pad = tok.token_to_id(PAD)
    return MemorySampleLoader(docs, cfg.seed, 0 if pad is None else int(pad))


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise KeyError("rchar")


def _startup_and_epoch(kind: str, cfg: DataConfig, tokenizer_file: str, store_dir: str, rank: int, world: int,
                       batch: int, max_steps: int | None = None) -> None:
    """Data start-up of one rank and one epoch of its batches (at most ``max_steps``)."""
    if kind == "memory":
        loader: Any = memory_loader(cfg, Tokenizer.from_file(tokenizer_file))
    else:
        loader = PackedLoader(TokenStore(Path(store_dir)), cfg.seed)
    steps = (loader.total_tokens - 1) // (batch * world * cfg.seq_len)
    for _ in range(steps if max_steps is None else min(steps, max_steps)):
        loader.next_batch(batch, cfg.seq_len, rank, world)


def _child(conn: Any, kind: str, cfg: DataConfig, tokenizer_file: str, store_dir: str, rank: int, world: int,
           batch: int) -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    base, r0 = _status_kb("VmRSS"), _rchar()
    _startup_and_epoch(kind, cfg, tokenizer_file, store_dir, rank, world, batch)
    conn.send({"peak_bytes": (_status_kb("VmHWM") - base) * 1024, "bytes_read": _rchar() - r0})
    conn.close()


def measure_rank(kind: str, cfg: DataConfig, tokenizer_file: str, store_dir: str, rank: int, world: int,
                 batch: int = 2) -> dict[str, int]:
    """Peak RSS growth and bytes read by ``rank`` of ``world`` for data start-up plus one epoch of its batches,
    in a forked child (``kind``: "memory" = today's path, "store" = the token store)."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, kind, cfg, tokenizer_file, store_dir, rank, world, batch))
    proc.start()
    out: dict[str, int] = parent.recv()
    proc.join()
    return out


def measure(kinds: Sequence[str], cfg: DataConfig, tokenizer_file: str, store_dir: str,
            worlds: Sequence[int] = (1, 2, 4), log: Callable[[str], None] | None = None) -> dict[str, dict[int, dict[str, int]]]:
    """Per path and world size: the maximum over ranks of peak RSS growth and bytes read (today's path measured
    on rank 0 only: every rank reads and encodes the whole corpus alike)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _startup_and_epoch("store", cfg, tokenizer_file, store_dir, 0, 1, 2, max_steps=1)  # first-call code pages
    out: dict[str, dict[int, dict[str, int]]] = {}
    for kind in kinds:
        for world in worlds:
            every = range(world) if kind == "store" else [0]  # today's path does the same on every rank
            ranks = [measure_rank(kind, cfg, tokenizer_file, store_dir, r, world) for r in every]
            out.setdefault(kind, {})[world] = {k: max(r[k] for r in ranks) for k in ("peak_bytes", "bytes_read")}
            if log is not None:
                log(f"{kind:6s} world {world}: peak RSS {out[kind][world]['peak_bytes'] / 2**20:8.1f} MiB, "
                    f"read {out[kind][world]['bytes_read'] / 2**20:8.1f} MiB per rank (max over ranks)")
    return out
