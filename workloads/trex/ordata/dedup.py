"""Exact and near-duplicate removal (MinHash LSH on word shingles) and benchmark decontamination.

:class:`Deduper` is streaming: items arrive one by one through :meth:`Deduper.check_and_add`, which
returns ``None`` for a new item (and remembers it) or ``(kind, other_id)`` for a rejected one:

* ``exact`` - same content hash (the IR hash) or the same normalised text as an earlier item;
* ``near`` - estimated Jaccard similarity of word shingles >= ``near_threshold`` with an earlier item;
* ``decontam.benchmark_overlap`` - similarity >= the threshold with a problem of a benchmark test set
  loaded by :func:`load_benchmark_texts` (JSONL / JSON lists with ``en_question``, ``question`` or
  ``Question``; Bench4Opt folders or tarballs with ``wp.txt`` / ``wp_concise.txt``).
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from datasketch import MinHash, MinHashLSH

if TYPE_CHECKING:
    from trex.ordata.config import DedupConfig

QUESTION_FIELDS = ("en_question", "question", "Question")
BENCH4OPT_FILES = ("wp.txt", "wp_concise.txt")
OVERLAP = "decontam.benchmark_overlap"
_WORD = re.compile(r"\w+")


def normalise(text: str) -> str:
    """Lower-case words separated by single spaces (punctuation and layout ignored)."""
    return " ".join(_WORD.findall(text.lower()))


def shingles(text: str, k: int = 3) -> set[str]:
    """Word ``k``-grams of the normalised text (the whole text when it has fewer than ``k`` words)."""
    words = normalise(text).split()
    if len(words) <= k:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i:i + k]) for i in range(len(words) - k + 1)}


def minhash(text: str, num_perm: int = 128, k: int = 3) -> MinHash:
    """MinHash signature of the text's word shingles (fixed seed, so signatures compare across runs)."""
    m = MinHash(num_perm=num_perm, seed=1)
    m.update_batch([s.encode("utf-8") for s in shingles(text, k)])
    return m


# --- benchmark loading ----------------------------------------------------------------------------
def _question(obj: object) -> str | None:
    if isinstance(obj, dict):
        for f in QUESTION_FIELDS:
            v = obj.get(f)
            if isinstance(v, str) and v.strip():
                return v
    return None


def _from_json_file(path: Path) -> Iterator[tuple[str, str]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        for i, line in enumerate(text.splitlines()):
            if line.strip():
                q = _question(json.loads(line))
                if q:
                    yield f"{path.name}:{i}", q
        return
    data = json.loads(text)
    items = data if isinstance(data, list) else list(data.values()) if isinstance(data, dict) else []
    for i, obj in enumerate(items):
        q = _question(obj)
        if q:
            yield f"{path.name}:{i}", q


def _from_tarball(path: Path) -> Iterator[tuple[str, str]]:
    with tarfile.open(path, "r:*") as tar:
        for member in tar:
            if member.isfile() and Path(member.name).name in BENCH4OPT_FILES:
                fh = tar.extractfile(member)
                if fh is not None:
                    yield f"{path.name}:{member.name}", fh.read().decode("utf-8", errors="replace")


def _from_path(path: Path) -> Iterator[tuple[str, str]]:
    name = path.name
    if name in BENCH4OPT_FILES:
        yield str(path), path.read_text(encoding="utf-8", errors="replace")
    elif name.endswith((".tar.gz", ".tgz", ".tar")):
        yield from _from_tarball(path)
    elif path.suffix in (".json", ".jsonl"):
        yield from _from_json_file(path)


def load_benchmark_texts(paths: Iterable[str | Path]) -> list[tuple[str, str]]:
    """``(id, problem text)`` of every benchmark problem under the given files or folders (recursive)."""
    out: list[tuple[str, str]] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"dedup.decontaminate: {p} does not exist")
        files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
        for f in files:
            out.extend(_from_path(f))
    return out


# --- deduper ------------------------------------------------------------------------------------------
class Deduper:
    """Streaming exact + near-duplicate filter with an optional benchmark overlap check."""

    def __init__(
        self,
        cfg: DedupConfig | None = None,
        *,
        near_threshold: float | None = None,
        num_perm: int | None = None,
        shingle_words: int = 3,
        benchmarks: Sequence[tuple[str, str]] | None = None,
    ) -> None:
        self.threshold = float(near_threshold if near_threshold is not None else (cfg.near_threshold if cfg else 0.85))
        self.num_perm = int(num_perm if num_perm is not None else (cfg.num_perm if cfg else 128))
        if not 0 < self.threshold <= 1:
            raise ValueError(f"near_threshold must be in (0, 1], got {self.threshold}")
        if self.num_perm < 16:
            raise ValueError(f"num_perm must be >= 16, got {self.num_perm}")
        self.k = shingle_words
        self._hashes: dict[str, str] = {}
        self._sigs: dict[str, MinHash] = {}
        self._lsh = MinHashLSH(threshold=self.threshold, num_perm=self.num_perm)
        bench = list(benchmarks or [])
        if cfg is not None and cfg.decontaminate:
            bench += load_benchmark_texts(cfg.decontaminate)
        self._bench_sigs: dict[str, MinHash] = {}
        self._bench_lsh = MinHashLSH(threshold=self.threshold, num_perm=self.num_perm)
        for bid, text in bench:
            if bid in self._bench_sigs:
                continue
            sig = minhash(text, self.num_perm, self.k)
            self._bench_sigs[bid] = sig
            self._bench_lsh.insert(bid, sig)

    @property
    def benchmark_items(self) -> int:
        """Benchmark problems loaded for decontamination."""
        return len(self._bench_sigs)

    def __len__(self) -> int:
        return len(self._sigs)

    def _best(self, lsh: MinHashLSH, sigs: dict[str, MinHash], sig: MinHash) -> tuple[str, float] | None:
        scored = [(key, sigs[key].jaccard(sig)) for key in lsh.query(sig)]
        scored = [(k, j) for k, j in scored if j >= self.threshold]
        return max(scored, key=lambda kv: (kv[1], kv[0])) if scored else None

    def overlap(self, text: str) -> tuple[str, float] | None:
        """The most similar benchmark problem above the threshold: (id, estimated Jaccard), else None."""
        return self._best(self._bench_lsh, self._bench_sigs, minhash(text, self.num_perm, self.k))

    def check_and_add(self, item_id: str, ir_hash: str | None, text: str) -> tuple[str, str] | None:
        """None (new item, now remembered) or (``exact`` | ``near`` | ``decontam.benchmark_overlap``, other id)."""
        text_key = "text:" + hashlib.sha256(normalise(text).encode()).hexdigest()
        for key in (f"ir:{ir_hash}" if ir_hash else None, text_key):
            if key is not None and key in self._hashes:
                return "exact", self._hashes[key]
        sig = minhash(text, self.num_perm, self.k)
        hit = self._best(self._bench_lsh, self._bench_sigs, sig)
        if hit is not None:
            return OVERLAP, hit[0]
        hit = self._best(self._lsh, self._sigs, sig)
        if hit is not None:
            return "near", hit[0]
        if ir_hash:
            self._hashes[f"ir:{ir_hash}"] = item_id
        self._hashes[text_key] = item_id
        if item_id not in self._sigs:
            self._sigs[item_id] = sig
            self._lsh.insert(item_id, sig)
        return None
