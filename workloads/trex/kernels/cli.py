"""`trex kernels tune ...` and `trex kernels report DIR`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trex kernels", description="AuraKernel: tune kernels and report.")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tune", help="tune the suite (or some kernels) on a backend")
    t.add_argument("--config", help="YAML file with a KernelTuneConfig (top-level, under `kernels:`, or a "
                   "KernelTuneJob manifest's spec.kernels)")
    t.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", dest="overrides",
                   help="override one field, camelCase path (repeatable), e.g. --set budget.trials=50")
    t.add_argument("--print-config", action="store_true", help="print the resolved config (YAML) and exit")
    t.add_argument("--suite", choices=["default", "none"])
    t.add_argument("--backend", choices=["cpu-c", "cuda-triton", "npu-ascendc"])
    t.add_argument("--kernels", help="comma-separated kernel names")
    t.add_argument("--dtypes", help="comma-separated: fp32,bf16")
    t.add_argument("--budget-trials", type=int)
    t.add_argument("--budget-seconds", type=float)
    t.add_argument("--samples", type=int)
    t.add_argument("--threads", type=int, help="threads for kernels and baselines (1 = single-thread run)")
    t.add_argument("--skills", help="skill library (JSONL)")
    t.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    t.add_argument("--out", help="output directory")
    t.add_argument("--shapes-from", metavar="FILE", help="tune the shape classes the run in FILE calls (a TrainJob "
                   "manifest or a trainer YAML: its model, micro-batch, sequence lengths and tp/ep/etp layout)")
    r = sub.add_parser("report", help="regenerate report.md from an output directory")
    r.add_argument("dir")
    return p


def build_config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Config from --config overlaid with the command-line flags, then --set (ConfigError with one line)."""
    from trex.config_base import config_data, resolve_config
    from trex.kernels.config import KernelTuneConfig

    data = config_data(args.config, "KernelTuneJob", "kernels")
    over = {"suite": args.suite, "backend": args.backend, "output": args.out, "threads": args.threads,
            "skillsPath": args.skills}
    data.update({k: v for k, v in over.items() if v is not None})
    if args.kernels:
        data["kernels"] = [k.strip() for k in args.kernels.split(",") if k.strip()]
    if args.dtypes:
        data["dtypes"] = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if args.no_compile:
        data["compareCompile"] = False
    budget = dict(data.get("budget") or {})
    for k, v in (("trials", args.budget_trials), ("seconds", args.budget_seconds), ("samples", args.samples)):
        if v is not None:
            budget[k] = v
    data["budget"] = budget
    return resolve_config(KernelTuneConfig, data, args.overrides)


ShapesReader = Callable[[Any, str], Any]
"""(config, FILE) -> the config with the shapes of the run FILE describes (the trex command table passes the
trainer's derivation, which this workload does not import)."""


def main(argv: Sequence[str] | None = None, shapes_reader: ShapesReader | None = None) -> int:
    """Entry point; returns the exit code."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    if args.cmd == "report":
        from trex.kernels.report import write_report

        try:
            print(write_report(args.dir))
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    from trex.config_base import ConfigError, dump_config

    try:
        cfg = build_config(args)
        if args.shapes_from:
            if shapes_reader is None:
                raise ConfigError("--shapes-from: run it as `trex kernels tune` (the trex command reads the run)")
            cfg = shapes_reader(cfg.model_copy(update={"shapes": []}), args.shapes_from)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_config(cfg), end="")
        return 0
    if cfg.shapes_from is not None:
        print(f"error: shapesFrom: names TrainJob {cfg.shapes_from.train_job}; pass its manifest with "
              "--shapes-from FILE (the operator resolves it in a KernelTuneJob)", file=sys.stderr)
        return 2
    from trex.kernels.backends.base import BackendUnavailable
    from trex.kernels.tune import run

    try:
        summary = run(cfg)
    except BackendUnavailable as e:
        print(f"error: backend unavailable: {e}", file=sys.stderr)
        return 3
    import json

    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
