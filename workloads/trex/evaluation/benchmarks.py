"""Benchmark loading: a published format (:mod:`trex.verify.formats`) chosen by name, by ``format`` or from the
content, and the dataset's provenance."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trex.verify.formats import FORMATS, bench4opt, industryor, mamo, nl4opt, optibench, optmath, ordata
from trex.verify.items import Item, read_json_records, sha256_bytes


@dataclass
class Dataset:
    """A loaded benchmark: its items and the provenance every run records."""

    name: str
    format: str
    version: str
    path: str
    items: list[Item]
    content_hash: str
    """sha256 over the source bytes (files in sorted relative-path order)."""

    @property
    def count(self) -> int:
        """Number of items."""
        return len(self.items)

    def provenance(self) -> dict[str, Any]:
        """Name, format, version, path, item count and content hash."""
        return {"name": self.name, "format": self.format, "version": self.version, "path": self.path,
                "items": self.count, "content_hash": self.content_hash}


_BY_NAME = {
    "nl4opt": "nl4opt", "mamo_easy": "mamo", "mamo_complex": "mamo", "optibench": "optibench",
    "nl4opt_e": "optibench", "industryor": "industryor", "industryor_fixed": "industryor",
    "optmath": "optmath", "bench4opt": "bench4opt", "ordata": "ordata",
}
# Detection order matters: more specific field sets first.
_DETECT: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("optibench", optibench.REQUIRED), ("mamo", mamo.REQUIRED), ("industryor", industryor.DETECT),
    ("optmath", optmath.REQUIRED), ("nl4opt", nl4opt.REQUIRED), ("ordata", ordata.REQUIRED),
)


def default_format(name: str) -> str:
    """The format a benchmark name is published in."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(_BY_NAME))}") from None


def _is_bench4opt_path(path: Path) -> bool:
    return path.is_dir() or path.name.endswith((".tar.gz", ".tgz", ".tar"))


def detect_format(path: Path, data: bytes | None = None) -> str:
    """Format from the content: a folder or tarball is Bench4Opt, JSON records by their field names."""
    if _is_bench4opt_path(path):
        return "bench4opt"
    records = read_json_records(data if data is not None else path.read_bytes(), str(path))
    if not records:
        raise ValueError(f"{path}: no records")
    keys = set(records[0])
    for fmt, required in _DETECT:
        if set(required) <= keys:
            return fmt
    raise ValueError(f"{path}: cannot tell the format from fields {sorted(keys)}; set format explicitly")


def _version(path: Path, content_hash: str) -> str:
    """File name plus content-hash prefix: two copies of a dataset with different fixes never share it."""
    return f"{path.name}@sha256:{content_hash[:12]}"


def load_benchmark(name: str, path: str | Path, fmt: str = "auto", *, limit: int | None = None,
                   bench4opt_text: str = "wp.txt") -> Dataset:
    """Load one benchmark; ValueError names the file and the record or field at fault."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"benchmark {name}: path {str(path)!r} does not exist")
    if fmt == "auto":
        fmt = default_format(name)
        if fmt != "bench4opt" and _is_bench4opt_path(p):
            raise ValueError(f"benchmark {name}: {str(path)!r} is a folder or tarball, expected a JSON/JSONL file")
        if fmt != "bench4opt":
            data = p.read_bytes()
            required = FORMATS[fmt].REQUIRED
            first = read_json_records(data, str(p))[:1]
            if first and not set(required) <= set(first[0]):
                fmt = detect_format(p, data)
    if fmt not in FORMATS:
        raise ValueError(f"benchmark {name}: unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    items: list[Item]
    if fmt == "bench4opt":
        items, content_hash = bench4opt.load(p, bench4opt_text)
    else:
        data = p.read_bytes()
        parse: Callable[[bytes, str], list[Item]] = FORMATS[fmt].parse
        items = parse(data, str(p))
        content_hash = sha256_bytes(data)
    ids = [it.id for it in items]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"benchmark {name}: item id {dup!r} occurs more than once in {path}")
    if limit is not None:
        items = items[:limit]
    src = bench4opt.source_of(p) if fmt == "bench4opt" else p
    return Dataset(name=name, format=fmt, version=_version(src, content_hash), path=str(path),
                   items=items, content_hash=content_hash)

