"""Context parallelism on CPU (gloo): per-rank saved activations against the memory plan, key-gather traffic
against the analytical volume, and forward + backward time, at cp 1, 2 and 4, for an MLA and a DeepSeek-V4 model.

For each model and cp (spawned ranks, OMP_NUM_THREADS=1) every rank runs one forward + loss + backward of its
chunks of the same micro-batch (packed documents) with the cp rank's key gathering installed, and prints:
- the largest per-rank bytes of the distinct storages autograd saves (parameters excluded) and
  trex.trainer.plan.context_activation_bytes for the same shape (goal: plan / measured within 0.75-1.33, as the
  single-process estimate is held to);
- bytes each rank receives from the key all-gathers in the forward / the analytical volume
  B x T (cp-1)/cp x element size x the per-token values of every layer: MLA kv_lora_rank + rope; V4 head_dim
  (sliding), 3 head_dim (hca), 5 head_dim + 4 csa_indexer_dim (csa) (goal: 1.00; the backward reduce-scatter
  sends the same volume back);
- median forward + backward seconds (2 cores: cp 4 oversubscribes them, so read it as a report).

    python benchmarks/context_parallel_cpu.py [--model mla|v4|both] [--seq 1024] [--batch 2] [--repeat 3]
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


V4 = {"attention": "csa", "layerTypes": ["csa", "hca"], "vHeadDim": 24, "qLoraRank": 16, "hcMult": 2, "mtpDepth": 1}
"""The DeepSeek-V4 model: a csa and an hca layer and a sliding-window MTP block, mHC."""


def _cfg(seq: int, model: str = "mla") -> Any:
    from trex.config_base import load_section
    from trex.trainer.config import TrainerConfig

    return load_section(TrainerConfig, {
        "model": {"preset": "tiny", "overrides": {"mtpDepth": 0, "maxSeqLen": seq, **(V4 if model == "v4" else {})}},
        "data": {"seqLen": seq, "microBatchSize": 2, "globalBatchSize": 2}})


def analytical_gather(values: dict[str, Any], batch: int, seq: int, cp: int, elem: int) -> int:
    """Bytes one rank receives from the forward's key all-gathers (per-token key values of the other chunks)."""
    from trex.trainer.model_args import ModelArgs

    args = ModelArgs.from_values(values)
    if args.attention == "mla":
        per_token = args.num_layers * (args.kv_lora_rank + args.qk_rope_head_dim)
    else:
        width = {"sliding": args.head_dim, "hca": 3 * args.head_dim,
                 "csa": 5 * args.head_dim + 4 * args.csa_indexer_dim}
        per_token = sum(width[args.layer_kind(i)] for i in range(args.num_layers + args.mtp_depth))
    return batch * seq * (cp - 1) // cp * per_token * elem


def _measure(cp: int, rank: int, seq: int, batch: int, repeat: int, kind: str) -> dict[str, Any]:
    """Saved bytes, gathered bytes and step seconds of this rank's chunks."""
    from trex.trainer.model import build_model, compute_loss
    from trex.trainer.model.layers import positions_from_docs
    from trex.trainer.parallel.context import GatheredKeys, install, split_batch

    cfg = _cfg(seq, kind)
    model = build_model(cfg.model)
    gathered = [0]
    if cp > 1:
        group = dist.group.WORLD
        keys = GatheredKeys(group, cp, rank)
        gather = keys.all_gather

        def counted(t: torch.Tensor) -> torch.Tensor:
            out = gather(t)
            gathered[0] += (out.numel() - t.numel()) * t.element_size()
            return out

        keys.gather = counted
        keys.all_gather = counted  # type: ignore[method-assign]  # V4's gathers go through it
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


def _worker(rank: int, cp: int, out: str, seq: int, batch: int, repeat: int, kind: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous-{kind}-{cp}", rank=rank, world_size=cp)
    try:
        got = _measure(cp, rank, seq, batch, repeat, kind)
        (Path(out) / f"{kind}-cp{cp}-{rank}.json").write_text(json.dumps(got))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Measure at cp 1, 2 and 4 and print one line per model and cp."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("mla", "v4", "both"), default="both")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    from trex.trainer.config import resolved_model_values
    from trex.trainer.plan import Layout, context_activation_bytes

    print(f"tiny models, {a.batch} x {a.seq} tokens, documents of {DOC}, fp32")
    print("model cp  saved/rank MiB  plan MiB  plan/saved  gathered/analytical  fwd+bwd s")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("mla", "v4") if a.model == "both" else (a.model,):
            values = resolved_model_values(_cfg(a.seq, kind).model)
            for cp in (1, 2, 4):
                if cp == 1:
                    rows = [_measure(1, 0, a.seq, a.batch, a.repeat, kind)]
                else:
                    mp.spawn(_worker, args=(cp, tmp, a.seq, a.batch, a.repeat, kind), nprocs=cp, join=True)  # type: ignore[attr-defined,no-untyped-call]
                    rows = [json.loads((Path(tmp) / f"{kind}-cp{cp}-{r}.json").read_text()) for r in range(cp)]
                saved = max(r["saved"] for r in rows)
                plan = context_activation_bytes(values, Layout(1, 1, 1, 1, 1, 1), a.batch, a.seq, 4,
                                                attention_probs=True, cp=cp)
                analytical = analytical_gather(values, a.batch, a.seq, cp, 4)
                ratio = (f"{max(r['gathered'] for r in rows) / analytical:.2f}" if analytical
                         else "-")
                secs = max(r["seconds"] for r in rows)
                print(f"{kind:<5} {cp:<3} {saved / 2**20:>14.1f}  {plan / 2**20:>8.1f}  {plan / saved:>10.2f}  "
                      f"{ratio:>19}  {secs:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
