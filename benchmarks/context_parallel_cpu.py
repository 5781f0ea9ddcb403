"""Context parallelism on CPU (gloo): per-rank saved activations against the memory plan, key traffic against the
analytical volume, and forward + backward time, at cp 1, 2 and 4, for an MLA and a DeepSeek-V4 model.

For each model and cp (spawned ranks, OMP_NUM_THREADS=1) every rank runs one forward + loss + backward of its
chunks of the same micro-batch (packed documents) with the cp rank's key gathering installed, and prints:
- the largest per-rank bytes of the distinct storages autograd saves in the forward (parameters excluded), the
  most the backward's recomputations save at once (a V4 layer's sink attention recomputes one block of query
  rows), and trex.trainer.plan.context_activation_bytes for the same shape against their sum, what a rank keeps
  (goal: 0.9-1.15);
- bytes each rank receives from the key exchanges in the forward / the analytical volume (goal: 1.00 on every
  rank; the backward sends the same volume back). MLA all-gathers B x T (cp-1)/cp x element size x
  (kv_lora_rank + rope) per layer. A V4 layer receives its halo (the tokens within csa_window - 1 before a held
  token that the rank does not hold, head_dim each; on compressed layers also those within the pooling's reach,
  2 csa_compress_every - 1 or hca_compress_every - 1, with the compressor's and indexer's features: csa 4 head_dim
  + 4 csa_indexer_dim, hca 2 head_dim) and the compressed entries of the complete windows (a token at position
  every - 1 modulo every ends one) whose last token another rank holds (csa head_dim + csa_indexer_dim, hca
  head_dim). "before MiB" is what the V4 layers received when they all-gathered every per-token value
  (B x T (cp-1)/cp x head_dim, 3 head_dim or 5 head_dim + 4 csa_indexer_dim), "exchanged MiB" what they receive
  now (the largest rank);
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
    """Bytes one MLA rank receives from the forward's key all-gathers (per-token key values of the other chunks)."""
    from trex.trainer.model_args import ModelArgs

    args = ModelArgs.from_values(values)
    return batch * seq * (cp - 1) // cp * args.num_layers * (args.kv_lora_rank + args.qk_rope_head_dim) * elem


def v4_gathered_before(values: dict[str, Any], batch: int, seq: int, cp: int, elem: int) -> int:
    """Bytes a V4 rank received when every layer all-gathered every per-token value of the whole sequences."""
    from trex.trainer.model_args import ModelArgs

    args = ModelArgs.from_values(values)
    width = {"sliding": args.head_dim, "hca": 3 * args.head_dim, "csa": 5 * args.head_dim + 4 * args.csa_indexer_dim}
    per_token = sum(width[args.layer_kind(i)] for i in range(args.num_layers + args.mtp_depth))
    return batch * seq * (cp - 1) // cp * per_token * elem


def v4_analytical(values: dict[str, Any], pos: torch.Tensor, cp: int, rank: int, elem: int) -> int:
    """Bytes V4 cp rank ``rank`` receives in the forward for rows at positions pos [B, T]: each layer's halo and
    the entries of the complete windows it does not hold the last token of."""
    from trex.trainer.model_args import ModelArgs

    args = ModelArgs.from_values(values)
    rows, seq = pos.shape
    size = seq // (2 * cp)
    held = {g for k in (rank, 2 * cp - 1 - rank) for g in range(k * size, (k + 1) * size)}

    def halo(reach: int) -> int:
        return len({j for i in held for j in range(max(0, i - reach), i)} - held)

    hd, idx_dim = args.head_dim, args.csa_indexer_dim
    total = 0
    for layer in range(args.num_layers + args.mtp_depth):
        kind = args.layer_kind(layer)
        total += rows * halo(args.csa_window - 1) * hd
        if kind != "sliding":
            every = args.csa_compress_every if kind == "csa" else args.hca_compress_every
            reach = 2 * every - 1 if kind == "csa" else every - 1
            total += rows * halo(reach) * (4 * hd + 4 * idx_dim if kind == "csa" else 2 * hd)
            others = torch.tensor([g not in held for g in range(seq)])
            ends = int(((pos % every == every - 1) & others).sum())
            total += ends * (hd + (idx_dim if kind == "csa" else 0))
    return total * elem


