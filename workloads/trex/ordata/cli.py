"""`trex ordata generate | merge | show`: run shards of the OR data pipeline, merge them, inspect samples."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from trex.config_base import config_data, dump_config, resolve_config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trex ordata", description="Solver-verified OR data pipeline.")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="Generate one shard (or all shards in turn).")
    g.add_argument("--config", help="YAML file: an ORDataConfig, optionally under a top-level 'ordata' key, or "
                   "an ORDataJob manifest (its spec.ordata).")
    g.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", dest="overrides",
                   help="Override one field, camelCase path (repeatable), e.g. --set shards.numShards=4.")
    g.add_argument("--print-config", action="store_true", help="Print the resolved config (YAML) and exit.")
    g.add_argument("--count", type=int, help="Instances in total over all shards.")
    g.add_argument("--seed", type=int, help="Master seed.")
    g.add_argument("--families", help="Comma-separated family names (keeps their configured sizes/weights).")
    g.add_argument("--shard-index", type=int, help="This shard (default: JOB_COMPLETION_INDEX, else all shards).")
    g.add_argument("--num-shards", type=int, help="Number of shards.")
    g.add_argument("--out", help="Output directory.")
    g.add_argument("--metrics-port", type=int, help="Serve Prometheus metrics (default: TREX_METRICS_PORT if set).")
    m = sub.add_parser("merge", help="Dedup across finished shards and write merged/ and the summary.")
    m.add_argument("dir")
    m.add_argument("--json", action="store_true", help="Print the summary as one JSON line instead of a table.")
    s = sub.add_parser("show", help="Pretty-print one sample: SAMPLE_ID (searched under --dir) or FILE:LINE.")
    s.add_argument("ref")
    s.add_argument("--dir", default=".", help="Folder searched for a sample id (default: current folder).")
    return p


def _load_config(args: argparse.Namespace) -> Any:
    """Config from YAML, the flags, then the --set overrides, validated as a whole (raises ConfigError)."""
    from trex.ordata.config import FAMILY_NAMES, ORDataConfig

    data = config_data(args.config, "ORDataJob", "ordata")
    if args.count is not None:
        data["count"] = args.count
    if args.seed is not None:
        data["seed"] = args.seed
    if args.out is not None:
        data["output"] = args.out
    if args.num_shards is not None:
        data["shards"] = {**data.get("shards", {}), "numShards": args.num_shards}
    if args.families:
        wanted = [f.strip() for f in args.families.split(",") if f.strip()]
        bad = [f for f in wanted if f not in FAMILY_NAMES]
        if bad:
            raise ValueError(f"families: unknown family {bad[0]!r} (allowed: {', '.join(FAMILY_NAMES)})")
        given = {f["name"]: f for f in data.get("families", []) if isinstance(f, dict) and "name" in f}
        data["families"] = [given.get(f, {"name": f}) for f in wanted]
    return resolve_config(ORDataConfig, data, args.overrides)


def _generate(args: argparse.Namespace) -> int:
    from trex.ordata.pipeline import run_shard

    try:
        cfg = _load_config(args)
    except ValueError as err:
        print(f"trex ordata: invalid config: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_config(cfg), end="")
        return 0
    num = cfg.shards.num_shards
    idx = args.shard_index
    if idx is None and os.environ.get("JOB_COMPLETION_INDEX", "").strip():
        idx = int(os.environ["JOB_COMPLETION_INDEX"])
    if idx is not None and not 0 <= idx < num:
        print(f"trex ordata: invalid config: shard-index {idx} is outside [0, {num})", file=sys.stderr)
        return 2
    exporter = _exporter(args.metrics_port)
    if exporter is not None:
        # Every family's accepted counter starts at 0 and Prometheus sees it before any work: a shard that finishes
        # within one scrape interval still leaves two samples per series (0, then its final count) for rate().
        for fam in cfg.families:
            exporter.metric("trex_ordata_samples_total", family=fam.name, outcome="accepted")
        exporter.wait_for_scrape()
    from trex.telemetry.summary import write_termination_summary

    summary: dict[str, Any] = {"kind": "ORDataJob", "shards": []}
    for i in [idx] if idx is not None else range(num):
        rep = run_shard(cfg, i, num, cfg.output, exporter=exporter)
        c = rep.manifest["counts"]
        if rep.skipped:
            state = "skipped (already complete)"
        else:
            state = f"done (resumed at instance {rep.resumed_from})" if rep.resumed_from else "done"
        print(f"shard {i}/{num}: {state}; accepted {c['accepted']} of {c['planned']}, rejected "
              f"{sum(c['rejected'].values())} {json.dumps(c['rejected'], sort_keys=True)} -> {rep.folder}")
        summary["shards"].append({"index": i, "accepted": c["accepted"], "planned": c["planned"],
                                  "skipped": rep.skipped})
    write_termination_summary(summary)
    if exporter is not None:
        exporter.wait_for_scrape()  # the shard's final outcome counters reach Prometheus before the pod exits
    return 0


def _exporter(port: int | None) -> Any:
    if port is None and not os.environ.get("TREX_METRICS_PORT"):
        return None
    from trex.telemetry.exporter import Exporter

    exp = Exporter()
    exp.serve(port)
    return exp


def _merge(args: argparse.Namespace) -> int:
    from trex.ordata.pipeline import merge
    from trex.telemetry.summary import write_termination_summary

    try:
        manifest = merge(args.dir)
    except (ValueError, OSError) as err:
        print(f"trex ordata merge: {err}", file=sys.stderr)
        return 1
    c = manifest["counts"]
    summary = {"kind": "ORDataJob", "samples": manifest["samples"], "accepted": c["accepted"],
               "planned": c["planned"], "generated": c["generated"], "solved": c["solved"],
               "verified": c["verified"], "duplicates": c["duplicates"],
               "crossShardDuplicates": manifest["cross_shard_duplicates"], "rejected": c["rejected"]}
    write_termination_summary(summary)
    print(json.dumps(summary, sort_keys=True) if args.json else merge_table(summary, args.dir))
    return 0


MERGE_ROWS = ("planned", "generated", "solved", "verified", "accepted", "duplicates", "samples")


def merge_table(summary: dict[str, Any], folder: str) -> str:
    """The merge outcome as an aligned table (camelCase names, the keys of the termination summary):
    the pipeline's counts, then duplicates across shards and rejections by reason."""
    rows = [(k, summary[k]) for k in MERGE_ROWS]
    cross = summary["crossShardDuplicates"]
    rows.append(("crossShardDuplicates", sum(cross.values())))
    rows += [(f"  {reason}", n) for reason, n in sorted(cross.items())]
    rows.append(("rejected", sum(summary["rejected"].values())))
    rows += [(f"  {reason}", n) for reason, n in sorted(summary["rejected"].items())]
    width = max(len(k) for k, _ in rows)
    num = max(len(str(v)) for _, v in rows)
    lines = [f"merged {folder}: {summary['samples']} samples in {Path(folder) / 'merged'}",
             f"{'COUNT'.ljust(width)}  {'N'.rjust(num)}"]
    lines += [f"{k.ljust(width)}  {str(v).rjust(num)}" for k, v in rows]
    return "\n".join(lines)


