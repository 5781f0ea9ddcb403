"""Data start-up per rank at world 1, 2 and 4: today's in-memory path against the token store.

Usage: python benchmarks/data_scale.py [--mtokens 12] [--seq-len 2048] [--json out.json]

Writes a synthetic JSONL text corpus of about ``--mtokens`` million tokens, trains the tokenizer on a slice of
it, prepares the token store once (timed), then for each path and world size runs every rank in a forked
process: data start-up plus one epoch of that rank's batches (micro-batch 2). Per rank: peak RSS growth
(VmHWM after writing 5 to /proc/self/clear_refs) and bytes read (/proc/self/io rchar); the table shows the maximum over ranks and its ratio to
world 1. Today's path reads and encodes everything on every rank (flat in N); the store reads ~1/N plus its
index.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))

from data_reference import measure
from trex.text.tokenizer import train_bpe
from trex.trainer.config import DataConfig
from trex.trainer.data.build import prepare

SYLLABLES = "ka lo mi ne ru ta shi po de fa gu zo vi be xa qu".split()


def write_corpus(path: Path, approx_tokens: int, seed: int = 0) -> int:
    """A JSONL text corpus of pseudo-words (~1 token a word at a 2k vocabulary); returns the document count."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(SYLLABLES, k=rng.randint(1, 3))) for _ in range(3000)]
    n = 0
    written = 0
    with open(path, "w", encoding="utf-8") as fh:
        while written < approx_tokens:
            k = rng.randint(50, 1500)
            fh.write(json.dumps({"text": " ".join(rng.choices(words, k=k))}) + "\n")
            written += k
            n += 1
    return n


def main() -> int:
    """Run the measurement and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mtokens", type=float, default=12.0)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        docs = write_corpus(root / "corpus.jsonl", int(args.mtokens * 1e6))
        sample = [json.loads(line)["text"] for _, line in zip(range(300), open(root / "corpus.jsonl"), strict=False)]
        tok_file = root / "tokenizer.json"
        train_bpe(sample, 2048).save(str(tok_file))
        cfg = DataConfig.model_validate({"train": str(root / "corpus.jsonl"), "seqLen": args.seq_len,
                                         "tokenizer": {"path": str(tok_file)}, "storeDir": str(root / "stores")})
        t0 = time.perf_counter()
        _, store, _ = prepare(cfg, root / "cache", 65536)
        prep_s = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in store.path.iterdir())
        print(f"corpus: {docs} documents, {store.total_tokens / 1e6:.1f}M tokens; store {size / 2**20:.1f} MiB "
              f"(index {(store.path / 'data.idx').stat().st_size / 2**10:.0f} KiB), prepared once in {prep_s:.1f} s")
        res = measure(["memory", "store"], cfg, str(tok_file), str(store.path), log=print)
    print(f"\n{'path':8s} {'world':>5s} {'peak RSS MiB':>13s} {'x world1':>9s} {'read MiB':>10s} {'x world1':>9s}")
    for kind, rows in res.items():
        for world, r in rows.items():
            print(f"{kind:8s} {world:5d} {r['peak_bytes'] / 2**20:13.1f} {r['peak_bytes'] / rows[1]['peak_bytes']:9.2f} "
                  f"{r['bytes_read'] / 2**20:10.1f} {r['bytes_read'] / rows[1]['bytes_read']:9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"tokens": store.total_tokens, "prepare_s": prep_s, "results": res},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
