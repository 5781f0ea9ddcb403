"""`trex plan FILE`: :mod:`trex.trainer.plan_cli` with the TrainJob manifest read by the operator's CRD model.

A TrainJob is planned on its replicas x devicesPerReplica ranks against its deviceModel (cpu: the pod's memory
limit / devicesPerReplica), or --world / --device when given; its trainer rules are reported as problems below
the plan rather than refusing the manifest (context ``rules=False``).
"""

from __future__ import annotations

import argparse
from typing import Any

from trex.trainer.plan_cli import Loaded
from trex.trainer.plan_cli import main as plan_main


def read_trainjob(doc: dict[str, Any], args: argparse.Namespace) -> Loaded:
    """(trainer config, world, device, capacity, host bytes per rank, starts from an HF folder) of a TrainJob
    manifest; ValueError with one line when invalid."""
    from pydantic import ValidationError
    from trex.config_base import format_validation_error
    from trex.trainer.mfu import DEVICES

    from trex_operator.api import TrainJob

    try:
        job = TrainJob.model_validate(doc, by_alias=True, by_name=False, context={"rules": False})
        spec = job.spec
        world = args.world or spec.replicas * spec.devices_per_replica
        device = DEVICES[args.device] if args.device else spec.device()
        capacity = spec.device_capacity() if args.device in (None, "cpu") and device.device_type == "cpu" \
            else device.memory_bytes
    except ValidationError as e:
        raise ValueError(format_validation_error(e, model=TrainJob)[0]) from None
    return spec.rollout_trainer(), world, device, capacity, spec.host_capacity(), spec.model_from is not None or None


def server_rows(doc: Any) -> tuple[str, list[tuple[str, str]], bool | None] | None:
    """(heading, rows, fits) of the rollout servers' plan of a TrainJob manifest with spec.rollout.server (their
    own devices, apart from the trainer's), else None."""
    from trex.trainer.engine_plan import rollout_rows, server_plan
    from trex.trainer.plan import gib

    from trex_operator.api import TrainJob

    if not isinstance(doc, dict) or doc.get("kind") != "TrainJob":
        return None
    spec = TrainJob.model_validate(doc, by_alias=True, by_name=False, context={"rules": False}).spec
    srv = spec.rollout.server
    if srv is None:
        return None
    device, util = spec.device(), srv.memory_utilization()
    plan = server_plan(spec.trainer, srv.devices_per_replica, srv.replicas, device, util, srv.max_model_len())
    rows, context = rollout_rows(spec.trainer)
    context = min(context, srv.max_model_len() or context)
    heading = (f"rollout servers: {srv.replicas} x {srv.devices_per_replica} x {device.name} "
               f"(tensor parallel {max(srv.devices_per_replica, 1)}), apart from the trainer's devices")
    table = [
        (f"weights ({spec.trainer.model.dtype}) / {max(plan.devices, 1)} device(s)", gib(plan.weights)),
        (f"KV cache ({-(-rows // srv.replicas)} responses x {context} tokens)", gib(plan.kv_cache)),
        ("total", gib(plan.total)),
        (f"{device.name} memory x {util} (vLLM)", "unknown" if plan.capacity is None else gib(plan.capacity)),
    ]
    return heading, table, plan.fits


def main(argv: list[str] | None = None) -> int:
    """`trex plan`: TrainJob manifests through :func:`read_trainjob` (and, with spec.rollout.server, the servers'
    own plan below the trainer's), trainer configs as they are."""
    code = plan_main(argv, {"TrainJob": read_trainjob})
    if code == 2:
        return code
    import sys

    import yaml

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("file")
    known, _ = ap.parse_known_args(argv if argv is not None else sys.argv[1:])
    try:
        with open(known.file, encoding="utf-8") as fh:
            found = server_rows(yaml.safe_load(fh))
    except (OSError, yaml.YAMLError, ValueError):
        return code  # the trainer's plan above already said why
    if found is None:
        return code
    heading, table, fits = found
    print(heading)
    width = max(len(k) for k, _ in table)
    for key, val in table:
        print(f"  {key:<{width}}  {val:>12}")
    if fits is not None:
        print(f"server fit: {'yes' if fits else 'no'}")
    return 1 if fits is False else code
