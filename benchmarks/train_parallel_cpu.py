"""Parallel trainer on CPU (gloo): per-rank state bytes against one process, all-to-all bytes against the
analytical volume, and step time against one process at the same global batch.

For each layout at world 2 and 4 (spawned ranks, OMP_NUM_THREADS=1) and for world 1, it trains a few steps
of the same model and prints:
- per-rank bytes of parameters + gradients + optimizer states held (local shards) / the world-1 bytes,
  next to 1/N (the goal for the sharded parts: within 1/N + 5 %);
- all-to-all bytes sent by the token dispatchers (forward) / the analytical volume, which counts every
  routed row whose expert lives on another ep rank twice (dispatch and combine) plus the etp gather and
  reduce-scatter copies (goal: 1.00);
- median step time / the world-1 median (2 cores: world 4 oversubscribes them, so read it as a report).

    python benchmarks/train_parallel_cpu.py [--steps 4] [--preset tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LAYOUTS: dict[int, dict[str, dict[str, int]]] = {
    2: {"dp2": {}, "ep2": {"ep": 2}, "etp2": {"etp": 2}, "tp2": {"tp": 2}},
    4: {"dp4": {}, "dp2xep2": {"ep": 2}, "ep2xetp2": {"ep": 2, "etp": 2}, "tp2xep2": {"tp": 2, "ep": 2},
        "ep4": {"ep": 4}},
}


def _cfg(out: Path, layout: dict[str, int], steps: int, preset: str) -> Any:
    from trex.config_base import load_section
    from trex.trainer.config import TrainerConfig

    return load_section(TrainerConfig, {
        "model": {"preset": preset}, "maxSteps": steps, "parallelism": layout,
        "data": {"seqLen": 64, "microBatchSize": 4, "globalBatchSize": 16},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(out / "ckpt"), "intervalSteps": 10_000, "exportHf": False, "resume": False},
    })


def _local_bytes(tensors: list[torch.Tensor]) -> int:
    from trex.trainer.model.layers import local_tensor

    return sum(local_tensor(t).numel() * t.element_size() for t in tensors)


def _measure(cfg: Any, out: Path, group: Any) -> dict[str, Any]:
    from trex.trainer.loop import Trainer
    from trex.trainer.model.moe import MoE

    tr = Trainer(cfg, out, group=group, measure_peak=False, log=lambda _m: None)
    remote_rows: list[int] = []
    disp = tr.parallel.dispatchers if tr.parallel is not None else []
    dims = tr.dims
    n_exp = tr.model.args.n_routed_experts
    ep_rank = (tr.rank // dims.etp) % dims.ep

    def count(_m: Any, _a: Any, o: Any) -> None:
        counts = o[2]
        lo, hi = ep_rank * n_exp // dims.ep, (ep_rank + 1) * n_exp // dims.ep
        remote_rows.append(int(counts.sum() - counts[lo:hi].sum()))

    hooks = [m.register_forward_hook(count) for m in tr.model.modules() if isinstance(m, MoE)]
    times = []
    for _ in range(cfg.max_steps):
        t0 = time.perf_counter()
        tr.train_step()
        times.append(time.perf_counter() - t0)
    for h in hooks:
        h.remove()
    param_bytes = _local_bytes(list(tr.model.parameters()))  # gradients (dropped after each step) take the same
    states = [v for s in (o.state.values() for o in tr.opts.all()) for st in s for v in st.values()
              if isinstance(v, torch.Tensor) and v.numel() > 1]
    row_bytes = tr.model.args.hidden_size * 4
    analytical = 0
    if disp:
        # dispatch + combine of every remote row, and with etp the gather and reduce-scatter copies
        analytical = 2 * sum(remote_rows) * row_bytes
    sent = sum(d.a2a_bytes for d in disp)
    return {"bytes": param_bytes * 2 + _local_bytes(states), "step_s": statistics.median(times[1:] or times),
            "a2a_sent": sent, "a2a_remote": analytical, "etp": dims.etp}


def _worker(rank: int, world: int, out: str, steps: int, preset: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rdv-{world}", rank=rank, world_size=world)
    try:
        results = {}
        for name, layout in LAYOUTS[world].items():
            results[name] = _measure(_cfg(Path(out) / name, layout, steps, preset), Path(out), dist.group.WORLD)
        every: list[Any] = [None] * world
        dist.all_gather_object(every, results)
        if rank == 0:
            Path(out, f"world{world}.json").write_text(json.dumps(every))
    finally:
        dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--preset", default="tiny")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        base = _measure(_cfg(Path(tmp) / "w1", {}, args.steps, args.preset), Path(tmp), None)
        print(f"world 1: {base['bytes'] / 2**20:.2f} MiB params+grads+states, step {base['step_s'] * 1e3:.0f} ms")
        print(f"{'layout':>10} {'N':>2} {'bytes/rank vs 1 (max rank)':>27} {'1/N':>5} {'a2a sent/analytical':>20} "
              f"{'step vs 1':>9}")
        for world in (2, 4):
            mp.spawn(_worker, args=(world, tmp, args.steps, args.preset), nprocs=world, join=True)  # type: ignore[attr-defined,no-untyped-call]
            ranks = json.loads(Path(tmp, f"world{world}.json").read_text())
            for name in LAYOUTS[world]:
                rs = [r[name] for r in ranks]
                mem = max(r["bytes"] for r in rs) / base["bytes"]
                sent = sum(r["a2a_sent"] for r in rs)
                remote = sum(r["a2a_remote"] for r in rs)
                etp = rs[0]["etp"]
                a2a = "-" if not remote and not sent else (f"{sent / remote:.3f}" if etp == 1 else
                                                           f"{sent / 1e6:.2f} MB (etp copies)")
                step = statistics.median(r["step_s"] for r in rs) / base["step_s"]
                print(f"{name:>10} {world:>2} {mem:>27.3f} {1 / world:>5.2f} {a2a:>20} {step:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
