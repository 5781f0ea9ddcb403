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
    return spec.trainer, world, device, capacity, spec.host_capacity(), spec.model_from is not None or None


def main(argv: list[str] | None = None) -> int:
    """`trex plan`: TrainJob manifests through :func:`read_trainjob`, trainer configs as they are."""
    return plan_main(argv, {"TrainJob": read_trainjob})