class LiveSaved:
    """saved_tensors_hooks for the backward: the peak bytes of distinct storages (parameters excluded) that the
    backward's recomputations save and hold at once (a V4 layer's sink attention recomputes one block of query
    rows at a time)."""

    def __init__(self, params: set[int]) -> None:
        self.params, self.refs, self.now, self.peak = params, dict[int, list[int]](), 0, 0

    def pack(self, t: torch.Tensor) -> Any:
        """Count the tensor's storage while a handle to it lives."""
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr in self.params:
            return t
        ref = self.refs.setdefault(ptr, [st.nbytes(), 0])
        if ref[1] == 0:
            self.now += ref[0]
            self.peak = max(self.peak, self.now)
        ref[1] += 1
        return _Held(self, ptr, t)

    def unpack(self, held: Any) -> torch.Tensor:
        """The tensor back."""
        return held.t if isinstance(held, _Held) else held

    def release(self, ptr: int) -> None:
        """One handle to the storage at ptr is gone."""
        ref = self.refs[ptr]
        ref[1] -= 1
        if ref[1] == 0:
            self.now -= ref[0]
            del self.refs[ptr]


class _Held:
    """A saved tensor counted by LiveSaved until autograd drops it."""

    def __init__(self, owner: LiveSaved, ptr: int, t: torch.Tensor) -> None:
        self.owner, self.ptr, self.t = owner, ptr, t.detach()  # no cycle through a saved output's grad_fn

    def __del__(self) -> None:
        self.owner.release(self.ptr)


def _measure(cp: int, rank: int, seq: int, batch: int, repeat: int, kind: str) -> dict[str, Any]:
    """Saved bytes, gathered bytes and step seconds of this rank's chunks."""
    from trex.trainer.config import resolved_model_values
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

        def exchanged(flat: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
            gathered[0] += sum(out_splits) * flat.element_size()
            return exchange(flat, out_splits, in_splits)

        exchange = keys.exchange
        keys.gather = counted
        keys.exchange = exchanged  # type: ignore[method-assign]  # V4's halos and entries go through it
        install(model, group, cp, rank)
        model.keys = keys  # the counting gather
    ids = torch.randint(0, int(cfg.model.args.vocab_size), (batch, seq), generator=torch.Generator().manual_seed(0))
    docs = (torch.arange(seq) // DOC).expand(batch, seq)
    b = {"ids": ids, "docs": docs, "pos": positions_from_docs(docs)}
    whole_pos = b["pos"]
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
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = sum(n for ptr, n in sizes.items() if ptr not in params)
    live = LiveSaved(params)
    with torch.autograd.graph.saved_tensors_hooks(live.pack, live.unpack):
        loss.backward()
    forward_gathered = gathered[0]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = model(b["ids"], b["pos"], b["docs"], logits=False)
        compute_loss(out, b["ids"], mask, cfg.routing, 0)[0].backward()
        times.append(time.perf_counter() - t0)
    analytical = (v4_analytical(resolved_model_values(cfg.model), whole_pos, cp, rank, 4) if kind == "v4"
                  else analytical_gather(resolved_model_values(cfg.model), batch, seq, cp, 4))
    return {"saved": saved, "transient": live.peak, "gathered": forward_gathered, "analytical": analytical,
            "seconds": statistics.median(times)}


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
    print("model cp  saved/rank MiB  bwd transient MiB  plan MiB  plan/kept  gathered/analytical  before MiB  "
          "exchanged MiB  fwd+bwd s")
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
                transient = max(r["transient"] for r in rows)
                plan = context_activation_bytes(values, Layout(1, 1, 1, 1, 1, 1), a.batch, a.seq, 4,
                                                attention_probs=True, cp=cp)
                ratios = sorted({f"{r['gathered'] / r['analytical']:.2f}" for r in rows if r["analytical"]})
                ratio = "/".join(ratios) or "-"
                before = v4_gathered_before(values, a.batch, a.seq, cp, 4) if kind == "v4" else 0
                moved = max(r["gathered"] for r in rows)
                secs = max(r["seconds"] for r in rows)
                kept = max(r["saved"] + r["transient"] for r in rows)
                print(f"{kind:<5} {cp:<3} {saved / 2**20:>14.1f}  {transient / 2**20:>17.1f}  {plan / 2**20:>8.1f}  "
                      f"{plan / kept:>9.2f}  "
                      f"{ratio:>19}  {before / 2**20:>10.2f}  {moved / 2**20:>13.3f}  {secs:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
