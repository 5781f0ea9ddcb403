"""`trex mfu`: parameters, active parameters, FLOPs per token and MFU for a preset (memory: `trex plan`)."""

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
    if args.seq_len <= 0:
        raise ValueError(f"--seq-len must be positive, got {args.seq_len}")
    values: dict[str, Any] = resolve_model_values(args.preset, {})
    if args.device.lower() == "cpu" and args.peak_flops is None:
        peak = m.measure_cpu_peak_flops(seconds=1.0)
    else:
        peak = m.device_peak(args.device, args.peak_flops)
    p = m.param_breakdown(values)
    fpt = m.flops_per_token(values, args.seq_len)
    util = m.mfu(args.tps, fpt, peak)
    return [
        ("preset", args.preset),
        ("parameters", _fmt(p.total)),
        ("active parameters", _fmt(p.active)),
        ("parameters without MTP (as published)", _fmt(p.main_model)),
        ("activated without MTP, embedding (as published)", _fmt(p.main_model_activated)),
        ("FLOPs per token", _fmt(fpt, "FLOP")),
        ("FLOPs convention", m.FLOPS_CONVENTION),
        ("peak per device", _fmt(peak, "FLOP/s")),
        ("MFU", f"{100 * util:.2f} %"),
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
