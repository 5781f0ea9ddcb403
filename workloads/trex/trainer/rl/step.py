"""One GRPO step's rollout -> verify -> backward, on the trainer's model (the loop does clipping, the optimizer
step, checkpoints and metrics, as for every mode).

Per step: the step's prompts (:class:`~trex.trainer.rl.prompts.PromptOrder`, this rank's slice), G samples each
from the model as it is now through the rollout engine with a token write-ahead log under the checkpoint
folder (a preempted step re-prefills what was logged and continues); the responses decoded and scored by the
verifier in parallel workers; group-normalised advantages; then micro-batches of prompt + response through the
model (and the frozen reference, when the KL coefficient is not 0) and :func:`~trex.trainer.rl.grpo.grpo_loss`,
each micro-batch weighted by its share of the global batch's valid response tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import nn

from trex.prompt_contract import END, EOS, PAD
from trex.trainer.config import TrainerConfig
from trex.trainer.parallel.decode import shared_over
from trex.trainer.rl.grpo import group_advantages, grpo_loss, linear_token_logprobs
from trex.trainer.rl.mismatch import Mismatch, tis_correction
from trex.trainer.rl.prompts import PromptCache, PromptOrder
from trex.trainer.rl.reward import OUTCOMES as VERIFIER_OUTCOMES
from trex.trainer.rl.reward import ORVerifier, Reward, RewardWeights, Verifier
from trex.trainer.rollout.engine import Rollout, generate
from trex.trainer.rollout.sampling import SamplingParams
from trex.trainer.rollout.steplog import StepLogs, log_name
from trex.verify.items import Item

OUTCOMES = VERIFIER_OUTCOMES
"""Verifier outcome categories counted per step (summed over ranks by name; others are not counted)."""


@dataclass
class GRPOStats:
    """What one GRPO step logs (summed over data-parallel ranks where it is a count)."""

    reward_mean: float = 0.0
    reward_std: float = 0.0
    kl: float = 0.0
    clip_fraction: float = 0.0
    response_length: float = 0.0
    """Mean response tokens."""
    responses: int = 0
    truncated: int = 0
    """Responses cut by the length budget (no stop token)."""
    resumed_tokens: int = 0
    """Tokens taken from the rollout log instead of decoded (a resumed step)."""
    valid_tokens: int = 0
    """Response tokens the loss averaged over (stale ones excluded)."""
    forward_tokens: int = 0
    """Prompt and response tokens through the model in the loss."""
    outcomes: dict[str, int] = field(default_factory=dict)
    """Verifier outcome counts (correct, wrong_objective, no_solver_call, no_code, ...)."""
    rollout_seconds: float = 0.0
    verify_seconds: float = 0.0
    train_seconds: float = 0.0
    """Forward and backward of the loss (reference pass included)."""


@dataclass(frozen=True)
class Batch:
    """Prompt + response rows right-padded to one length; targets, behaviour log-probs and masks per position
    (position t holds what predicts token t + 1)."""

    input_ids: torch.Tensor
    targets: torch.Tensor
    old_logp: torch.Tensor
    mask: torch.Tensor
    stale: torch.Tensor


def pack(rollouts: Sequence[Rollout], pad: int) -> Batch:
    """The rows of ``rollouts`` as tensors (CPU)."""
    length = max(len(r.prompt) + len(r.tokens) for r in rollouts)
    n = len(rollouts)
    ids = torch.full((n, length), pad, dtype=torch.long)
    targets = torch.full((n, length), pad, dtype=torch.long)
    old = torch.zeros(n, length, dtype=torch.float64)
    mask = torch.zeros(n, length, dtype=torch.bool)
    stale = torch.zeros(n, length, dtype=torch.bool)
    for i, r in enumerate(rollouts):
        seq = r.prompt + r.tokens
        ids[i, :len(seq)] = torch.tensor(seq)
        p, k = len(r.prompt), len(r.tokens)
        if k == 0:
            continue
        targets[i, p - 1:p - 1 + k] = torch.tensor(r.tokens)
        old[i, p - 1:p - 1 + k] = torch.tensor(r.logprobs, dtype=torch.float64)
        mask[i, p - 1:p - 1 + k] = True
        stale[i, p - 1:p - 1 + k] = torch.tensor(r.stale)
    return Batch(ids, targets, old, mask, stale)


def output_logprobs(out: Any, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs [B, T] of ``targets`` under a ``logits=False`` forward's head at ``temperature``, fused and chunked
    over the vocabulary (trex.trainer.rl.grpo.linear_token_logprobs: no [B, T, V] logits)."""
    if out.hidden is None or out.head_weight is None:
        raise ValueError("the forward must run with logits=False (hidden states and head weight)")
    return linear_token_logprobs(out.hidden, out.head_weight, targets, temperature)


