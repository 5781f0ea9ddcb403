"""`trex train --config cfg.yaml [--set a.b=v] [--max-steps N] [--out DIR] [--print-config]`: run the trainer
on the local device.

The YAML is a whole TrainerConfig, a file with a `trainer:` section, or a TrainJob manifest (its
spec.trainer); without --config, TREX_CONFIG from the pod env contract names it. `--set optim.lr=3e-4`
overrides one field (camelCase path, YAML value); `--print-config` prints the resolved config and exits. Exit codes: 0 done, 1 failure,
2 bad config (one line naming the field), 143 stopped by SIGTERM after a final checkpoint.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trex.trainer.loop import Trainer, TrainResult

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG, EXIT_TERMINATED = 0, 1, 2, 143


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trex train", description="Train a model from a TrainerConfig YAML.")
    p.add_argument("--config", help="TrainerConfig YAML (whole file, its `trainer:` section, or a TrainJob "
                   "manifest's spec.trainer); default TREX_CONFIG")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", dest="overrides",
                   help="override one field, camelCase path (repeatable), e.g. --set optim.lr=3e-4")
    p.add_argument("--print-config", action="store_true", help="print the resolved config (YAML) and exit")
    p.add_argument("--max-steps", type=int, default=None, help="override maxSteps")
    p.add_argument("--out", default=".", help="output directory (relative checkpoint dir, tokenizer cache)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port (default: logging.metricsPort or TREX_METRICS_PORT)")
    return p


def load_config(path: str, max_steps: int | None, overrides: list[str] | None = None) -> Any:
    """TrainerConfig from ``path`` and the overrides; raises ValueError with one line naming the field."""
    from trex.config_base import load_config as load
    from trex.trainer.config import TrainerConfig

    if max_steps is not None and max_steps <= 0:
        raise ValueError(f"--max-steps: must be positive, got {max_steps}")
    base = {"maxSteps": max_steps} if max_steps is not None else None
    return load(TrainerConfig, path, kind="TrainJob", section="trainer", overrides=overrides or [], base=base)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `trex train`."""
    args = _parser().parse_args(argv)
    from trex.runtime.env import read_env

    try:
        env = read_env()
    except ValueError as e:
        print(f"trex train: {e}", file=sys.stderr)
        return EXIT_CONFIG
    path = args.config or env.config_path
    if not path:
        print("trex train: --config is required (or set TREX_CONFIG)", file=sys.stderr)
        return EXIT_CONFIG
    try:
        cfg = load_config(path, args.max_steps, args.overrides)
    except ValueError as e:
        print(f"trex train: invalid config: {e}", file=sys.stderr)
        return EXIT_CONFIG
    from trex.trainer.rules import job_problems

    # The rule `trex validate` and the operator apply, with this machine's files (the Trainer does not run it again).
    problems = job_problems(cfg, env.world_size, local=not args.print_config)
    if problems:
        print(f"trex train: invalid config: {problems[0][0]}: {problems[0][1]}", file=sys.stderr)
        return EXIT_CONFIG
    if args.print_config:
        from trex.config_base import dump_config

        print(dump_config(cfg), end="")
        return EXIT_OK

    from trex.telemetry.progress import Progress
    from trex.telemetry.summary import write_termination_summary
    from trex.trainer.loop import Trainer, install_sigterm
    from trex.trainer.rules import ConfigProblem

    start = time.time()
    port = args.metrics_port
    if port is None:
        port = cfg.logging.metrics_port or env.metrics_port or None
    summary: dict[str, Any] = {"kind": "TrainJob", "job": env.job_name, "attempt": env.attempt, "rank": env.rank}
    group = None
    try:
        if env.world_size > 1:
            group = _join_job(env, cfg.device, cfg.deterministic)
        trainer = Trainer(cfg, args.out, group=group, job_name=env.job_name, metrics_port=port, checked=True)
    except ConfigProblem as e:
        print(f"trex train: invalid config: {e}", file=sys.stderr)
        _leave(group)
        return EXIT_CONFIG
    except Exception as e:
        traceback.print_exc()
        summary.update(result="Failed", error=f"{type(e).__name__}: {e}")
        write_termination_summary(summary)
        _leave(group)
        return EXIT_FAILURE
    install_sigterm(trainer)
    for line in trainer.objective.notes() if trainer.rank == 0 else []:
        trainer.log(line)
    try:
        with Progress("train", cfg.max_steps, every_s=0.0) as progress:
            progress.done = (trainer.ckpt.latest_step() or 0) if cfg.checkpoint.resume else 0
            result = trainer.run(cfg.max_steps, progress=progress if trainer.rank == 0 else None)
    except Exception as e:
        traceback.print_exc()
        summary.update(result="Failed", error=f"{type(e).__name__}: {e}", step=trainer.step,
                       lastCheckpointStep=trainer.last_checkpoint)
        write_termination_summary(summary)
        _leave(group)
        return EXIT_FAILURE
    summary.update(_result(trainer, result, time.time() - start))
    if not result.interrupted and cfg.checkpoint.export_hf:
        with trainer.phases.measure("export"):
            exported = _export(trainer)
        if trainer.rank == 0:
            summary["hfExport"] = exported
    summary["phases"] = trainer.phases.summary(group)  # the maximum over ranks: a collective
    _leave(group, done=True)
    write_termination_summary(summary)
    print(_last_line(trainer, result, summary), file=sys.stderr)
    return EXIT_TERMINATED if result.interrupted else EXIT_OK