def _find(ref: str, folder: str) -> dict[str, Any] | None:
    head, _, tail = ref.rpartition(":")
    if head and tail.isdigit() and Path(head).is_file():
        lines = Path(head).read_text(encoding="utf-8").splitlines()
        n = int(tail)
        if not 1 <= n <= len(lines):
            raise ValueError(f"{head} has {len(lines)} lines; line {n} does not exist")
        rec: dict[str, Any] = json.loads(lines[n - 1])
        return rec
    for path in sorted(Path(folder).rglob("*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if f'"id": "{ref}"' in line:
                    found: dict[str, Any] = json.loads(line)
                    return found
    return None


def _show(args: argparse.Namespace) -> int:
    try:
        rec = _find(args.ref, args.dir)
    except (ValueError, OSError) as err:
        print(f"trex ordata show: {err}", file=sys.stderr)
        return 1
    if rec is None:
        print(f"trex ordata show: no sample {args.ref!r} under {args.dir}", file=sys.stderr)
        return 1
    print(f"id: {rec.get('id')}   schema: {rec.get('schema')}")
    prov = rec.get("provenance", {})
    print("provenance: " + ", ".join(f"{k}={prov[k]}" for k in sorted(prov) if k != "tolerances"))
    print()
    if "messages" in rec:
        for msg in rec["messages"]:
            print(f"--- {msg['role']} ---")
            print(msg["content"])
            print()
    else:
        print(rec.get("text", ""))
    return 0


def main(argv: list[str]) -> int:
    """Entry point of `trex ordata`."""
    args = _parser().parse_args(argv)
    if args.cmd == "generate":
        return _generate(args)
    if args.cmd == "merge":
        return _merge(args)
    return _show(args)
