"""Mode lm: the language-model loss over the step's micro-batches of packed text or SFT samples (batch ramp,
sequence-length curriculum), token-weighted over the whole global batch."""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer
from torch import nn

from trex.trainer.data.build import build_data, packing_line
from trex.trainer.data.loader import PackedLoader, SampleLoader
from trex.trainer.model import compute_loss
from trex.trainer.model.loss import MTPTargets, loss_tokens, mtp_targets
from trex.trainer.objective import Outcome, RunContext
from trex.trainer.optim.schedule import global_batch_at, micro_steps, seq_len_at


class LMObjective:
    """Next-token prediction (with MTP, balance and indexer terms) on data.train or the demo corpus."""

    loss_key = "lm"
    watch_spikes = True

    def __init__(self, ctx: RunContext, vocab: int) -> None:
        self.ctx = ctx
        self.tokenizer: Tokenizer
        self.loader: PackedLoader | SampleLoader
        self.tokenizer, self.loader, _fmt = build_data(ctx.cfg.data, ctx.ckpt_dir.parent / "tokenizer", vocab)

    def notes(self) -> list[str]:
        """The SFT packing policy's effect on the corpus (nothing for streamed text)."""
        line = packing_line(self.loader, self.ctx.cfg.data.seq_len)
        return [] if line is None else [line]

    def prepare(self) -> None:
        """Nothing beyond the data, built with the objective."""

    def backward(self, model: nn.Module, step: int) -> Outcome:
        """Forward and backward of the language-model loss over the step's micro-batches."""
        ctx, cfg = self.ctx, self.ctx.cfg
        dev = ctx.device
        seq_len = seq_len_at(step, [(c.step, c.seq_len) for c in cfg.data.seq_len_curriculum], cfg.data.seq_len)
        gbatch = global_batch_at(step, [(r.step, r.global_batch_size) for r in cfg.optimizer.batch_ramp],
                                 cfg.data.global_batch_size)
        dp = ctx.dims.dp
        n_micro = micro_steps(gbatch, cfg.data.micro_batch_size, dp)
        batches = [self.loader.next_batch(cfg.data.micro_batch_size, seq_len, ctx.dp_rank, dp)
                   for _ in range(n_micro)]
        # Token-weighted mean over the whole global batch: micro-batch i weighs (its loss tokens) / (all of
        # them on every rank), so SFT batches with few assistant tokens do not count as much as full ones.
        valid = [float(b["loss_mask"].sum()) for b in batches]
        lm_tokens: list[float | None] = [None] * len(batches)
        mtp: list[MTPTargets | None] = [None] * len(batches)
        if ctx.dims.cp > 1:  # this rank's chunks of the sequences; its lm and MTP terms are its shares of theirs
            from trex.trainer.parallel.context import split_batch

            lm_tokens = [loss_tokens(b["labels"], b["loss_mask"]) for b in batches]
            depth = cfg.model.args.mtp_depth
            whole = [[mtp_targets(b["labels"], b["loss_mask"], b["doc_ids"], k + 1) for k in range(depth)]
                     for b in batches]
            batches = [split_batch({**b, **{f"mtp{k}_{n}": t for k, pair in enumerate(w)
                                            for n, t in zip(("targets", "weights"), pair, strict=True)}},
                                   ctx.dims.cp, ctx.cp_rank) for b, w in zip(batches, whole, strict=True)]
            mtp = [[(b[f"mtp{k}_targets"], b[f"mtp{k}_weights"], float(w[k][1].sum())) for k in range(depth)]
                   for b, w in zip(batches, whole, strict=True)]
        total_valid = ctx.sum_over_ranks([sum(float(b["loss_mask"].sum()) for b in batches)])[0]
        counts: torch.Tensor | None = None
        parts_sum: dict[str, float] = {}
        for batch_cpu, n_valid, n_lm, mtp_cpu in zip(batches, valid, lm_tokens, mtp, strict=True):
            # In one process a micro-batch without loss tokens is skipped; across ranks it still runs (with
            # weight 0 and its expert counts left out) because its forward and backward hold collectives.
            if n_valid == 0 and (ctx.meshes is None or total_valid == 0):
                continue
            weight = n_valid / total_valid
            batch = {k: v.to(dev) for k, v in batch_cpu.items()}
            with ctx.autocast():
                out = model(batch["input_ids"], batch["position_ids"], batch["doc_ids"], logits=False)
                mtp_here = None if mtp_cpu is None else [(t.to(dev), w.to(dev), n) for t, w, n in mtp_cpu]
                loss, parts = compute_loss(out, batch["labels"], batch["loss_mask"], cfg.routing, step, n_lm,
                                           mtp_here)
            torch.autograd.backward(loss * weight)
            c = out.expert_counts.detach() * (1 if n_valid else 0)
            counts = c if counts is None else counts + c
            for k, v in parts.items():
                parts_sum[k] = parts_sum.get(k, 0.0) + v * weight
        tokens = cfg.data.micro_batch_size * n_micro * seq_len * dp
        return Outcome(parts_sum, counts, total_valid, tokens, seq_len, gbatch)

    def state_dict(self) -> dict[str, Any]:
        """The loader's position."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the loader where the checkpoint left it."""
        self.loader.load_state_dict(state)

    def summary(self) -> dict[str, Any]:
        """SFT runs: the samples kept whole, truncated and dropped."""
        return {"sftSamples": dict(self.loader.counts)} if isinstance(self.loader, SampleLoader) else {}

    def summary_line(self) -> str:
        """Nothing beyond loss and MFU."""
        return ""

    def close(self) -> None:
        """The loader holds nothing to release."""
