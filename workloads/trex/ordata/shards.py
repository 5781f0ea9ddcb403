"""Shard files on disk: atomic writes, JSONL parts with sha256, per-shard progress and manifests.

Layout of an output directory::

    shard-00000-of-00004/
        cpt-00000.jsonl  sft-00000.jsonl  ...   parts of ``samples_per_file`` samples each
        progress.json                           finished parts and counters (resume point)
        manifest.json                           written last; its presence + hashes mean "done"
    merged/                                     written by ``trex ordata merge``
    prompts/                                    GRPO's prompts with their truths (merge)
    heldout/                                    held-out samples for evaluation (merge, heldoutFraction > 0)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from trex.fsio import atomic_write_bytes

SCHEMA = "trex.ordata/v1"
MANIFEST = "manifest.json"
PROGRESS = "progress.json"


def shard_dir_name(shard_index: int, num_shards: int) -> str:
    """Deterministic folder name of one shard."""
    return f"shard-{shard_index:05d}-of-{num_shards:05d}"


def shard_positions(count: int, shard_index: int, num_shards: int) -> range:
    """Global instance indices owned by a shard: i with i % num_shards == shard_index."""
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index must be in [0, {num_shards}), got {shard_index}")
    return range(shard_index, count, num_shards)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write_json(path: Path, obj: Any) -> None:
    """Atomically write pretty, key-sorted JSON."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def jsonl_bytes(records: Iterable[dict[str, Any]]) -> bytes:
    """One compact, key-sorted JSON object per line (stable bytes for stable hashes)."""
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records).encode()


def write_part(path: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Atomically write a JSONL part; returns its manifest entry (name, count, sha256)."""
    data = jsonl_bytes(records)
    atomic_write_bytes(path, data)
    return {"name": path.name, "count": len(records), "sha256": hashlib.sha256(data).hexdigest()}


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's object, or None when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def files_verified(folder: Path, entries: list[dict[str, Any]]) -> bool:
    """Every listed file exists and matches its sha256."""
    for e in entries:
        p = folder / e["name"]
        if not p.is_file() or sha256_file(p) != e["sha256"]:
            return False
    return True


def manifest_complete(folder: Path, config_hash: str | None = None) -> dict[str, Any] | None:
    """The shard's manifest when it is present, complete, for this config and all its files verify."""
    m = read_json(folder / MANIFEST)
    if m is None or m.get("schema") != SCHEMA or not m.get("complete"):
        return None
    if config_hash is not None and m.get("config_hash") != config_hash:
        return None
    return m if files_verified(folder, m.get("files", [])) else None


def remove_unlisted(folder: Path, keep: set[str]) -> None:
    """Delete part files and temp files not in ``keep`` (left by an interrupted run)."""
    if not folder.is_dir():
        return
    for p in folder.iterdir():
        if p.is_file() and p.name not in keep and (p.suffix in (".jsonl", ".tmp") or p.name == MANIFEST):
            p.unlink()
