"""Peak host memory and seconds per rank of the Hugging Face export at world 1, 2 and 4 (spawn, gloo, dp = world):
the distributed export (every rank writes what it owns) against the gather path it replaced (the whole model
gathered to rank 0 with get_model_state_dict(full_state_dict=True), a plain copy built there, hf.save_hf).

Usage: python benchmarks/hf_export_memory.py [--preset small-cpu] [--quant none] [--json out.json]

Per rank: ``shards`` is the bytes of the model this rank holds (fp32 masters); ``added`` is what the export adds
to the RSS (VmHWM during the export, reset just before it by "5" into /proc/self/clear_refs, above the RSS
then); peak = shards + added. ``resident`` is the RSS the model build added (allocator slack included).
The model is exported in bf16 (or quantised with --quant).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def measure(rank: int, world: int, root: str, preset: str, path: str, quant: str, chunk_bytes: int,
            results: Any) -> None:
    """One rank: build the model (distributed when world > 1), export it by ``path`` ('distributed' or
    'gather'), put {rank, shards, added, resident, seconds} into ``results``. A tiny model is exported the same
    way first, so modules and communication buffers every process loads are not counted."""
    from trex.config_base import load_section
    from trex.trainer.config import TrainerConfig

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{root}/rdv-{path}-{world}", rank=rank,
                                world_size=world)
    meshes = None
    if world > 1:
        from trex.trainer.parallel.mesh import ParallelDims, build_meshes

        meshes = build_meshes(ParallelDims(world=world, dp_shard=world), "cpu")
    for name in ("tiny", preset):
        cfg = load_section(TrainerConfig, {"model": {"preset": name, "dtype": "fp32"}})
        base = _kib("VmRSS")
        model = _model(cfg, world, meshes)
        resident = _kib("VmRSS") - base
        state = model.state_dict()
        shards = sum(v.to_local().nbytes if hasattr(v, "to_local") else v.nbytes for v in state.values())
        dtypes = {k: torch.float32 if "e_score_correction_bias" in k else torch.bfloat16 for k in state}
        out = Path(root) / f"{path}-{world}-{name}"
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
        if world > 1:
            dist.barrier()
        before = _kib("VmRSS")
        _reset_peak()
        t0 = time.perf_counter()
        if path == "distributed":
            from trex.trainer.hf_export import save_hf_distributed

            save_hf_distributed(state, model.args, out, dtypes, quant=quant, chunk_bytes=chunk_bytes)
        else:
            _gather_export(model, cfg, world, rank, out, quant)
        if world > 1:
            dist.barrier()
        seconds = time.perf_counter() - t0
        added = _kib("VmHWM") - before
        del model, state
    results.put({"rank": rank, "shards": shards, "added": added, "resident": resident, "seconds": seconds})
    if world > 1:
        dist.destroy_process_group()


def _model(cfg: Any, world: int, meshes: Any) -> Any:
    from trex.runtime.device import torch_dtype
    from trex.trainer.model import build_model

    if world == 1:
        return build_model(cfg.model, dtype=torch_dtype(cfg.model.dtype), seed=0)
    from trex.trainer.build import distributed_model
    from trex.trainer.model import ModelArgs
    from trex.trainer.parallel.mesh import ParallelDims

    dims = ParallelDims(world=world, dp_shard=world)
    model, _ = distributed_model(ModelArgs.from_config(cfg.model), dims, meshes, torch.float32, torch.device("cpu"), 0)
    return model


def _gather_export(model: Any, cfg: Any, world: int, rank: int, out: Path, quant: str) -> None:
    """The replaced path: Trainer.export_model (full state gathered to rank 0, a plain bf16 copy) + hf.save_hf."""
    from trex.trainer.hf import save_hf
    from trex.trainer.model import build_model

    if world > 1:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank != 0:
            return
        plain = build_model(cfg.model, device="meta", dtype=torch.bfloat16, seed=0).to_empty(device="cpu")
        plain.load_state_dict(state)
        model = plain
    else:
        model = model.to(torch.bfloat16)
    save_hf(model, out, quant=quant)


def run(preset: str, path: str, world: int, quant: str = "none", chunk_bytes: int = 64 * 1024**2) -> list[dict[str, Any]]:
    """Per-rank figures of one export at ``world`` ranks (rank order)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as root:
        procs = [ctx.Process(target=measure, args=(r, world, root, preset, path, quant, chunk_bytes, results))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise RuntimeError(f"{path} export at world {world} failed")
        rows = [results.get() for _ in procs]
    return sorted(rows, key=lambda r: r["rank"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small-cpu")
    ap.add_argument("--quant", default="none", choices=["none", "fp8", "fp8-fp4"])
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    table: list[dict[str, Any]] = []
    mib = 1024**2
    print(f"{'path':12} {'world':>5} {'shards MiB':>10} {'added MiB':>10} {'peak MiB':>9} {'rss MiB':>8} "
          f"{'seconds':>8}   (maximum over ranks)")
    for path in ("gather", "distributed"):
        for world in (1, 2, 4):
            rows = run(a.preset, path, world, a.quant)
            top = max(rows, key=lambda r: r["shards"] + r["added"])
            print(f"{path:12} {world:>5} {top['shards'] / mib:>10.1f} {top['added'] / mib:>10.1f} "
                  f"{(top['shards'] + top['added']) / mib:>9.1f} {max(r['resident'] for r in rows) / mib:>8.1f} "
                  f"{max(r['seconds'] for r in rows):>8.2f}", flush=True)
            table.append({"path": path, "world": world, "ranks": rows})
    if a.json:
        Path(a.json).write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
