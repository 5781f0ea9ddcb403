"""Held-out split: merge keeps a stable share of samples out of the training files, in the eval format."""

from __future__ import annotations

import json
from pathlib import Path

from trex.evaluation.benchmarks import load_benchmark
from trex.ordata.config import ORDataConfig
from trex.ordata.pipeline import in_heldout, merge, run_shard
from trex.trainer.data.sources import jsonl_files, load_records


def test_heldout_split_is_stable_disjoint_and_loadable(tmp_path: Path) -> None:
    cfg = ORDataConfig.model_validate(
        {"count": 12, "seed": 5, "output": str(tmp_path), "heldoutFraction": 0.35, "outputs": ["sft"],
         "families": [{"name": "knapsack", "size": {"min": 3, "max": 4}},
                      {"name": "assignment", "size": {"min": 3, "max": 3}}],
         "shards": {"numShards": 2}},
        by_alias=True)
    for i in range(2):
        run_shard(cfg, i, 2, tmp_path, show_progress=False)
    manifest = merge(tmp_path)
    held_path = tmp_path / "heldout" / "heldout.jsonl"
    held = [json.loads(line) for line in held_path.read_text().splitlines()]
    train_ids = {json.loads(line)["id"] for f in (tmp_path / "merged").glob("sft-*.jsonl")
                 for line in f.read_text().splitlines()}
    held_ids = {r["id"] for r in held}
    every = train_ids | held_ids
    # Membership is a pure function of the id (independent of order or shard).
    assert held_ids == {i for i in every if in_heldout(i, 0.35)}
    assert held_ids and train_ids and not held_ids & train_ids
    assert manifest["heldout"] == len(held) and manifest["samples"] == len(train_ids)
    # The harness loads the file as its `ordata` benchmark with the solver-verified objective as answer.
    ds = load_benchmark("ordata", held_path)
    assert [it.id for it in ds.items] == [r["id"] for r in held]
    assert {it.category for it in ds.items} <= {"knapsack", "assignment"}
    # A trainer glob over merged/ reads only training records, never the held-out file.
    files = jsonl_files(str(tmp_path / "merged" / "sft-*.jsonl"))
    assert files and all(f.name.startswith("sft-") for f in files)
    fmt, records = load_records(str(tmp_path / "merged" / "sft-*.jsonl"))
    assert fmt == "chat" and {r["id"] for r in records} == train_ids
