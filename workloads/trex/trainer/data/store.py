"""Pre-tokenised token store: written once, then every rank reads only the token ranges of its own windows.

The layout follows Megatron's indexed dataset: ``data.bin`` holds every document's token ids back to back (uint16
when the vocabulary fits, else uint32), ``data.mask.bin`` the per-token loss mask (chat only: text trains on
every token), ``data.idx`` the document index (int64 offsets, then int64 first-target positions) and
``meta.json`` a small header (version, dtype, counts, format, key). The directory is named by a key hashing the
sources' fingerprint, the tokenizer's bytes and the encoding settings, so a stale store is never read; it is
written under a temporary name and renamed into place, so a reader sees a whole store or none.

Readers hold the index in memory and fetch tokens with positional reads (``pread``) of exactly a window's
byte range. A memory map would serve the same bytes, but the kernel maps cached file pages a whole folio at a
time (up to 2 MiB), so with ranks' windows interleaved every rank's resident set would grow towards the whole
file; positional reads keep a rank's memory and reads at its windows.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from trex.text.chat import EncodedDoc

STORE_VERSION = 1
"""Part of the key and the header: a store written by another layout is never read."""


def store_key(corpus_id: str, tokenizer_json: str, fmt: str, reasoning_mode: str | None,
              think_max_prompt: str | None) -> str:
    """The store's name: sources fingerprint + tokenizer + encoding settings (+ layout version)."""
    h = hashlib.sha256()
    for part in (f"v{STORE_VERSION}", corpus_id, hashlib.sha256(tokenizer_json.encode()).hexdigest(), fmt,
                 str(reasoning_mode), str(think_max_prompt)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:20]


def store_path(cache_dir: Path, key: str) -> Path:
    """Where the store of ``key`` lives under ``cache_dir``."""
    return cache_dir / f"store-{key}"


def write_store(path: Path, docs: Iterator[EncodedDoc], fmt: str, vocab_size: int, key: str) -> Path:
    """Stream ``docs`` into a store at ``path`` (skipped when a whole store is already there); returns ``path``.

    Holds one document at a time: the token and mask files are appended to, the index grows by two int64 per
    document. Written to a temporary sibling and renamed into place (a concurrent writer's store wins)."""
    if (path / "meta.json").is_file():
        return path
    dtype = np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _write(tmp, docs, fmt, dtype, key)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed write leaves nothing behind
        raise
    try:
        os.replace(tmp, path)
    except OSError:  # another writer renamed its (identical) store first
        shutil.rmtree(tmp, ignore_errors=True)
        if not (path / "meta.json").is_file():
            raise
    return path


def _write(tmp: Path, docs: Iterator[EncodedDoc], fmt: str, dtype: np.dtype[Any], key: str) -> None:
    """The store's files in ``tmp``, each flushed to disk before the caller renames the directory."""
    offsets = [0]
    firsts: list[int] = []
    with open(tmp / "data.bin", "wb") as fb, open(tmp / "data.mask.bin", "wb") as fm:
        for d in docs:
            fb.write(np.ascontiguousarray(d.ids, dtype=dtype).tobytes())
            if fmt == "chat":
                fm.write(np.ascontiguousarray(d.mask, dtype=np.int8).tobytes())
            hits = np.flatnonzero(d.mask)
            firsts.append(int(hits[0]) if hits.size else len(d.ids))
            offsets.append(offsets[-1] + len(d.ids))
        for fh in (fb, fm):
            fh.flush()
            os.fsync(fh.fileno())
    if fmt != "chat":
        (tmp / "data.mask.bin").unlink()
    np.concatenate([np.asarray(offsets, np.int64), np.asarray(firsts, np.int64)]).tofile(tmp / "data.idx")
    meta = {"version": STORE_VERSION, "dtype": dtype.name, "docs": len(firsts), "tokens": offsets[-1],
            "format": fmt, "key": key}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    for name in ("data.idx", "meta.json"):
        with open(tmp / name, "rb") as done:
            os.fsync(done.fileno())


class TokenStore:
    """A store opened read-only: the index in memory (two int64 per document), tokens read on demand.

    Indexable like a list of :class:`EncodedDoc`; :meth:`read` returns a token range of one document (one
    positional read of its ids, one of its mask) and counts the bytes (``bytes_read``)."""

    def __init__(self, path: Path, key: str | None = None) -> None:
        meta_file = path / "meta.json"
        if not meta_file.is_file():
            raise ValueError(f"token store {path} is missing or incomplete (no meta.json)")
        meta: dict[str, Any] = json.loads(meta_file.read_text(encoding="utf-8"))
        if meta.get("version") != STORE_VERSION:
            raise ValueError(f"token store {path}: version {meta.get('version')}, this trex reads {STORE_VERSION}")
        if key is not None and meta.get("key") != key:
            raise ValueError(f"token store {path}: key {meta.get('key')} does not match the sources ({key})")
        self.path = path
        self.format = str(meta["format"])
        n, total = int(meta["docs"]), int(meta["tokens"])
        idx = np.fromfile(path / "data.idx", dtype=np.int64)
        if idx.shape[0] != 2 * n + 1 or int(idx[n]) != total:
            raise ValueError(f"token store {path}: data.idx does not match meta.json ({n} docs, {total} tokens)")
        self.offsets = idx[:n + 1]
        self.lengths = np.diff(self.offsets)
        self.first_targets = idx[n + 1:]
        self.bytes_read = 0
        """Token and mask bytes read by :meth:`read` (the header and index are read once at open)."""
        self.dtype = np.dtype(meta["dtype"])
        self._ids = open(path / "data.bin", "rb", buffering=0)
        mask_file = path / "data.mask.bin"
        self._mask = open(mask_file, "rb", buffering=0) if mask_file.is_file() else None
        self.total_tokens = total

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def read(self, i: int, start: int = 0, stop: int | None = None) -> EncodedDoc:
        """Tokens [start, stop) of document ``i`` (the whole document by default)."""
        a = int(self.offsets[i]) + start
        n = (int(self.lengths[i]) if stop is None else stop) - start
        raw = os.pread(self._ids.fileno(), n * self.dtype.itemsize, a * self.dtype.itemsize)
        ids = np.frombuffer(raw, dtype=self.dtype).astype(np.int64)
        if self._mask is None:
            mask = np.ones(n, np.int8)
        else:
            mask = np.frombuffer(os.pread(self._mask.fileno(), n, a), dtype=np.int8).copy()
        if ids.shape[0] != n or mask.shape[0] != n:
            raise ValueError(f"token store {self.path}: short read of document {i} (truncated data file?)")
        self.bytes_read += n * (self.dtype.itemsize + (0 if self._mask is None else 1))
        return EncodedDoc(ids, mask)

    def __getitem__(self, i: int) -> EncodedDoc:
        return self.read(int(i))
