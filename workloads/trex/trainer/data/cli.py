"""`trex data prepare --config cfg.yaml [--set a.b=v] [--out DIR]`: tokenise a training corpus once.

Trains the tokenizer when data.tokenizer.path is unset and writes the token store (:mod:`trex.trainer.data.store`)
where `trex train` with the same config and --out looks for it (data.storeDir, else the run's tokenizer cache
next to the checkpoint directory), so no training rank tokenises anything. Skips what is already there.
Exit codes: 0 done, 1 bad data, 2 bad config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trex data", description="Prepare training data once for every rank.")
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="train the tokenizer (when needed) and write the token store")
    prep.add_argument("--config", required=True, help="TrainerConfig YAML (whole file, its `trainer:` section, "
                      "or a TrainJob manifest)")
    prep.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", dest="overrides",
                      help="override one field, camelCase path (repeatable)")
    prep.add_argument("--out", default=".", help="the --out `trex train` gets (locates the tokenizer cache)")
    return p


def main(argv: list[str]) -> int:
    """Run `trex data prepare`."""
    args = _parser().parse_args(argv)
    from trex.trainer.cli import load_config

    try:
        cfg = load_config(args.config, None, args.overrides)
    except Exception as e:
        print(f"trex data prepare: invalid config: {e}", file=sys.stderr)
        return 2
    if cfg.mode in ("grpo", "opd"):
        print(f"trex data prepare: invalid config: mode: {cfg.mode} reads prompts (data.train), not a token store",
              file=sys.stderr)
        return 2
    from trex.trainer.config import resolved_model_values
    from trex.trainer.data.build import prepare
    from trex.trainer.data.sources import DataError

    ckpt = Path(cfg.checkpoint.dir)
    cache_dir = (ckpt if ckpt.is_absolute() else Path(args.out) / ckpt).parent / "tokenizer"  # as the Trainer does
    try:
        _, store, fmt = prepare(cfg.data, cache_dir, int(str(resolved_model_values(cfg.model)["vocab_size"])))
    except (DataError, ValueError) as e:
        print(f"trex data prepare: {e}", file=sys.stderr)
        return 1
    print(f"token store {store.path}: {len(store)} {fmt} documents, {store.total_tokens} tokens "
          f"({store.dtype.name})")
    return 0
