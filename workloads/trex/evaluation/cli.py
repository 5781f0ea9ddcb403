"""`trex eval`: evaluate a model on OR benchmarks; `trex eval report DIR [--against DIR2]`.

Examples::

    trex eval --benchmark nl4opt=NL4OPT.jsonl --benchmark bench4opt=bench4opt.tar.gz \\
        --model openai:http://127.0.0.1:8000/v1#qwen --protocol strict --k 1 --out eval-out
    trex eval --config eval.yaml --limit 20
    trex eval --config evaljob.yaml --set model.sampling.temperature=0.7 --print-config
    trex eval --benchmark nl4opt=NL4OPT.jsonl --model reference --out ref-check
    trex eval report eval-out --against eval-baseline

Exit codes: 0 finished, 1 finished with missing samples (failed requests; rerun resumes), 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

from pydantic import ValidationError

from trex.config_base import ConfigError, config_data, dump_config, format_validation_error, resolve_config
from trex.evaluation.config import BENCHMARK_NAMES, EvalConfig
from trex.reasoning import REASONING_MODES

PROTOCOLS = ("strict", "orlm", "mamo", "optibench", "sirl")


class UsageError(Exception):
    """Bad input: printed as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one clear line, exit 2 (argparse would print usage too)
        raise UsageError(message)


def _run_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="trex eval", description="Evaluate a model on OR benchmarks (zero-shot, sandboxed execution).")
    p.add_argument("--config", help="EvalConfig YAML (the whole file, its `evaluation` section, or an EvalJob "
                   "manifest's spec.evaluation)")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", dest="overrides",
                   help="override one field, camelCase path (repeatable), e.g. --set model.concurrency=4")
    p.add_argument("--print-config", action="store_true", help="print the resolved config (YAML) and exit")
    p.add_argument("--benchmark", action="append", default=[], metavar="NAME=PATH",
                   help=f"benchmark to run (repeatable); NAME in {', '.join(BENCHMARK_NAMES)}")
    p.add_argument("--model", help="openai:URL#MODEL | transformers:DIR | trex-checkpoint:DIR | reference")
    p.add_argument("--protocol", choices=PROTOCOLS, help="scoring protocol (default strict)")
    p.add_argument("--k", action="append", type=int, help="pass@k to report (repeatable; samples per item = max k)")
    p.add_argument("--out", help="output directory (a rerun resumes it)")
    p.add_argument("--limit", type=int, help="evaluate only the first N items of each benchmark")
    p.add_argument("--temperature", type=float, help="sampling temperature")
    p.add_argument("--max-tokens", type=int, help="completion token limit")
    p.add_argument("--concurrency", type=int, help="model requests in flight")
    p.add_argument("--workers", type=int, help="programs executed at once")
    p.add_argument("--timeout-s", type=float, help="per-program execution time limit (s)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--reasoning-mode", choices=REASONING_MODES, help="DeepSeek-V4 reasoning mode (trex.reasoning)")
    p.add_argument("--think-max-prompt-file", metavar="FILE", help="think-max: file holding its system prompt")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def build_config(args: argparse.Namespace) -> EvalConfig:
    """EvalConfig from --config, the flags, then the --set overrides (each overrides what came before)."""
    from trex.evaluation.models import parse_model_arg

    data = config_data(args.config, "EvalJob", "evaluation")
    if args.benchmark:
        benches = []
        for spec in args.benchmark:
            name, sep, path = spec.partition("=")
            if not sep or not name or not path:
                raise UsageError(f"--benchmark {spec!r}: expected NAME=PATH")
            if name not in BENCHMARK_NAMES:
                raise UsageError(f"--benchmark {spec!r}: unknown benchmark {name!r}; known: {', '.join(BENCHMARK_NAMES)}")
            benches.append({"name": name, "path": path})
        data["benchmarks"] = benches
    if args.limit is not None:
        if args.limit <= 0:
            raise UsageError(f"--limit must be > 0, got {args.limit}")
        for b in data.get("benchmarks", []):
            if isinstance(b, dict):
                b["limit"] = args.limit
    if args.model:
        try:
            m = parse_model_arg(args.model)
        except ValueError as e:
            raise UsageError(str(e)) from None
        prev = data.get("model", {})
        data["model"] = {**{k: v for k, v in prev.items() if k in ("sampling", "concurrency", "retries", "apiKeyEnv")},
                         **m.model_dump(mode="json", by_alias=True, exclude_unset=True)}
    model = data.setdefault("model", {})
    sampling = model.setdefault("sampling", {})
    if args.temperature is not None:
        sampling["temperature"] = args.temperature
    if args.max_tokens is not None:
        sampling["maxTokens"] = args.max_tokens
    if args.concurrency is not None:
        model["concurrency"] = args.concurrency
    if args.workers is not None:
        data.setdefault("execution", {})["workers"] = args.workers
    if args.timeout_s is not None:
        data.setdefault("timeouts", {})["executionS"] = args.timeout_s
    if args.protocol:
        data["protocol"] = args.protocol
    if args.k:
        data["k"] = args.k
    if args.out:
        data["output"] = args.out
    if args.metrics_port is not None:
        data["metricsPort"] = args.metrics_port
    if args.reasoning_mode:
        data["reasoningMode"] = args.reasoning_mode
    if args.think_max_prompt_file:
        if not os.path.isfile(args.think_max_prompt_file):
            raise UsageError(f"--think-max-prompt-file: file {args.think_max_prompt_file!r} does not exist")
        with open(args.think_max_prompt_file, encoding="utf-8") as fh:
            data["thinkMaxPrompt"] = fh.read()
    if not data.get("benchmarks") and not any(o.startswith("benchmarks") for o in args.overrides):
        raise UsageError("no benchmarks: pass --benchmark NAME=PATH or --config with benchmarks")
    if not args.model and not args.config:
        raise UsageError("no model: pass --model (openai:URL#MODEL, transformers:DIR, trex-checkpoint:DIR, reference)")
    return resolve_config(EvalConfig, data, args.overrides)


