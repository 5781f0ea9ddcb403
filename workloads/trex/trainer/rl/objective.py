"""Mode grpo: rollouts of the step's prompts with the current weights, their verified rewards and the backward of
the GRPO loss (trex.trainer.rl.step), against a frozen reference policy, distributed like the student, when the KL
coefficient is not 0."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import nn

from trex.runtime.device import torch_dtype
from trex.trainer.config import TrainerConfig
from trex.trainer.hf import load_hf_into, load_hf_sharded
from trex.trainer.model import build_model
from trex.trainer.objective import Outcome, RunContext, Series
from trex.trainer.parallel.decode import DecodeReplica, decoding
from trex.trainer.parallel.mesh import Meshes, ParallelDims
from trex.trainer.rl.reward import Verifier
from trex.trainer.rl.step import GRPORun, GRPOStats, summary
from trex.trainer.rollout.steplog import WAL_DIR
from trex.trainer.rollout.vllm_engine import push_for_step, rollout_outcome, run_engine
from trex.verify.items import Item


def grpo_record(st: GRPOStats) -> dict[str, float]:
    """A GRPO step's gauges (trex_train_<name>) and JSONL fields."""
    return {"reward_mean": st.reward_mean, "reward_std": st.reward_std, "kl": st.kl,
            "clip_fraction": st.clip_fraction, "response_length": st.response_length,
            "rollout_seconds": st.rollout_seconds, "verify_seconds": st.verify_seconds,
            "rl_train_seconds": st.train_seconds}


def build_reference(cfg: TrainerConfig, device: torch.device, dims: ParallelDims,
                    meshes: Meshes | None) -> nn.Module | None:
    """GRPO's frozen reference policy, or None when grpo.klCoef is 0 (nothing reads it): the run's initial weights
    (its seed's initialisation, or checkpoint.initFromHf), rebuilt on every start so a resumed run keeps the same
    reference. Under a parallel layout it is distributed as the student is (tensor and expert parallelism, FSDP2
    shards materialised shard by shard, HF weights read slice by slice): no rank holds it whole. It is stored in the
    model dtype (no fp32 masters), without gradients or optimizer."""
    if cfg.grpo.kl_coef <= 0:
        return None
    dtype = torch_dtype(cfg.model.dtype)
    source = cfg.checkpoint.init_from_hf
    if meshes is None:
        ref = build_model(cfg.model, device=device, dtype=dtype, seed=cfg.seed)
        if source:
            load_hf_into(ref, source)
    else:
        from trex.trainer.build import distributed_model

        ref, _ = distributed_model(cfg.model.args, dims, meshes, dtype, device, cfg.seed, frozen=True)
        if source:
            load_hf_sharded(ref, source)
    ref.requires_grad_(False)
    return ref.eval()


class GRPOObjective:
    """Group-relative policy optimisation against the OR verifier (or the ``verifier`` given)."""

    loss_key = "grpo"
    watch_spikes = False
    """A policy-gradient loss moves with the rewards: no spike detection."""

    def __init__(self, ctx: RunContext, tokenizer: Tokenizer, items: Sequence[Item], verifier: Verifier,
                 replica: DecodeReplica | None, tp_group: Any) -> None:
        self.ctx, self.tokenizer, self.replica = ctx, tokenizer, replica
        self.run = GRPORun(ctx.cfg, tokenizer, items, verifier, ctx.ckpt_dir / WAL_DIR, ctx.dp_rank, ctx.dims.dp,
                           ctx.sum_over_ranks, tp_group)
        self.engine = run_engine(ctx)
        self.run.engine = self.engine
        self.reference: nn.Module | None = None
        self.steps: list[GRPOStats] = []
        """Every step's statistics in this process (the termination summary)."""

    def notes(self) -> list[str]:
        """Nothing to say before the run."""
        return []

    def prepare(self) -> None:
        """The frozen reference policy when the loss has a KL term (none otherwise)."""
        ctx = self.ctx
        self.reference = build_reference(ctx.cfg, ctx.device, ctx.dims, ctx.meshes)

    def backward(self, model: nn.Module, step: int) -> Outcome:
        """Rollouts, rewards and the GRPO loss's backward of step ``step``."""
        run, ctx = self.run, self.ctx
        push = push_for_step(self.engine, ctx, step) if self.engine is not None else {}
        t0 = time.perf_counter()
        if self.engine is not None:
            rollouts, items = run.rollout(None, step)
        else:
            with decoding(model, self.replica) as m:
                rollouts, items = run.rollout(m, step)
        t1 = time.perf_counter()
        rewards = run.score(rollouts, items)
        t2 = time.perf_counter()
        parts, counts, loss_stats = run.backward(model, self.reference, rollouts, rewards, ctx.device, ctx.autocast)
        t3 = time.perf_counter()
        stats = run.stats(rollouts, rewards, loss_stats, (t1 - t0, t2 - t1, t3 - t2))
        self.steps.append(stats)
        seq_len = max(len(r.prompt) + len(r.tokens) for r in rollouts)
        metrics = {**grpo_record(stats), **push, **run.mismatch.metrics(ctx.cfg.rollout.mismatch_alert)}
        cut, cut_series = rollout_outcome(self.engine) if self.engine is not None else ({}, [])
        series = [Series(k, v) for k, v in metrics.items()] + cut_series
        metrics.update(cut)
        series += [Series("verifier_outcomes_total", n, {"outcome": o}, counter=True) for o, n in stats.outcomes.items()]
        return Outcome({**parts, "total": parts["grpo"]}, counts, float(stats.valid_tokens), stats.forward_tokens,
                       seq_len, stats.responses, metrics, series, {"verifier_outcomes": stats.outcomes}, stats)

    def state_dict(self) -> dict[str, Any]:
        """Nothing: the step number alone places the prompts, and the rollout logs sit beside the checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see state_dict)."""

    def summary(self) -> dict[str, Any]:
        """Rewards, responses, verifier outcomes and the time split of the steps run in this process."""
        return {"grpo": summary(self.steps)} if self.steps else {}

    def summary_line(self) -> str:
        """The reward's move over the run."""
        if not self.steps:
            return ""
        s = summary(self.steps)
        return f", reward {s['rewardMeanFirst']:.3f} -> {s['rewardMeanLast']:.3f}"

    def close(self) -> None:
        """The rollout logs stay for a resumed step; a server this run spawned stops."""
        if self.engine is not None:
            self.engine.close()