def _result(trainer: Trainer, result: TrainResult, seconds: float) -> dict[str, Any]:
    """The termination summary's entries of a finished (or interrupted) run: the loop's, the kernels', the MFU
    denominator's, the swap optimizer's and the objective's own."""
    cfg = trainer.cfg
    out: dict[str, Any] = {
        "result": "Interrupted" if result.interrupted else "Succeeded", "step": result.final_step,
        "maxSteps": cfg.max_steps, "loss": finite_or_none(result.loss), "mfu": finite_or_none(result.mfu),
        "lastCheckpointStep": result.last_checkpoint, "skippedSteps": result.skipped_steps, "spikes": result.spikes,
        "tokens": trainer.tokens_seen, "seconds": round(seconds, 3)}
    if cfg.kernels.registry:
        out["kernels"] = trainer.kernels.summary()
        if trainer.rank == 0:
            trainer.log(trainer.kernels.coverage_line())
        baseline = None if result.interrupted else trainer.kernel_baseline()
        if baseline is not None:
            out["kernels"]["baseline"] = baseline
            if trainer.rank == 0:
                trainer.log(f"kernels: {baseline['tunedTokensPerSecond']} tokens/s tuned vs "
                            f"{baseline['untunedTokensPerSecond']} untuned (x{baseline['speedup']}) on one "
                            f"micro-batch's forward and backward, timed side by side in this process")
        if trainer.telemetry is not None:  # the called classes are known now
            trainer.kernels.export(trainer.telemetry.exporter, trainer.job)
    if trainer.telemetry is not None:
        out.update(peakFlops=trainer.telemetry.peak_flops, peakSource=trainer.telemetry.peak_source,
                   flopsConvention=trainer.telemetry.convention)
    swapped = [r.swap for r in result.history if r.swap is not None]
    if swapped:
        from trex.trainer.optim.swap import summary as swap_summary

        out["swap"] = swap_summary(swapped)
    out.update(trainer.objective.summary())
    return out


def _last_line(trainer: Trainer, result: TrainResult, summary: dict[str, Any]) -> str:
    """How the run ended, in one line: step, loss, MFU, last checkpoint, swap overlap and the objective's own."""
    loss_s = f"{result.loss:.4f}" if result.loss is not None else "n/a"
    mfu_s = f"{100 * result.mfu:.2f}%" if result.mfu is not None else "n/a"
    return (f"trex train: {str(summary['result']).lower()} at step {result.final_step}/{trainer.cfg.max_steps}, "
            f"loss {loss_s}, MFU {mfu_s}, last checkpoint {result.last_checkpoint}"
            + (f", swap overlap {summary['swap']['overlapRatio']:.2f}" if "swap" in summary else "")
            + trainer.objective.summary_line())


def finite_or_none(x: float | None) -> float | None:
    """None for missing or non-finite values (JSON-friendly summaries)."""
    return x if x is not None and math.isfinite(x) else None


def _export(trainer: Any) -> str | None:
    """Hugging Face export next to the checkpoints (None, with a log line, when the shape has none); called on
    every rank, each writing the tensors it owns."""
    from trex.trainer.export import export_problem, export_trainer

    problem = export_problem(trainer.model)
    if problem is not None:
        if trainer.rank == 0:
            print(f"trex train: no Hugging Face export: {problem}", file=sys.stderr)
        return None
    path = export_trainer(trainer, trainer.ckpt_dir / "hf")  # every rank writes the tensors it owns
    if trainer.rank != 0:
        return None
    print(f"trex train: Hugging Face export written to {path}", file=sys.stderr)
    return str(path)


def _join_job(env: Any, device: str, deterministic: bool = False) -> Any:
    """Join the job's process group from the pod env contract (MASTER_ADDR/PORT, WORLD_SIZE, RANK)."""
    import os

    from trex.runtime.device import init_distributed, local_rank, select_device

    lr = local_rank(env.rank, env.nproc_per_node)
    os.environ.setdefault("LOCAL_RANK", str(lr))
    kind = select_device(device, local_rank=lr).kind
    return init_distributed(kind, env.rank, env.world_size, env.master_addr, env.master_port,
                            deterministic=deterministic)


def _leave(group: Any, done: bool = False) -> None:
    """Leave the process group; after a finished run (``done``) only once every rank is done with it (a rank tearing
    gloo down while a peer still talks to it can abort). A failing rank leaves at once: its peers fail fast."""
    if group is not None:
        import torch.distributed as dist

        if done:
            dist.barrier()
        dist.destroy_process_group()
