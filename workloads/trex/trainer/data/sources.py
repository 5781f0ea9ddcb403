"""Record sources: JSONL files or directories of shards, format detection, and a built-in demo corpus."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """Bad training data; the message names the file and line."""


def jsonl_files(path: str | Path) -> list[Path]:
    """The JSONL files of ``path``: a file, a directory of *.jsonl shards, or a glob such as dir/sft-*.jsonl
    (name order)."""
    p = Path(path)
    if any(ch in str(path) for ch in "*?["):
        matches = sorted(f for f in p.parent.glob(p.name) if f.is_file())
        if not matches:
            raise DataError(f"data.train: pattern {path} matches no files")
        return matches
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix == ".jsonl" and f.is_file())
        if not files:
            raise DataError(f"data.train: directory {p} contains no .jsonl files")
        return files
    if not p.is_file():
        raise DataError(f"data.train: {p} does not exist")
    return [p]


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of every JSONL file under ``path``; malformed lines raise naming file:line."""
    for f in jsonl_files(path):
        with open(f, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{f}:{lineno}: invalid JSON ({e.msg})") from None
                if not isinstance(rec, dict):
                    raise DataError(f"{f}:{lineno}: a record must be a JSON object")
                yield rec


def record_format(rec: dict[str, Any], where: str = "") -> str:
    """"text" for {"text": str}, "chat" for {"messages": [{"role", "content"}, ...]}; else a DataError."""
    if isinstance(rec.get("text"), str):
        return "text"
    msgs = rec.get("messages")
    if isinstance(msgs, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs
    ):
        return "chat"
    raise DataError(f"{where}record is neither {{\"text\": str}} nor {{\"messages\": [{{\"role\", \"content\"}}]}}")


def load_records(path: str | Path, fmt: str = "auto") -> tuple[str, list[dict[str, Any]]]:
    """All records of ``path`` and their format (``auto`` detects it from the first record; all must agree)."""
    records = list(iter_jsonl(path))
    if not records:
        raise DataError(f"data.train: {path} holds no records")
    detected = record_format(records[0], f"{path}: first ")
    if fmt != "auto" and fmt != detected:
        raise DataError(f"data.format is {fmt!r} but {path} holds {detected!r} records")
    for i, rec in enumerate(records):
        if record_format(rec, f"{path}: record {i + 1}: ") != detected:
            raise DataError(f"{path}: record {i + 1} is not {detected!r} like the first record")
    return detected, records


def corpus_fingerprint(path: str | Path) -> str:
    """Hash of file names, sizes and mtimes: identifies a corpus for the tokenizer cache."""
    h = hashlib.sha256()
    for f in jsonl_files(path):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


_ITEMS = ["steel", "wheat", "engines", "chairs", "tables", "batteries", "paint", "cement", "coffee", "cable"]
_SITES = ["north", "south", "east", "west", "central", "harbor", "valley", "airport"]


def demo_corpus(n_docs: int = 1500, seed: int = 0) -> list[str]:
    """Deterministic small OR-flavoured documents (arithmetic, counting, repeated structure) to learn from."""
    rng = random.Random(seed)
    docs: list[str] = []
    for i in range(n_docs):
        kind = i % 3
        item, site = rng.choice(_ITEMS), rng.choice(_SITES)
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        if kind == 0:
            docs.append(
                f"The {site} plant makes {item}. Each unit needs {a} hours and the plant has {a * b} hours. "
                f"So the plant can make at most {b} units of {item}."
            )
        elif kind == 1:
            n = rng.randint(3, 7)
            seq = " ".join(str(a + k * b) for k in range(n))
            docs.append(f"Count {item} in steps of {b} from {a}: {seq}. The next value is {a + n * b}.")
        else:
            c = rng.randint(1, 9)
            docs.append(
                f"Minimize cost: ship {item} from {site} at {c} per ton. Demand is {a} tons and supply is "
                f"{a + b} tons. The optimal plan ships {a} tons for a cost of {a * c}."
            )
    return docs