def sampled_logprobs(model: Any, ids: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs [B, T] of ``targets`` after ``ids`` under ``model``'s trunk (MTP modules skipped: the loss reads
    the trunk's head only)."""
    return output_logprobs(model(ids, logits=False, mtp=False), targets, temperature)


def reshard(model: Any) -> None:
    """Free a frozen FSDP2 model's gathered root parameters after a forward (the root keeps them gathered for a
    backward that a frozen model never runs); nothing for a plain model."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.reshard()


def response_text(tok: Tokenizer, r: Rollout, stop_tokens: Sequence[int]) -> str:
    """The decoded response without its stop token."""
    body = r.tokens[:-1] if r.tokens and r.tokens[-1] in stop_tokens else r.tokens
    return str(tok.decode(body, skip_special_tokens=False))


def stop_tokens_of(tok: Tokenizer) -> tuple[int, ...]:
    """The tokens that end an assistant turn in the chat layout (<|end|> and <|eos|>, those the tokenizer has)."""
    ids = (tok.token_to_id(END), tok.token_to_id(EOS))
    return tuple(sorted({int(i) for i in ids if i is not None}))


class GRPORun:
    """The rollout, verification and loss side of mode grpo for one rank (``dp_rank`` of ``dp``)."""

    def __init__(self, cfg: TrainerConfig, tokenizer: Tokenizer, items: Sequence[Item], verifier: Verifier,
                 wal_dir: Path, dp_rank: int = 0, dp: int = 1,
                 sum_over_ranks: Callable[[list[float]], list[float]] = lambda v: v, tp_group: Any = None) -> None:
        g = cfg.grpo
        if g.prompts_per_step % dp:
            raise ValueError(f"grpo.promptsPerStep: {g.prompts_per_step} is not a multiple of dp = {dp}")
        self.cfg, self.tok, self.items, self.verifier = cfg, tokenizer, list(items), verifier
        self.dp_rank, self.dp, self.sum = dp_rank, dp, sum_over_ranks
        self.tp_group = tp_group
        """The tp ranks of this data-parallel rank (same prompts): they split its decoding and verification."""
        self.logs = StepLogs(wal_dir, log_name(dp_rank, tp_group), g.wal_fsync_every)
        """This rank's per-step rollout logs."""
        self.order = PromptOrder(len(self.items), cfg.data.seed)
        self.stop = stop_tokens_of(tokenizer)
        self.params = SamplingParams(temperature=g.temperature, top_p=g.top_p, top_k=g.top_k,
                                     max_new_tokens=g.max_new_tokens, stop_tokens=self.stop)
        pad = tokenizer.token_to_id(PAD)
        self.pad = 0 if pad is None else int(pad)
        self.mismatch = Mismatch()
        """The current step's engine-vs-trainer log-prob mismatch (reset by each rollout)."""
        self.engine: Any = None
        """The external rollout engine (a VLLMRollouts; None: in process)."""
        self.prompt = PromptCache(tokenizer, self.items, g.prompt_format, g.prompt_set, cfg.data.reasoning_mode,
                                  cfg.data.think_max_prompt)
        """Prompt tokens of item i (encoded once)."""

    def my_prompts(self, step: int) -> list[tuple[int, int]]:
        """(position in the step's global prompt list, item index) of this rank's prompts at ``step``."""
        every = self.order.at(step, self.cfg.grpo.prompts_per_step)
        per_rank = len(every) // self.dp
        start = self.dp_rank * per_rank
        return list(enumerate(every))[start:start + per_rank]

    def rollout(self, model: Any, step: int) -> tuple[list[Rollout], list[Item]]:
        """G samples per prompt of this rank at ``step`` (policy version = step), logged token by token; logs of
        other steps are removed first (a rerun of a step regenerates what they held, draw for draw)."""
        g = self.cfg.grpo.group_size
        mine = self.my_prompts(step)
        prompts = [self.prompt(i) for _, i in mine for _ in range(g)]
        ids = [(step * self.cfg.grpo.prompts_per_step + pos) * g + k for pos, _ in mine for k in range(g)]
        self.logs.prune(step)
        self.mismatch = Mismatch()
        if self.engine is not None:
            return (self.engine.engine.generate(prompts, self.params, self.cfg.seed, sample_ids=ids,
                                                max_seq_len=self.engine.max_seq_len, wal=self.logs.for_step(step)),
                    [self.items[i] for _, i in mine for _ in range(g)])

        def decode(part: list[tuple[list[int], int]]) -> list[Rollout]:
            return generate(model, [p for p, _ in part], self.params, self.cfg.seed, sample_ids=[i for _, i in part],
                            policy_version=step, wal=self.logs.for_step(step))

        rollouts = shared_over(self.tp_group, list(zip(prompts, ids, strict=True)), decode)
        return rollouts, [self.items[i] for _, i in mine for _ in range(g)]

    def score(self, rollouts: Sequence[Rollout], items: Sequence[Item]) -> list[Reward]:
        """The verifier's rewards, in order; a response repeated for the same item (common once a group agrees)
        is verified once (under tp, by one of the tp ranks)."""
        texts = [response_text(self.tok, r, self.stop) for r in rollouts]
        first: dict[tuple[str, str], int] = {}
        for t, it in zip(texts, items, strict=True):
            first.setdefault((t, it.id), len(first))
        distinct = list(first)
        by_id = {it.id: it for it in items}
        scored = shared_over(self.tp_group, distinct, lambda part: asyncio.run(
            self.verifier.score([t for t, _ in part], [by_id[i] for _, i in part])) if part else [])
        return [scored[first[(t, it.id)]] for t, it in zip(texts, items, strict=True)]

    def backward(self, model: Any, reference: nn.Module | None, rollouts: Sequence[Rollout],
                 rewards: Sequence[Reward], device: torch.device,
                 autocast: Callable[[], contextlib.AbstractContextManager[Any]]) -> tuple[
                     dict[str, float], torch.Tensor | None, dict[str, float]]:
        """Backward of the GRPO loss over this rank's responses (gradients accumulate in ``model``). Returns this
        rank's share of the loss and of its KL and clip fraction (weighted to the global token mean: they sum to it
        over ranks) and the summed expert counts."""
        g, mb = self.cfg.grpo, self.cfg.data.micro_batch_size
        r = torch.tensor([x.total for x in rewards], dtype=torch.float64).reshape(-1, g.group_size)
        adv = group_advantages(r).reshape(-1)
        stale = sum(sum(x.stale) for x in rollouts)
        valid = sum(len(x.tokens) for x in rollouts) - stale
        total = self.sum([float(valid)])[0]
        parts = {"grpo": 0.0, "kl": 0.0, "clip_fraction": 0.0}
        counts: torch.Tensor | None = None
        if total == 0:
            return {"grpo": 0.0}, counts, parts
        temperature = g.temperature
        for start in range(0, len(rollouts), mb):
            chunk = rollouts[start:start + mb]
            batch = pack(chunk, self.pad)
            n = int((batch.mask & ~batch.stale).sum())
            if n == 0 and self.dp == 1:
                continue
            ids, targets = batch.input_ids.to(device), batch.targets.to(device)
            ref_logp = None
            if reference is not None and g.kl_coef > 0:
                with torch.no_grad(), autocast():
                    ref_logp = sampled_logprobs(reference, ids, targets, temperature).double()
                reshard(reference)
            with autocast():
                out = model(ids, logits=False, mtp=False)
                logp = output_logprobs(out, targets, temperature).double()
            mask, st = batch.mask.to(device), batch.stale.to(device)
            if n == 0:  # across ranks the forward and backward still run: they hold collectives
                loss = logp.sum() * 0.0
                stats = {"grpo": 0.0, "kl": 0.0, "clip_fraction": 0.0}
            else:
                old, weights = self.behaviour(logp, batch.old_logp.to(device), mask & ~st)
                res = grpo_loss(logp, old, ref_logp, adv[start:start + mb].to(device), mask, stale=st,
                                clip_eps=g.clip_eps, clip_eps_high=g.clip_eps_high, kl_coef=g.kl_coef,
                                token_weights=weights)
                loss = res.loss
                stats = {"grpo": float(res.loss.detach()), "kl": float(res.kl), "clip_fraction": float(res.clip_fraction)}
            weight = n / total
            torch.autograd.backward(loss * weight)
            c = out.expert_counts.detach()
            counts = c if counts is None else counts + c
            for k, v in stats.items():
                parts[k] += v * weight
        return {"grpo": parts["grpo"]}, counts, parts

    def behaviour(self, logp: torch.Tensor, rollout_logp: torch.Tensor,
                  valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The old log-probs of the PPO ratio and the per-token loss weights: with an external engine the mismatch
        of its log-probs to the trainer's is counted (self.mismatch) and, with rollout.tisCap, corrected by
        truncated importance sampling; otherwise the rollout's log-probs as they are."""
        if self.cfg.rollout.engine == "inprocess":
            return rollout_logp, None
        self.mismatch.add(logp, rollout_logp, valid)
        if self.cfg.rollout.tis_cap is None:
            return rollout_logp, None
        return tis_correction(logp, rollout_logp, self.cfg.rollout.tis_cap)

    def stats(self, rollouts: Sequence[Rollout], rewards: Sequence[Reward], loss_stats: dict[str, float],
              seconds: tuple[float, float, float]) -> GRPOStats:
        """The step's statistics over every data-parallel rank."""
        n = len(rewards)
        tot = sum(x.total for x in rewards)
        sq = sum(x.total ** 2 for x in rewards)
        length = sum(len(x.tokens) for x in rollouts)
        cut = sum(1 for x in rollouts if x.finish_reason == "length")
        resumed = sum(x.resumed for x in rollouts)
        valid = length - sum(sum(x.stale) for x in rollouts)
        forward = length + sum(len(x.prompt) for x in rollouts)
        outcomes = Counter(x.outcome for x in rewards)
        names = sorted(OUTCOMES)
        summed = self.sum([float(n), tot, sq, float(length), float(cut), float(resumed), loss_stats["kl"],
                           loss_stats["clip_fraction"], float(valid), float(forward),
                           *(float(outcomes.get(k, 0)) for k in names)])
        n_all = max(summed[0], 1.0)
        mean = summed[1] / n_all
        var = max(summed[2] / n_all - mean * mean, 0.0)
        return GRPOStats(
            reward_mean=mean, reward_std=var ** 0.5, kl=summed[6], clip_fraction=summed[7],
            response_length=summed[3] / n_all, responses=int(summed[0]), truncated=int(summed[4]),
            resumed_tokens=int(summed[5]), valid_tokens=int(summed[8]), forward_tokens=int(summed[9]),
            outcomes={k: int(v) for k, v in zip(names, summed[10:], strict=True) if v},
            rollout_seconds=seconds[0], verify_seconds=seconds[1], train_seconds=seconds[2])


def default_verifier(cfg: TrainerConfig) -> Verifier:
    """The OR verifier grpo's config describes (weights, protocol, reasoning mode, workers, limits)."""
    g = cfg.grpo
    w = RewardWeights(format=g.reward.format, execution=g.reward.execution, objective=g.reward.objective)
    return ORVerifier(w, protocol=g.protocol, reasoning_mode=cfg.data.reasoning_mode,
                      workers=g.verifier_workers or None, timeout_s=g.verifier_timeout_s,
                      structure=g.reward.structure, import_gate=g.reward.import_gate)


def summary(steps: Sequence[GRPOStats]) -> dict[str, Any]:
    """The termination summary's ``grpo`` object: rewards at the first and last step, responses and verifier
    outcomes over the run, and the run's time split between rollouts, verification and the loss."""
    outcomes: Counter[str] = Counter()
    for s in steps:
        outcomes.update(s.outcomes)
    return {"steps": len(steps), "rewardMeanFirst": round(steps[0].reward_mean, 6),
            "rewardMeanLast": round(steps[-1].reward_mean, 6), "responses": sum(s.responses for s in steps),
            "outcomes": dict(sorted(outcomes.items())),
            "rolloutSeconds": round(sum(s.rollout_seconds for s in steps), 3),
            "verifySeconds": round(sum(s.verify_seconds for s in steps), 3),
            "trainSeconds": round(sum(s.train_seconds for s in steps), 3)}
