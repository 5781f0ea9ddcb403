"""The teachers' hidden-state cache: host memory up to a byte limit, spilled to disk beyond it.

A teacher's trunk runs once per on-policy batch and leaves the input of its head here; the loss reads
it back (one teacher after the other) and recomputes the logits with the teacher's head. Bytes served
from memory, written to disk and read back from disk are counted for the step's metrics.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class CacheStats:
    """Bytes through the cache since the last reset."""

    hit_bytes: int = 0
    """Served from host memory."""
    spilled_bytes: int = 0
    """Written to the spill folder (the memory limit was reached)."""
    spill_read_bytes: int = 0
    """Read back from the spill folder."""


class HiddenStateCache:
    """Tensors by key, in host memory while the total stays within ``limit_bytes``, else on disk under
    ``spill_dir`` (one file per entry, removed when the entry is dropped)."""

    def __init__(self, limit_bytes: int, spill_dir: str | Path) -> None:
        if limit_bytes < 0:
            raise ValueError(f"limit_bytes must be >= 0, got {limit_bytes}")
        self.limit = limit_bytes
        self.dir = Path(spill_dir) / f"run-{uuid.uuid4().hex[:12]}"
        self._memory: dict[str, torch.Tensor] = {}
        self._disk: dict[str, Path] = {}
        self.resident_bytes = 0
        self.stats = CacheStats()

    def put(self, key: str, value: torch.Tensor) -> None:
        """Store a copy of ``value`` on the host (replacing an entry of the same key)."""
        self.drop(key)
        host = value.detach().to("cpu", copy=True).contiguous()
        size = host.numel() * host.element_size()
        if self.resident_bytes + size <= self.limit:
            self._memory[key] = host
            self.resident_bytes += size
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{len(self._disk)}-{uuid.uuid4().hex[:8]}.pt"
        torch.save(host, path)
        self._disk[key] = path
        self.stats.spilled_bytes += size

    def get(self, key: str) -> torch.Tensor:
        """The stored tensor (on the host)."""
        if key in self._memory:
            t = self._memory[key]
            self.stats.hit_bytes += t.numel() * t.element_size()
            return t
        if key in self._disk:
            loaded: torch.Tensor = torch.load(self._disk[key], weights_only=True)
            self.stats.spill_read_bytes += loaded.numel() * loaded.element_size()
            return loaded
        raise KeyError(f"no cached hidden states for {key!r}")

    def __contains__(self, key: str) -> bool:
        return key in self._memory or key in self._disk

    def drop(self, key: str) -> None:
        """Forget an entry (its spill file too)."""
        t = self._memory.pop(key, None)
        if t is not None:
            self.resident_bytes -= t.numel() * t.element_size()
        path = self._disk.pop(key, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def clear(self) -> None:
        """Forget every entry and remove the spill folder."""
        for key in list(self._memory) + list(self._disk):
            self.drop(key)
        shutil.rmtree(self.dir, ignore_errors=True)

    def take_stats(self) -> CacheStats:
        """The counters since the last call (then reset)."""
        out, self.stats = self.stats, CacheStats()
        return out
