"""The rollout write-ahead log: every generated token is appended as it is sampled.

File layout: an 8-byte magic, a length-prefixed JSON header (what the rollout is: seed, sampling,
sample ids, a digest of the prompts) with its CRC32, then fixed 36-byte records
(sample id, policy version, position in the response, token, log-prob, CRC32). Each decode step's
records reach the kernel in one write before the next step, so a process killed by SIGTERM or
SIGKILL loses nothing it sampled; ``fsync_every`` tokens the log is also fsynced (0: at close only),
which bounds what a machine crash can lose. A reader keeps the records up to the first torn or
corrupt one and cuts the file there, so appends after a crash continue a clean log.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trex.fsio import fsync_dir

MAGIC = b"TREXWAL1"
_HEAD = struct.Struct("<I")
_REC = struct.Struct("<qqiid")
_CRC = struct.Struct("<I")
RECORD_SIZE = _REC.size + _CRC.size


@dataclass
class LoggedSample:
    """What the log holds of one sample: its tokens so far with their log-probs and policy versions."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Record:
    """One generated token."""

    sample_id: int
    policy_version: int
    position: int
    token: int
    logprob: float

    def encode(self) -> bytes:
        """The record's 36 bytes."""
        body = _REC.pack(self.sample_id, self.policy_version, self.position, self.token, self.logprob)
        return body + _CRC.pack(zlib.crc32(body))


def _header_bytes(header: dict[str, Any]) -> bytes:
    body = json.dumps(header, sort_keys=True).encode()
    return MAGIC + _HEAD.pack(len(body)) + body + _CRC.pack(zlib.crc32(body))


def _read_header(data: bytes, path: Path) -> tuple[dict[str, Any], int]:
    """The header and the offset of the first record; ValueError naming the file if it is not a log."""
    if data[: len(MAGIC)] != MAGIC:
        raise ValueError(f"{path}: not a rollout log (bad magic)")
    start = len(MAGIC) + _HEAD.size
    (n,) = _HEAD.unpack_from(data, len(MAGIC))
    body = data[start: start + n]
    crc = data[start + n: start + n + _CRC.size]
    if len(body) != n or len(crc) != _CRC.size or _CRC.unpack(crc)[0] != zlib.crc32(body):
        raise ValueError(f"{path}: rollout log header is torn or corrupt")
    parsed: dict[str, Any] = json.loads(body)
    return parsed, start + n + _CRC.size


def parse_records(data: bytes, offset: int) -> tuple[list[Record], int]:
    """Records from data[offset:] up to the first torn or corrupt one, and the end of the last good one."""
    out: list[Record] = []
    while offset + RECORD_SIZE <= len(data):
        body = data[offset: offset + _REC.size]
        (crc,) = _CRC.unpack_from(data, offset + _REC.size)
        if crc != zlib.crc32(body):
            break
        out.append(Record(*_REC.unpack(body)))
        offset += RECORD_SIZE
    return out, offset


def read_log(data: bytes, path: Path) -> tuple[dict[str, Any], list[Record], int]:
    """A log's header, its good records and where they end (less than len(data) after a torn write)."""
    header, offset = _read_header(data, path)
    records, end = parse_records(data, offset)
    return header, records, end


def group_records(records: Sequence[Record], path: Path) -> dict[int, LoggedSample]:
    """Records per sample id, checking each sample's positions run 0, 1, 2, ..."""
    samples: dict[int, LoggedSample] = {}
    for r in records:
        s = samples.setdefault(r.sample_id, LoggedSample())
        if r.position != len(s.tokens):
            raise ValueError(f"{path}: sample {r.sample_id} logs position {r.position} after "
                             f"{len(s.tokens)} tokens")
        s.tokens.append(r.token)
        s.logprobs.append(r.logprob)
        s.versions.append(r.policy_version)
    return samples


class RolloutLog:
    """An append-only token log at ``path``. :meth:`open` returns what an earlier run logged (empty
    for a new log); :meth:`append` writes one decode step's tokens."""

    def __init__(self, path: str | os.PathLike[str], fsync_every: int = 256) -> None:
        if fsync_every < 0:
            raise ValueError(f"fsync_every must be >= 0 (0 = at close only), got {fsync_every}")
        self.path = Path(path)
        self.fsync_every = fsync_every
        self._fd: int | None = None
        self._unsynced = 0

    def open(self, header: dict[str, Any]) -> dict[int, LoggedSample]:
        """Open (or create) the log for the rollout `header` describes; the samples logged so far.
        A log written for a different rollout is an error naming the first differing header key."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path}: log already open")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = self.path.read_bytes() if self.path.exists() else b""
        samples: dict[int, LoggedSample] = {}
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            if data:
                found, records, end = read_log(data, self.path)
                expected = json.loads(json.dumps(header, sort_keys=True))
                if found != expected:
                    key = next(k for k in sorted(set(found) | set(expected)) if found.get(k) != expected.get(k))
                    raise ValueError(f"{self.path}: the log belongs to another rollout ({key!r} differs)")
                samples = group_records(records, self.path)
                if end != len(data):
                    os.ftruncate(fd, end)
            else:
                os.write(fd, _header_bytes(header))
            os.fsync(fd)
            if not data:
                fsync_dir(self.path.parent)  # the new file's entry survives a crash too
            os.lseek(fd, 0, os.SEEK_END)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return samples

    def append(self, records: Sequence[Record]) -> None:
        """Write one step's records (one write call); fsync once fsync_every tokens are unsynced."""
        if self._fd is None:
            raise RuntimeError(f"{self.path}: log is not open")
        if not records:
            return
        data = b"".join(r.encode() for r in records)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        self._unsynced += len(records)
        if self.fsync_every and self._unsynced >= self.fsync_every:
            os.fsync(self._fd)
            self._unsynced = 0

    def close(self) -> None:
        """fsync and close (idempotent)."""
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            self._unsynced = 0
