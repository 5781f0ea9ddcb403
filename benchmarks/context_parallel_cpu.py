"""Context parallelism on CPU (gloo): per-rank saved activations against the memory plan, key-gather traffic
against the analytical volume, and forward + backward time, at cp 1, 2 and 4.

For each cp (spawned ranks, OMP_NUM_THREADS=1) every rank runs one forward + loss + backward of its chunks of
the same micro-batch (an MLA model, packed documents) with the cp rank's key gathering installed, and prints:
- the largest per-rank bytes of the distinct storages autograd saves (parameters excluded) and
  trex.trainer.plan.context_activation_bytes for the same shape (goal: plan / measured within 0.75-1.33, as the
  single-process estimate is held to);
- bytes each rank receives from the key-latent all-gathers in the forward / the analytical volume
  layers x B x T (cp-1)/cp x (kv_lora_rank + rope) x element size (goal: 1.00; the backward reduce-scatter
  sends the same volume back);
- median forward + backward seconds (2 cores: cp 4 oversubscribes them, so read it as a report).

    python benchmarks/context_parallel_cpu.py [--seq 1024] [--batch 2] [--repeat 3]
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

DOC = 300
"""Packed document length: boundaries fall inside chunks and documents cross them."""


def _cfg(seq: int) -> Any:
    from trex.config_base import load_section
    from trex.trainer.config import TrainerConfig

    return load_section(TrainerConfig, {
        "model": {"preset": "tiny", "overrides": {"mtpDepth": 0, "maxSeqLen": seq}},
        "data": {"seqLen": seq, "microBatchSize": 2, "globalBatchSize": 2}})


def _measure(cp: int, rank: int, seq: int, batch: int, repeat: int) -> dict[str, Any]:
    """Saved bytes, gathered bytes and step seconds of this rank's chunks."""
    from trex.trainer.model import build_model, compute_loss
    from trex.trainer.model.layers import positions_from_docs
    from trex.trainer.parallel.context import GatheredKeys, install, split_batch

    cfg = _cfg(seq)
    model = build_model(cfg.model)
    gathered = [0]
    if cp > 1:
        group = dist.group.WORLD
        keys = GatheredKeys(group, cp, rank)

        def counted(t: torch.Tensor) -> torch.Tensor:
            out = keys.all_gather(t)
            gathered[0] += (out.numel() - t.numel()) * t.element_size()
            return out

        keys.gather = counted
        install(model, group, cp, rank)
        model.keys = keys  # the counting gather
    ids = torch.randint(0, int(cfg.model.args.vocab_size), (batch, seq), generator=torch.Generator().manual_seed(0))
    docs = (torch.arange(seq) // DOC).expand(batch, seq)
    b = {"ids": ids, "docs": docs, "pos": positions_from_docs(docs)}
    if cp > 1:
        b = split_batch(b, cp, rank)
    mask = torch.ones_like(b["ids"], dtype=torch.bool)
    sizes: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        sizes[st.data_ptr()] = max(sizes.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(b["ids"], b["pos"], b["docs"], logits=False)
        loss, _ = compute_loss(out, b["ids"], mask, cfg.routing, 0)
    loss.backward()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = sum(n for ptr, n in sizes.items() if ptr not in params)
    forward_gathered = gathered[0]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = model(b["ids"], b["pos"], b["docs"], logits=False)
        compute_loss(out, b["ids"], mask, cfg.routing, 0)[0].backward()
        times.append(time.perf_counter() - t0)
    return {"saved": saved, "gathered": forward_gathered, "seconds": statistics.median(times)}


def _worker(rank: int, cp: int, out: str, seq: int, batch: int, repeat: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous-{cp}", rank=rank, world_size=cp)
    try:
        got = _measure(cp, rank, seq, batch, repeat)
        (Path(out) / f"cp{cp}-{rank}.json").write_text(json.dumps(got))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Measure at cp 1, 2 and 4 and print one line per cp."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    from trex.trainer.config import resolved_model_values
    from trex.trainer.plan import Layout, context_activation_bytes

    cfg = _cfg(a.seq)
    values = resolved_model_values(cfg.model)
    layers, latent = int(values["num_layers"]), int(values["kv_lora_rank"]) + int(values["qk_rope_head_dim"])
    print(f"tiny MLA, {a.batch} x {a.seq} tokens, documents of {DOC}, fp32")
    print("cp  saved/rank MiB  plan MiB  plan/saved  gathered/analytical  fwd+bwd s")
    with tempfile.TemporaryDirectory() as tmp:
        for cp in (1, 2, 4):
            if cp == 1:
                rows = [_measure(1, 0, a.seq, a.batch, a.repeat)]
            else:
                mp.spawn(_worker, args=(cp, tmp, a.seq, a.batch, a.repeat), nprocs=cp, join=True)  # type: ignore[attr-defined,no-untyped-call]
                rows = [json.loads((Path(tmp) / f"cp{cp}-{r}.json").read_text()) for r in range(cp)]
            saved = max(r["saved"] for r in rows)
            plan = context_activation_bytes(values, Layout(1, 1, 1, 1, 1, 1), a.batch, a.seq, 4,
                                            attention_probs=True, cp=cp)
            analytical = layers * a.batch * a.seq * (cp - 1) // cp * latent * 4
            ratio = (f"{max(r['gathered'] for r in rows) / analytical:.2f}" if analytical
                     else "-")
            secs = max(r["seconds"] for r in rows)
            print(f"{cp:<3} {saved / 2**20:>14.1f}  {plan / 2**20:>8.1f}  {plan / saved:>10.2f}  {ratio:>19}  "
                  f"{secs:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
