"""`trex plan FILE`: the per-device memory plan of a TrainJob manifest or a trainer config, and whether it fits.

A TrainJob is planned on its replicas x devicesPerReplica ranks against its deviceModel (cpu: the pod's
memory limit / devicesPerReplica); a trainer YAML on --world ranks of --device (cpu: this host's memory /
world). Exit codes: 0 fits (or the capacity is unknown), 1 does not fit or the job is invalid, 2 bad input.
Job manifests are read by the operator's models (:mod:`trex_operator.plan_cli` passes its TrainJob reader
to :func:`main`), so the trainer never imports the operator.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from trex.trainer.mfu import DEVICES

if TYPE_CHECKING:
    from trex.trainer.plan import Quant

Loaded = tuple[Any, int, Any, int | None, int | None, bool | None]
"""(trainer config, world, device, capacity in bytes or None, host bytes per rank or None, starts from a Hugging
Face folder: None when the trainer config says) of the file to plan."""
ManifestReader = Callable[[dict[str, Any], argparse.Namespace], Loaded]
"""Reads one kind of job manifest with the parsed arguments; ValueError with one line on bad input."""


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="trex plan", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("file", help="TrainJob manifest or TrainerConfig YAML (whole file or its `trainer:` section)")
    ap.add_argument("--world", type=int, default=None,
                    help="ranks (default: replicas x devicesPerReplica of a TrainJob, else 1)")
    ap.add_argument("--device", choices=sorted(DEVICES), default=None,
                    help="device model (default: the TrainJob's deviceModel / deviceType, else cpu)")
    ap.add_argument("--source-quant", choices=["none", "fp8", "fp8-fp4"], default=None,
                    help="how the initFromHf / modelFrom folder is stored (default: read from its config.json when "
                         "the folder is here, else planned unquantised, an upper bound)")
    return ap


def _load(args: argparse.Namespace,
          manifests: Mapping[str, ManifestReader]) -> tuple[Loaded, list[str]]:
    """(the file's Loaded, problems); ValueError with one line on bad input."""
    import yaml
    from pydantic import ValidationError

    from trex.config_base import format_validation_error, load_section
    from trex.trainer.config import TrainerConfig
    from trex.trainer.rules import job_problems

    try:
        with open(args.file, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except OSError as e:
        raise ValueError(f"{args.file}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{args.file}: not valid YAML ({str(e).splitlines()[0]})") from None
    kind = doc.get("kind") if isinstance(doc, dict) else None
    reader = manifests.get(kind) if isinstance(kind, str) else None
    if reader is not None:
        cfg, world, device, capacity, host, load = reader(doc, args)
    else:
        try:
            section = doc.get("trainer", doc) if isinstance(doc, dict) else doc
            cfg = load_section(TrainerConfig, section or {})
        except ValidationError as e:
            raise ValueError(format_validation_error(e, model=TrainerConfig)[0]) from None
        world = args.world or 1
        device = DEVICES[args.device or "cpu"]
        capacity = device.memory_bytes if device.memory_bytes is not None else _host_memory() // world
        host, load = None, None
    if world <= 0:
        raise ValueError(f"--world must be positive, got {world}")
    problems = [f"{p}: {m}" for p, m in job_problems(cfg, world, device, capacity, host_capacity=host, load=load)]
    return (cfg, world, device, capacity, host, load), problems


def source_quant(cfg: Any) -> Quant | None:
    """How checkpoint.initFromHf's folder is stored when it is here (its config.json's quantization_config, as the
    export and DeepSeek's releases write it), else None."""
    import json
    from pathlib import Path

    folder = cfg.checkpoint.init_from_hf
    try:
        conf = json.loads((Path(folder) / "config.json").read_text()) if folder else None
    except (OSError, ValueError):
        return None
    if not isinstance(conf, dict):
        return None
    q = conf.get("quantization_config")
    if not isinstance(q, dict):
        return "none"
    return "fp8-fp4" if q.get("expert_dtype") == "fp4" else "fp8"


def lifecycle_rows(life: Any) -> list[tuple[str, str, str, str, str]]:
    """(phase, host peak, read, written, what it counts) rows of the lifecycle table."""
    from trex.trainer.plan import gib

    return [(p.name, gib(p.host_bytes), gib(p.read_bytes), gib(p.written_bytes), p.note) for p in life.phases]


def _host_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def rows(plan: Any) -> list[tuple[str, str]]:
    """(part, bytes) rows of the table, total and capacity last."""
    from trex.trainer.plan import gib

    master = " (fp32 masters)" if plan.world > 1 else ""
    if plan.swap and plan.masters:
        master = f" (bf16 copies; {gib(plan.masters)} fp32 masters in host memory)"
    states = "in host memory (swap)" if plan.swap else None
    out = [
        (f"parameters{master}", gib(plan.device_params)),
        ("gradients", gib(plan.grads)),
        ("Muon state", states or gib(plan.muon_state)),
        ("AdamW state", states or gib(plan.adamw_state)),
    ]
    if plan.swap:
        out.append(("swap buffers", gib(plan.swap_buffers)))
        out.append(("device bytes saved by swap", gib(plan.swap_saved)))
    if plan.sampling:
        out.append(("reference policy / decoding replica", gib(plan.sampling)))
    out += [
        ("buffers", gib(plan.buffers)),
        (f"activations (one micro-batch, recompute {plan.recompute})", gib(plan.activations)),
        *([("block inputs offloaded to host memory (activationOffload)", gib(plan.offloaded))]
          if plan.offloaded else []),
        ("FSDP gathers (transient)", gib(plan.fsdp_gather)),
        ("communication buffers (transient)", gib(plan.comm_buffers)),
        ("optimizer step (transient)", gib(plan.optimizer_transient)),
        *([("rollout: gathered model + KV cache (transient)", gib(plan.rollout))] if plan.rollout else []),
        ("total (peak)", gib(plan.total)),
        (f"{plan.device.name} memory", gib(plan.capacity) if plan.capacity is not None else "unknown"),
    ]
    return out


def main(argv: list[str] | None = None, manifests: Mapping[str, ManifestReader] | None = None) -> int:
    """Print the plan table, the fit and any problem `trex validate` would report; ``manifests`` reads job
    manifests by kind (a file of another kind is a trainer config: the whole file or its ``trainer:`` section)."""
    args = _parser().parse_args(argv)
    try:
        (cfg, world, device, capacity, host, load), problems = _load(args, manifests or {})
        from trex.trainer.engine_plan import trainer_plan
        from trex.trainer.plan import Layout, gib, plan_lifecycle
        from trex.trainer.rules import parallelism_problems

        if parallelism_problems(cfg, world):
            for line in problems:
                print(f"trex plan: {line}", file=sys.stderr)
            return 1
        plan = trainer_plan(cfg, world, device, capacity)
        life = plan_lifecycle(cfg, world, plan, host, args.source_quant or source_quant(cfg), load)
    except ValueError as e:
        print(f"trex plan: error: {e}", file=sys.stderr)
        return 2
    lay = Layout.of(cfg, world)
    cp = cfg.parallelism.cp  # the plan shards dense parameters over dp x cp: lay.dp counts both
    split = f" x cp {cp}" if cp > 1 else ""
    print(f"{cfg.model.preset} ({cfg.model.dtype}) on {world} x {device.name}: dp {lay.dp // cp}{split} "
          f"(dpShard {lay.dp_shard // cp}) x tp {lay.tp}; MoE: edp {lay.edp} x ep {lay.ep} x etp {lay.etp}; "
          f"micro-batch {cfg.data.micro_batch_size} x {max([cfg.data.seq_len, *(s.seq_len for s in cfg.data.seq_len_curriculum)])} tokens")
    table = rows(plan)
    width = max(len(k) for k, _ in table)
    for key, val in table:
        print(f"  {key:<{width}}  {val:>12}")
    if plan.fits is None:
        print("fit: not checked (unknown capacity: set resources.limits.memory)")
    else:
        free = (plan.capacity or 0) - plan.total
        print(f"fit: {'yes' if plan.fits else 'no'} ({gib(abs(free))} {'free' if free >= 0 else 'over'})")
    print("lifecycle per rank (host memory peak, disk bytes read and written; step: per step):")
    life_rows = [("phase", "host peak", "read", "written", "counts"), *lifecycle_rows(life)]
    w = [max(len(r[i]) for r in life_rows) for i in range(4)]
    for r in life_rows:
        print(f"  {r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]:>{w[3]}}  {r[4]}")
    if life.fits is None:
        print("host fit: not checked (set resources.limits.memory)")
    else:
        spare = (life.host_capacity or 0) - life.peak.host_bytes
        print(f"host fit: {'yes' if life.fits else 'no'}: peak {life.peak.name} {gib(life.peak.host_bytes)} of "
              f"{gib(life.host_capacity or 0)} per rank ({gib(abs(spare))} {'free' if spare >= 0 else 'over'})")
    for line in problems:
        print(f"problem: {line}")
    return 1 if problems or plan.fits is False else 0

