"""trex's FSDP2 path against DeepSpeed ZeRO-3 on the same dense model, layout and data (CPU, gloo).

Both engines shard parameters, gradients and optimizer states over the data-parallel ranks and step
torch.optim.AdamW on the same dense-only DeepSeekModel (no MoE, no MTP), so the comparison isolates the
sharding engine. A third run is the trex trainer itself (FSDP2 with Muon + AdamW, as a TrainJob runs).
Each engine runs in its own spawned ranks; per rank it reports the resident memory the run added (peak
RSS minus the RSS before the model was built: everything the engine allocated), and tokens/s (median step
of the timed steps, after a warm-up step). Engines are interleaved over ``--repeats`` rounds.

    pip install 'trex[zero3]'          # DeepSpeed; DS_ACCELERATOR=cpu (it JIT-builds its shared-memory comm op once)
    python benchmarks/zero3_side_by_side.py [--world 2] [--steps 6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SEQ, MICRO = 128, 4
MODEL = {"preset": "tiny", "overrides": {"numLayers": 4, "nDenseLayers": 4, "mtpDepth": 0, "hiddenSize": 256,
                                         "intermediateSize": 1024, "vocabSize": 4096}}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cfg(out: Path, world: int, steps: int) -> Any:
    from trex.config_base import load_section
    from trex.trainer.config import TrainerConfig

    return load_section(TrainerConfig, {
        "model": MODEL, "maxSteps": steps,
        "data": {"seqLen": SEQ, "microBatchSize": MICRO, "globalBatchSize": MICRO * world},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(out / "ckpt"), "intervalSteps": 10_000, "exportHf": False, "resume": False}})


def _batches(rank: int, steps: int, vocab: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + rank)
    return [torch.randint(0, vocab, (MICRO, SEQ + 1), generator=gen) for _ in range(steps)]


def _loss(model: Any, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())


def _fsdp2(cfg: Any, steps: int) -> list[float]:
    from torch.distributed.fsdp import fully_shard
    from trex.trainer.model import build_model

    model = build_model(cfg.model, seed=cfg.seed)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for ids in _batches(dist.get_rank(), steps, model.args.vocab_size):
        t0 = time.perf_counter()
        _loss(model, ids).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times


def _zero3(cfg: Any, steps: int) -> list[float]:
    import deepspeed
    from trex.trainer.model import build_model

    model = build_model(cfg.model, seed=cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ds_cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 3}, "zero_force_ds_cpu_optimizer": False,
              "steps_per_print": 1 << 30, "wall_clock_breakdown": False}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds_cfg)
    times = []
    for ids in _batches(dist.get_rank(), steps, model.args.vocab_size):
        t0 = time.perf_counter()
        loss = _loss(engine, ids)
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t0)
    return times


def _trainer(cfg: Any, steps: int, out: Path) -> list[float]:
    from trex.trainer.loop import Trainer

    tr = Trainer(cfg, out, group=dist.group.WORLD, measure_peak=False, log=lambda _m: None)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        tr.train_step()
        times.append(time.perf_counter() - t0)
    return times


def _worker(rank: int, world: int, engine: str, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method=f"file://{out}/rdv-{engine}", rank=rank, world_size=world)
    try:
        cfg = _cfg(Path(out) / engine, world, steps)
        before = _rss()
        run = {"fsdp2-adamw": lambda: _fsdp2(cfg, steps), "zero3-adamw": lambda: _zero3(cfg, steps),
               "trex-trainer": lambda: _trainer(cfg, steps, Path(out) / engine)}[engine]
        times = run()
        result = {"added_bytes": _peak() - before, "step_s": statistics.median(times[1:]),
                  "tokens_per_s": MICRO * SEQ * world / statistics.median(times[1:])}
        Path(out, f"{engine}-{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        print("DeepSpeed is not installed: pip install 'trex[zero3]'", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    engines = ["fsdp2-adamw", "zero3-adamw", "trex-trainer"]
    got: dict[str, list[dict[str, float]]] = {e: [] for e in engines}
    for r in range(args.repeats):
        for engine in engines[r % 3:] + engines[:r % 3]:  # interleaved, rotating the order
            with tempfile.TemporaryDirectory() as out:
                mp.spawn(_worker, args=(args.world, engine, args.steps, out), nprocs=args.world, join=True)  # type: ignore[attr-defined,no-untyped-call]
                ranks = [json.loads(Path(out, f"{engine}-{i}.json").read_text()) for i in range(args.world)]
            got[engine].append({"added_bytes": max(x["added_bytes"] for x in ranks),
                                "tokens_per_s": statistics.median(x["tokens_per_s"] for x in ranks)})
    med = {e: {k: statistics.median(g[k] for g in got[e]) for k in ("added_bytes", "tokens_per_s")} for e in engines}
    z = med["zero3-adamw"]
    print(f"world {args.world}, dense model {MODEL['overrides']}, seq {SEQ} x micro {MICRO} per rank, "
          f"{args.repeats} interleaved rounds (medians)")
    print(f"{'engine':<14} {'MiB added/rank':>15} {'tokens/s':>10} {'memory/zero3':>13} {'speed/zero3':>12}")
    for e in engines:
        m = med[e]
        print(f"{e:<14} {m['added_bytes'] / 2**20:>15.1f} {m['tokens_per_s']:>10.1f} "
              f"{m['added_bytes'] / z['added_bytes']:>13.2f} {m['tokens_per_s'] / z['tokens_per_s']:>12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
