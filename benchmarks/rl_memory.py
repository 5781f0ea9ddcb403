"""Per-rank host memory of GRPO's pieces at 1 and 2 ranks (spawn, gloo, CPU, dp = world) on a V4-shaped model: the
frozen reference (built whole, as before, vs distributed like the student), the loss's log-probs (full [B, T, V]
logits, as before, vs the fused chunked head), opd's teacher head (gathered whole, as before, vs this rank's
vocabulary rows) and the anticipatory-routing snapshots (whole vs this rank's shards).

Usage: python benchmarks/rl_memory.py [--worlds 1 2] [--vocab 32768] [--hidden 256] [--tokens 1024]

Peak RSS is VmHWM after resetting it through /proc/self/clear_refs, reported above the RSS when the phase began
("over"); snapshot bytes are what the ring buffer holds after Δt + 1 steps.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _over(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Peak RSS above the start while ``fn`` runs, and what it returned (kept alive until measured)."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    rss = _status("VmRSS")
    out = fn()
    return _status("VmHWM") - rss, out


def _cfg(a: argparse.Namespace) -> Any:
    from trex.config_base import load_section
    from trex.trainer.config import TrainerConfig

    return load_section(TrainerConfig, {
        "mode": "grpo", "seed": 0, "data": {"train": "unused.jsonl"}, "grpo": {"klCoef": 0.001},
        "model": {"preset": "tiny", "dtype": "fp32", "overrides": {
            "attention": "csa", "vocabSize": a.vocab, "hiddenSize": a.hidden, "numHeads": 4, "qLoraRank": 128,
            "qkNopeHeadDim": 96, "qkRopeHeadDim": 32, "vHeadDim": 128, "hcMult": 2, "numLayers": 2,
            "layerTypes": ["csa", "hca"], "csaCompressEvery": 4, "hcaCompressEvery": 8, "csaTopK": 4,
            "csaWindow": 8, "csaIndexerHeads": 2, "csaIndexerDim": 64, "nRoutedExperts": 16, "expertsPerToken": 2,
            "moeIntermediateSize": a.hidden, "oGroups": 2, "oLoraRank": 64, "mtpDepth": 1, "nHashLayers": 1,
            "scoring": "sqrt-softplus", "maxSeqLen": 4096}}})


def _worker(rank: int, world: int, out: str, a: argparse.Namespace) -> None:
    from trex.trainer.build import build_layout, distributed_model
    from trex.trainer.model import build_model
    from trex.trainer.parallel.mesh import ParallelDims
    from trex.trainer.rl.grpo import token_logprobs
    from trex.trainer.rl.objective import build_reference
    from trex.trainer.rl.step import sampled_logprobs
    from trex.trainer.spike import AnticipatoryRouting

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{out}/rdv-{world}", rank=rank, world_size=world)
    cfg = _cfg(a)
    dims = ParallelDims(world=world, dp_shard=world)
    layout = build_layout(dims, world, "cpu")
    dev = torch.device("cpu")
    row: dict[str, Any] = {}
    row["reference_whole"], whole = _over(lambda: build_model(cfg.model, device=dev, dtype=torch.float32, seed=0))
    del whole
    row["reference_sharded"], ref = _over(lambda: build_reference(cfg, dev, dims, layout.meshes))
    row["reference_resident"] = sum(getattr(p, "to_local", lambda p=p: p)().nbytes for p in ref.parameters())
    del ref
    if layout.meshes is None:
        model = build_model(cfg.model, device=dev, dtype=torch.float32, seed=0)
    else:
        model = distributed_model(cfg.model.args, dims, layout.meshes, torch.float32, dev, 0)[0]
    ids = torch.randint(0, a.vocab, (2, a.tokens // 2), generator=torch.Generator().manual_seed(rank))
    targets = torch.roll(ids, -1, dims=1)

    def full() -> None:
        token_logprobs(model(ids).logits / 0.9, targets).double().sum().backward()

    def fused() -> None:
        sampled_logprobs(model, ids, targets, 0.9).double().sum().backward()

    for name, fn in (("fused", fused), ("full", fused), ("full", full), ("fused", fused)):
        model.zero_grad(set_to_none=True)
        row[f"logprobs_{name}"], _ = _over(fn)  # each measured after a warm run of the other
    if layout.meshes is not None:  # opd's teacher head: this rank's vocabulary rows vs the whole head gathered
        from trex.trainer.distill.teacher import TeacherLayout, vocab_rows

        teacher = distributed_model(cfg.model.args, dims, layout.meshes, torch.float32, dev, 0, frozen=True)[0]
        w = teacher.lm_head.weight.detach()
        row["teacher_head_gathered"], head = _over(lambda: w.full_tensor().clone())  # type: ignore[union-attr]
        del head
        row["teacher_head_rows"], head = _over(lambda: TeacherLayout(dims, layout.meshes, vocab_rows(a.vocab, dims, 0, rank, 0)).head(
            teacher, torch.float32))
        row["teacher_head_rows_bytes"] = head.nbytes
        del head, teacher
    ar = AnticipatoryRouting(model.moe_gates, model.set_anticipatory_router_weights, 2, 3)
    for _ in range(3):
        ar.snapshot()
    row["snapshot_bytes"] = sum(t.nbytes for s in ar.snapshots for t in s.values())
    row["snapshot_whole_bytes"] = 3 * sum(g.weight.numel() * g.weight.element_size() for _, g in model.moe_gates())
    Path(out, f"{world}-{rank}.json").write_text(json.dumps(row))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--tokens", type=int, default=1024, help="tokens per rank in the log-prob phase (2 rows)")
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mib = 1024 ** 2
    with tempfile.TemporaryDirectory() as out:
        for world in a.worlds:
            mp.spawn(_worker, args=(world, out, a), nprocs=world, join=True)  # type: ignore[attr-defined,no-untyped-call]
            for rank in range(world):
                r = json.loads(Path(out, f"{world}-{rank}.json").read_text())
                print(f"world {world} rank {rank}: " + ", ".join(
                    f"{k} {v / 1024:.1f} KiB" if k.startswith("snapshot") else f"{k} {v / mib:.1f} MiB"
                    for k, v in r.items()))


if __name__ == "__main__":
    main()
