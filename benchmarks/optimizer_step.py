"""Optimizer step time, Muon + AdamW (the default) against AdamW only (optimizer.muon.enabled: false), on one
model in one process.

Usage: python benchmarks/optimizer_step.py [--preset small-cpu] [--rounds 5] [--json out.json]

Two copies of the same model (the preset, fp32, seed 0) get the same gradients from one backward each; the two
optimizer steps are then timed alternately (ABBA per round, so load that slows one pair slows both sides), and
the table gives the median step seconds of each and their ratio (Muon / AdamW-only). Newton-Schulz runs in the
dtype the trainer picks on this device (optimizer.muon.nsDtype auto).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch
from trex.config_base import load_section
from trex.trainer.build import ns_dtype
from trex.trainer.config import TrainerConfig
from trex.trainer.model import build_model, compute_loss
from trex.trainer.optim.build import Optimizers, build_optimizers


def _variant(preset: str, muon: bool) -> tuple[TrainerConfig, Optimizers]:
    """The model with its gradients set by one backward, and its optimizers."""
    cfg = load_section(TrainerConfig, {"model": {"preset": preset, "dtype": "fp32"},
                                       "optimizer": {"muon": {"enabled": muon}}})
    model = build_model(cfg.model, dtype=torch.float32, seed=0)
    ids = torch.randint(0, int(model.args.vocab_size), (2, 65), generator=torch.Generator().manual_seed(0))
    out = model(ids[:, :-1], None, torch.zeros_like(ids[:, :-1]), logits=False)
    compute_loss(out, ids[:, 1:], None, cfg.routing, 0)[0].backward()
    opts = build_optimizers(model, dict(model.param_roles()), cfg.optimizer, ns_dtype=ns_dtype(cfg, "cpu"))
    return cfg, opts


def _timed(opts: Optimizers) -> float:
    t0 = time.perf_counter()
    opts.step()
    return time.perf_counter() - t0


def run(preset: str, rounds: int) -> dict[str, Any]:
    """Median step seconds of both variants (after one warm-up step each) and their ratio."""
    _, muon = _variant(preset, True)
    _, adamw = _variant(preset, False)
    params = sum(p.numel() for o in adamw.all() for g in o.param_groups for p in g["params"])
    muon_params = sum(p.numel() for g in muon.muon.param_groups for p in g["params"]) if muon.muon else 0
    _timed(muon), _timed(adamw)
    t_muon: list[float] = []
    t_adamw: list[float] = []
    for _ in range(rounds):
        t_muon.append(_timed(muon))
        t_adamw.append(_timed(adamw))
        t_adamw.append(_timed(adamw))
        t_muon.append(_timed(muon))
    m, a = statistics.median(t_muon), statistics.median(t_adamw)
    return {"preset": preset, "params": params, "muonParams": muon_params, "threads": torch.get_num_threads(),
            "muonStepS": m, "adamwOnlyStepS": a, "ratio": m / a}


def main(argv: list[str] | None = None) -> int:
    """Print the figures (and write them as JSON with --json)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--preset", default="small-cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    r = run(args.preset, args.rounds)
    print(f"{r['preset']}: {r['params'] / 1e6:.1f}M parameters ({r['muonParams'] / 1e6:.1f}M in Muon), "
          f"{r['threads']} thread(s)")
    print(f"optimizer step  Muon+AdamW {r['muonStepS'] * 1e3:8.1f} ms   AdamW only {r['adamwOnlyStepS'] * 1e3:8.1f} ms"
          f"   ratio {r['ratio']:.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
