"""Per-rank cost of the phases around the training step at 1, 2 and 4 ranks (spawn, gloo, CPU): the Hugging Face
load of a release-layout (FP8 attention, FP4 experts, DeepSeek's original names) V4-shaped model, a checkpoint
save, and the verification + restore a resume does (latest_step + load_latest).

Usage: python benchmarks/lifecycle_scale.py [--worlds 1 2 4] [--vocab 8192] [--hidden 512] [--experts 16]

Per phase, world and rank: bytes read and written, bytes sha256-hashed, peak RSS (VmHWM after resetting it through
/proc/self/clear_refs), that peak over the rank's runtime (its RSS after the same phases ran on a small model, before
the measured model exists: torch, gloo, the imports), and seconds. Bytes read of the HF load are the
slice reader's count where the code has one (trex.trainer.hfio), else the folder's size (a whole-folder load reads
every file); hashed bytes are the checkpointer's count where it keeps one, else those passed to its sha256_file;
checkpoint bytes come from /proc/self/io (rchar / wchar: read and write system calls). Layouts: 1 = one
process, no mesh; 2 = dp2; 4 = dp2 x ep2 (the dense view dp4, experts over ep2). Last, the lifecycle plan
(trex.trainer.plan.plan_lifecycle) of the flagship example (V4-Flash, 512 ranks, release-layout FP8/FP4 start,
fp8-fp4 export) per rank: what these phases extrapolate to.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HASHED = [0]


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _io() -> dict[str, int]:
    return {k: int(v) for k, v in (line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())}


class Phase:
    """Peak RSS, I/O system calls, hashed bytes and seconds of one phase on this rank."""

    def __enter__(self) -> Phase:
        Path("/proc/self/clear_refs").write_text("5")
        self.rss0, self.io0, self.hash0, self.t0 = _status("VmRSS"), _io(), HASHED[0], time.perf_counter()
        return self

    def __exit__(self, *_: object) -> None:
        io = _io()
        self.seconds = time.perf_counter() - self.t0
        self.peak = _status("VmHWM")
        self.rchar, self.wchar = io["rchar"] - self.io0["rchar"], io["wchar"] - self.io0["wchar"]
        self.hashed = HASHED[0] - self.hash0

    def row(self, runtime: int, **extra: Any) -> dict[str, Any]:
        return {"peak": self.peak, "over": self.peak - runtime, "seconds": self.seconds,
                "read": self.rchar, "written": self.wchar, "hashed": self.hashed, **extra}


def _args(a: argparse.Namespace, small: bool = False) -> Any:
    from trex.trainer.model.args import ModelArgs

    if small:
        a = argparse.Namespace(vocab=256, hidden=128, experts=4)
    return ModelArgs(attention="csa", vocab_size=a.vocab, hidden_size=a.hidden, num_heads=4, q_lora_rank=128,
                     qk_nope_head_dim=96, qk_rope_head_dim=32, v_head_dim=128, hc_mult=2, num_layers=2,
                     layer_types=["csa", "hca"], csa_compress_every=4, hca_compress_every=8, csa_top_k=4,
                     csa_window=8, csa_indexer_heads=2, csa_indexer_dim=64, n_routed_experts=a.experts,
                     experts_per_token=2, moe_intermediate_size=a.hidden, o_groups=2, o_lora_rank=64, mtp_depth=1,
                     n_hash_layers=1, scoring="sqrt-softplus", init_std=0.02)


def _hashed(mgr: Any) -> dict[str, int]:
    """The manager's own count of hashed bytes where it keeps one (it also hashes by blocks), else sha256_file's."""
    return {"hashed": mgr.hashed_bytes} if hasattr(mgr, "hashed_bytes") else {}


def _worker(rank: int, world: int, out: str, a: argparse.Namespace) -> None:
    import trex.trainer.checkpoint as ckpt
    from trex.trainer import hf

    real = ckpt.sha256_file

    def counting(path: Path, chunk: int = 1 << 20) -> str:
        HASHED[0] += path.stat().st_size
        return real(path, chunk)

    ckpt.sha256_file = counting  # type: ignore[assignment]
    torch.set_num_threads(1)
    root = Path(out)
    group = None
    if world > 1:
        from trex.trainer.build import build_layout, distributed_model
        from trex.trainer.parallel.mesh import ParallelDims

        dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous-{world}", rank=rank, world_size=world)
        group = dist.group.WORLD
        dims = ParallelDims(world=world, dp_shard=world, ep=1 if world == 2 else 2)
        layout = build_layout(dims, world, "cpu")
        assert layout.meshes is not None
        meshes = layout.meshes

        def build(small: bool) -> Any:
            return distributed_model(_args(a, small), dims, meshes, torch.float32, torch.device("cpu"), 0)[0]
    else:
        from trex.trainer.model.model import build_model_from_args

        def build(small: bool) -> Any:
            return build_model_from_args(_args(a, small), seed=0)
    load = hf.load_hf_sharded if world > 1 else hf.load_hf_into
    small = build(True)  # the same phases on a small model first: every import and cache warm
    load(small, root / "small")
    warm = ckpt.CheckpointManager(root / f"warm-{world}", group=group)
    warm.save(1, small, [], {"rank": rank})
    warm.load_latest(small, [])
    del small, warm
    gc.collect()
    runtime = _status("VmRSS")  # torch, gloo and the imports the phases use: the constant every rank has
    model = build(False)
    rows: dict[str, Any] = {}
    folder = root / "hf"
    with Phase() as p:
        stats = load(model, folder)
    read = stats.bytes_read if stats is not None else sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    rows["load"] = p.row(runtime, read=read)
    mgr = ckpt.CheckpointManager(root / f"ckpt-{world}", group=group)
    extra = {"rng": torch.get_rng_state(), "rank": rank}
    with Phase() as p:
        mgr.save(1, model, [], extra)
    rows["save"] = p.row(runtime, **_hashed(mgr))
    mgr = ckpt.CheckpointManager(root / f"ckpt-{world}", group=group)
    with Phase() as p:
        mgr.latest_step()
        loaded, _, _ = mgr.load_latest(model, [])
        assert loaded is not None
    rows["resume"] = p.row(runtime, **_hashed(mgr))
    (root / f"w{world}-r{rank}.json").write_text(json.dumps(rows))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--experts", type=int, default=16)
    a = ap.parse_args()
    from trex.trainer.hf import save_hf
    from trex.trainer.model.model import build_model_from_args

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_model_from_args(_args(a), seed=1)
        n = sum(p.numel() for p in model.parameters())
        save_hf(model, root / "hf", layout="original", quant="fp8-fp4", max_shard_bytes=16 << 20)
        save_hf(build_model_from_args(_args(a, small=True), seed=1), root / "small", layout="original", quant="fp8-fp4")
        del model
        size = sum(f.stat().st_size for f in (root / "hf").glob("*.safetensors"))
        print(f"V4-shaped model: {n / 1e6:.1f}M parameters; release-layout folder {size / 2**20:.1f} MiB "
              f"(FP8 attention, FP4 experts, original names)")
        results: dict[int, list[dict[str, Any]]] = {}
        for world in a.worlds:
            mp.spawn(_worker, args=(world, tmp, a), nprocs=world, join=True)  # type: ignore[attr-defined,no-untyped-call]
            results[world] = [json.loads((root / f"w{world}-r{r}.json").read_text()) for r in range(world)]
    mib = 2**20
    print(f"{'phase':<7}{'world':>6}{'rank':>5}{'read MiB':>10}{'written MiB':>12}{'hashed MiB':>11}"
          f"{'peak RSS MiB':>13}{'over runtime':>13}{'seconds':>9}")
    for phase in ("load", "save", "resume"):
        for world, ranks in results.items():
            for rank, rows in enumerate(ranks):
                r = rows[phase]
                print(f"{phase:<7}{world:>6}{rank:>5}{r['read'] / mib:>10.2f}{r['written'] / mib:>12.2f}"
                      f"{r['hashed'] / mib:>11.2f}{r['peak'] / mib:>13.1f}{r['over'] / mib:>13.1f}{r['seconds']:>9.2f}")
    print("\nmax over ranks, as a fraction of world 1 (ideal 1/N):")
    for phase in ("load", "save", "resume"):
        base = results[a.worlds[0]]
        for key in ("read", "hashed", "over"):
            b = max(r[phase][key] for r in base) or 1
            fr = "  ".join(f"w{w}={max(r[phase][key] for r in rs) / b:.2f}" for w, rs in results.items())
            print(f"  {phase:<7}{key:<7} {fr}")
    _flagship_plan()


def _flagship_plan() -> None:
    """The flagship example's lifecycle plan per rank, started from a release-layout folder."""
    import yaml
    from trex.config_base import load_section
    from trex.trainer.config import TrainerConfig
    from trex.trainer.mfu import DEVICES
    from trex.trainer.plan import gib, plan_lifecycle, plan_memory

    path = Path(__file__).resolve().parents[1] / "examples" / "trainjob-v4-flash-npu.yaml"
    spec = yaml.safe_load(path.read_text())["spec"]
    cfg = load_section(TrainerConfig, spec["trainer"])
    world = spec["replicas"] * spec["devicesPerReplica"]
    mem = plan_memory(cfg, world, DEVICES[spec["deviceModel"]])
    life = plan_lifecycle(cfg, world, mem, 1400 * 2**30 // spec["devicesPerReplica"], source="fp8-fp4", load=True)
    print(f"\nplanned per rank, {path.name} ({world} ranks, loaded from an FP8/FP4 release folder):")
    for p in life.phases:
        print(f"  {p.name:<11}host {gib(p.host_bytes):>10}  read {gib(p.read_bytes):>10}  "
              f"written {gib(p.written_bytes):>10}")


if __name__ == "__main__":
    main()
