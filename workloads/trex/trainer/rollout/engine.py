"""In-process rollouts: batched KV-cache decoding of a DeepSeekModel with a token-level write-ahead log.

``generate`` prefills each distinct prompt once (G samples of one prompt share it), then decodes one
token per live sample per step, dropping finished samples from the batch. With a RolloutLog every
sampled token is logged before the next step; a rerun with the same log (after SIGTERM or SIGKILL)
takes the logged tokens as they are, re-prefills prompt + logged tokens and continues with the
remaining length budget. Tokens depend only on the logits and (seed, sample id, position), so the
continuation draws what the uninterrupted run drew: interruption does not bias which samples finish.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch

from trex.trainer.model.model import DeepSeekModel
from trex.trainer.rollout.cache import DecodeCache
from trex.trainer.rollout.sampling import SamplingParams, sample, uniform
from trex.trainer.rollout.wal import LoggedSample, Record, RolloutLog

FinishReason = Literal["stop", "length"]


@dataclass
class Rollout:
    """One sample's response: tokens with their behaviour log-probs and the policy version that drew
    each one. ``stale`` marks tokens drawn by an older policy than ``policy_version`` (the version of
    the run that finished the sample), for the loss to mask. ``resumed``: tokens read from the log."""

    sample_id: int
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    policy_version: int = 0
    finish_reason: FinishReason | None = None
    resumed: int = 0

    @property
    def stale(self) -> list[bool]:
        """Per token: drawn by an older policy version."""
        return [v != self.policy_version for v in self.versions]


def log_header(prompts: Sequence[Sequence[int]], sample_ids: Sequence[int], params: SamplingParams,
               seed: int) -> dict[str, object]:
    """What identifies a rollout in its log (the policy version may change across restarts)."""
    digest = hashlib.sha256(json.dumps([list(p) for p in prompts]).encode()).hexdigest()
    sampling = asdict(params)
    sampling["stop_tokens"] = list(params.stop_tokens)
    return {"seed": seed, "sampling": sampling, "sample_ids": list(sample_ids), "prompts_sha256": digest}


def length_budget(params: SamplingParams, prompt_len: int, done: int, max_seq_len: int) -> int:
    """Tokens a sample may still generate: max_new_tokens less those already logged, capped by the
    model's context (prompt + response <= max_seq_len)."""
    return max(0, min(params.max_new_tokens - done, max_seq_len - prompt_len - done))


def finish_reason(tokens: Sequence[int], budget_left: int, params: SamplingParams) -> FinishReason | None:
    """Why a response has ended (None: it goes on)."""
    if tokens and tokens[-1] in params.stop_tokens:
        return "stop"
    return "length" if budget_left <= 0 else None


def _check(model: DeepSeekModel, prompts: Sequence[Sequence[int]], ids: Sequence[int],
           params: SamplingParams) -> None:
    vocab = model.args.vocab_size
    if len(ids) != len(prompts):
        raise ValueError(f"sample_ids has {len(ids)} entries for {len(prompts)} prompts")
    if len(set(ids)) != len(ids):
        raise ValueError("sample_ids must be distinct")
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompts[{i}] is empty")
        if min(p) < 0 or max(p) >= vocab:
            raise ValueError(f"prompts[{i}] has a token outside the vocabulary [0, {vocab})")
    if any(t >= vocab for t in params.stop_tokens):
        raise ValueError(f"stop_tokens has a token outside the vocabulary [0, {vocab})")


def _prefill(model: DeepSeekModel, contexts: list[list[int]], capacity: int,
             device: torch.device) -> tuple[DecodeCache, torch.Tensor]:
    """A cache over the contexts (each distinct context prefilled once) and each row's next-token logits."""
    distinct: dict[tuple[int, ...], int] = {}
    for c in contexts:
        distinct.setdefault(tuple(c), len(distinct))
    caches, last = [], []
    for ctx in distinct:
        cache = DecodeCache.empty(1, capacity, device)
        out = model(torch.tensor([ctx], device=device), cache=cache)
        assert out.logits is not None
        caches.append(cache)
        last.append(out.logits[:, -1])
    rows = torch.tensor([distinct[tuple(c)] for c in contexts], device=device)
    return DecodeCache.cat(caches).select(rows), torch.cat(last)[rows]


