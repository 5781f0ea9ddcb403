"""`trex mfu`: parameters, active parameters, FLOPs per token, MFU and memory per device for a preset."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from trex.trainer.config import PRESETS


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="trex mfu", description=__doc__)
    ap.add_argument("--preset", required=True, choices=PRESETS, help="model preset")
    ap.add_argument("--device", required=True,
                    help="device SKU for the peak (h100, h200, a100, 910b, 910c) or 'cpu' (measured)")
    ap.add_argument("--tokens-per-second-per-device", type=float, required=True, dest="tps",
                    help="measured training throughput of one device (tokens/s)")
    ap.add_argument("--peak-flops", type=float, default=None, help="override the catalog peak (FLOP/s)")
    ap.add_argument("--seq-len", type=int, default=4096, help="sequence length (tokens), default 4096")
    ap.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch, default 1")
    for name in ("dp", "tp", "pp", "ep", "etp"):
        ap.add_argument(f"--{name}", type=int, default=1, help=f"{name} degree, default 1")
    return ap


def _fmt(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3f} {suffix}{unit}"
    return f"{n:.3f} {unit}".rstrip()


def report(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(label, value) rows; ValueError on invalid input, naming the option."""
    from trex.trainer import mfu as m
    from trex.trainer.presets import resolve_model_values

    if args.tps <= 0:
        raise ValueError(f"--tokens-per-second-per-device must be positive, got {args.tps}")
    for name in ("seq_len", "micro_batch", "dp", "tp", "pp", "ep", "etp"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    values: dict[str, Any] = resolve_model_values(args.preset, {})
    if values["n_routed_experts"] % args.ep:
        raise ValueError(f"--ep {args.ep} does not divide the routed expert count {values['n_routed_experts']}")
    if values["moe_intermediate_size"] % args.etp:
        raise ValueError(f"--etp {args.etp} does not divide the expert hidden size {values['moe_intermediate_size']}")
    if values["num_heads"] % args.tp:
        raise ValueError(f"--tp {args.tp} does not divide the head count {values['num_heads']}")
    if args.pp > values["num_layers"]:
        raise ValueError(f"--pp {args.pp} exceeds the layer count {values['num_layers']}")
    world = args.dp * args.tp * args.pp
    if world % (args.ep * args.etp * args.pp):
        raise ValueError(f"--ep x --etp x --pp = {args.ep * args.etp * args.pp} does not divide dp x tp x pp = {world}")
    if args.device.lower() == "cpu" and args.peak_flops is None:
        peak = m.measure_cpu_peak_flops(seconds=1.0)
    else:
        peak = m.device_peak(args.device, args.peak_flops)
    p = m.param_breakdown(values)
    fpt = m.flops_per_token(values, args.seq_len)
    util = m.mfu(args.tps, fpt, peak)
    mem = m.memory_per_device(values, dp=args.dp, tp=args.tp, pp=args.pp, ep=args.ep, etp=args.etp,
                              seq_len=args.seq_len, micro_batch=args.micro_batch, world=world)
    gib = 1024**3
    return [
        ("preset", args.preset),
        ("parameters", _fmt(p.total)),
        ("active parameters", _fmt(p.active)),
        ("FLOPs per token", _fmt(fpt, "FLOP")),
        ("FLOPs convention", m.FLOPS_CONVENTION),
        ("peak per device", _fmt(peak, "FLOP/s")),
        ("MFU", f"{100 * util:.2f} %"),
        ("memory/device params", f"{mem.params / gib:.2f} GiB"),
        ("memory/device grads", f"{mem.grads / gib:.2f} GiB"),
        ("memory/device optimizer", f"{mem.optimizer / gib:.2f} GiB"),
        ("memory/device activations", f"{mem.activations / gib:.2f} GiB"),
        ("memory/device total", f"{mem.total / gib:.2f} GiB"),
    ]


def main(argv: list[str] | None = None) -> int:
    """Parse, compute, print a table; exit 2 with a message on bad input."""
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        rows = report(args)
    except ValueError as exc:
        print(f"trex mfu: error: {exc}", file=sys.stderr)
        return 2
    width = max(len(k) for k, _ in rows)
    for key, val in rows:
        print(f"{key:<{width}}  {val}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
