"""`trex kernels tune ...` and `trex kernels report DIR`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trex kernels", description="AuraKernel: tune kernels and report.")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tune", help="tune the suite (or some kernels) on a backend")
    t.add_argument("--config", help="YAML file with a KernelTuneConfig (top-level or under `kernels:`)")
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
    r = sub.add_parser("report", help="regenerate report.md from an output directory")
    r.add_argument("dir")
    return p


def build_config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Config from --config overlaid with the command-line flags (validated by the model)."""
    from trex.config_base import load_section, load_yaml_config
    from trex.kernels.config import KernelTuneConfig

    base = load_yaml_config(KernelTuneConfig, args.config, section="kernels") if args.config else KernelTuneConfig()
    data = base.model_dump(by_alias=True, exclude_none=True)
    over = {"suite": args.suite, "backend": args.backend, "output": args.out, "threads": args.threads,
            "skillsPath": args.skills}
    data.update({k: v for k, v in over.items() if v is not None})
    if args.kernels:
        data["kernels"] = [k.strip() for k in args.kernels.split(",") if k.strip()]
    if args.dtypes:
        data["dtypes"] = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if args.no_compile:
        data["compareCompile"] = False
    budget = dict(data.get("budget", {}))
    for k, v in (("trials", args.budget_trials), ("seconds", args.budget_seconds), ("samples", args.samples)):
        if v is not None:
            budget[k] = v
    data["budget"] = budget
    return load_section(KernelTuneConfig, data)


def main(argv: Sequence[str] | None = None) -> int:
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
    from pydantic import ValidationError

    from trex.config_base import format_validation_error

    try:
        cfg = build_config(args)
    except ValidationError as e:
        for line in format_validation_error(e, "kernels"):
            print(f"error: {line}", file=sys.stderr)
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