def _serve_metrics(cfg: EvalConfig) -> Any:
    from trex.telemetry.exporter import Exporter

    exporter = Exporter()
    port = cfg.metrics_port
    if port is None and os.environ.get("TREX_METRICS_PORT"):
        port = int(os.environ["TREX_METRICS_PORT"])
    if port is not None:
        exporter.serve(port)
    return exporter


def cmd_run(argv: list[str]) -> int:
    """`trex eval ...`."""
    from trex.evaluation.models import build_model
    from trex.evaluation.report import write_reports
    from trex.evaluation.runner import run_eval, termination_summary
    from trex.telemetry.progress import Progress
    from trex.telemetry.summary import write_termination_summary

    args = _run_parser().parse_args(argv)
    cfg = build_config(args)
    if args.print_config:
        print(dump_config(cfg), end="")
        return 0
    try:
        model = build_model(cfg.model, request_timeout_s=cfg.timeouts.request_s, reasoning_mode=cfg.reasoning_mode)
    except (ValueError, OSError) as e:
        raise UsageError(f"model: {e}") from None
    exporter = _serve_metrics(cfg)
    progress: dict[str, Progress] = {}

    def on_progress(done: int, total: int) -> None:
        if args.quiet:
            return
        if "p" not in progress:  # first call: before any request, with the samples a rerun resumes
            progress["p"] = Progress("eval", total).__enter__()
            progress["p"].done = done
        progress["p"].update(done - progress["p"].done)

    try:
        outcome = asyncio.run(run_eval(cfg, model, exporter=exporter, on_progress=on_progress))
    finally:
        if "p" in progress:
            progress["p"].__exit__(None, None, None)
    write_reports(outcome.out_dir, outcome.summary)
    write_termination_summary(termination_summary(outcome.summary))
    exporter.wait_for_scrape()  # the final Pass@1 gauges reach Prometheus before the pod exits
    for name, s in outcome.summary["benchmarks"].items():
        extra = f" structural={100 * s['structural_accuracy']:.1f}%" if s.get("structural_accuracy") is not None else ""
        p1 = s.get("pass@1")
        print(f"{name}: pass@1={'-' if p1 is None else f'{100 * p1:.1f}%'} items={s['items']} "
              f"samples={s['samples']}{extra}")
    print(f"report: {outcome.out_dir / 'report.md'} ({outcome.new_samples} new, {outcome.skipped} resumed, "
          f"{outcome.failed_requests} failed requests, {outcome.wall_s:.1f} s)")
    return 1 if outcome.failed_requests else 0


def cmd_report(argv: list[str]) -> int:
    """`trex eval report DIR [--against DIR2]`."""
    from trex.evaluation.report import load_summary, write_reports

    p = _Parser(prog="trex eval report", description="Rebuild the reports of a run (optionally against another).")
    p.add_argument("dir", help="run output directory")
    p.add_argument("--against", help="an earlier run's output directory to compare with")
    args = p.parse_args(argv)
    try:
        summary = load_summary(args.dir)
        against = load_summary(args.against) if args.against else None
    except ValueError as e:
        raise UsageError(str(e)) from None
    paths = write_reports(args.dir, summary, against)
    print("\n".join(str(x) for x in paths))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `trex eval`."""
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args and args[0] == "report":
            return cmd_report(args[1:])
        return cmd_run(args)
    except (UsageError, ConfigError) as e:
        print(f"trex eval: error: {e}", file=sys.stderr)
        return 2
    except ValidationError as e:
        print("trex eval: error: " + "; ".join(format_validation_error(e, model=EvalConfig)), file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"trex eval: error: {e}", file=sys.stderr)
        return 2