@torch.no_grad()
def generate(model: DeepSeekModel, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int, *,
             sample_ids: Sequence[int] | None = None, policy_version: int = 0, wal: RolloutLog | None = None,
             on_step: Callable[[int], None] | None = None) -> list[Rollout]:
    """Sample one response per prompt (repeat a prompt for G samples) with the model as it is now.

    sample_ids (default 0..N-1) key the sampling draws and the log; policy_version tags every token
    drawn in this call. With ``wal``, logged tokens are reused and new ones logged. on_step(step) runs
    after each decode step's tokens are logged. Returns the rollouts in prompt order."""
    ids = list(range(len(prompts))) if sample_ids is None else list(sample_ids)
    _check(model, prompts, ids, params)
    logged: dict[int, LoggedSample] = {}
    if wal is not None:
        logged = wal.open(log_header(prompts, ids, params, seed))
    try:
        return _generate(model, prompts, params, seed, ids, policy_version, wal, logged, on_step)
    finally:
        if wal is not None:
            wal.close()


def _generate(model: DeepSeekModel, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int,
              ids: list[int], version: int, wal: RolloutLog | None, logged: dict[int, LoggedSample],
              on_step: Callable[[int], None] | None) -> list[Rollout]:
    max_seq = model.args.max_seq_len
    rollouts: list[Rollout] = []
    for sid, prompt in zip(ids, prompts, strict=True):
        prior = logged.get(sid, LoggedSample())
        r = Rollout(sample_id=sid, prompt=list(prompt), tokens=list(prior.tokens), logprobs=list(prior.logprobs),
                    versions=list(prior.versions), policy_version=version, resumed=len(prior.tokens))
        budget = length_budget(params, len(prompt), len(r.tokens), max_seq)
        if len(r.tokens) > params.max_new_tokens:
            raise ValueError(f"the log holds {len(r.tokens)} tokens for sample {sid}, over max_new_tokens")
        r.finish_reason = finish_reason(r.tokens, budget, params)
        rollouts.append(r)
    live = [i for i, r in enumerate(rollouts) if r.finish_reason is None]
    if not live:
        return rollouts
    was_training = model.training
    model.eval()
    device = model.embed_tokens.weight.device
    try:
        contexts = [rollouts[i].prompt + rollouts[i].tokens for i in live]
        capacity = max(len(c) + length_budget(params, len(rollouts[i].prompt), len(rollouts[i].tokens), max_seq)
                       for c, i in zip(contexts, live, strict=True))
        cache, logits = _prefill(model, contexts, capacity, device)
        step = 0
        while live:
            draws = [uniform(seed, rollouts[i].sample_id, len(rollouts[i].tokens)) for i in live]
            tokens, logps = sample(logits, params, draws)
            records = []
            for i, tok, lp in zip(live, tokens.tolist(), logps.tolist(), strict=True):
                r = rollouts[i]
                records.append(Record(r.sample_id, version, len(r.tokens), tok, lp))
                r.tokens.append(tok)
                r.logprobs.append(lp)
                r.versions.append(version)
                r.finish_reason = finish_reason(
                    r.tokens, length_budget(params, len(r.prompt), len(r.tokens), max_seq), params)
            if wal is not None:
                wal.append(records)
            step += 1
            if on_step is not None:
                on_step(step)
            keep = [k for k, i in enumerate(live) if rollouts[i].finish_reason is None]
            if not keep:
                break
            if len(keep) < len(live):
                index = torch.tensor(keep, device=device)
                cache, tokens = cache.select(index), tokens[index]
                live = [live[k] for k in keep]
            out = model(tokens[:, None], cache=cache)
            assert out.logits is not None
            logits = out.logits[:, -1]
    finally:
        model.train(was_training)
    return rollouts
