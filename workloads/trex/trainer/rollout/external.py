"""Rollouts from an external OpenAI-compatible server (vLLM, SGLang) through trex.llm.ChatClient.

Each sample is one chat completion with a seed derived from (seed, sample id), requested with
``logprobs`` so every generated token comes back with its behaviour log-prob; every token is tagged
with the policy version the caller states the server holds (the OpenAI API does not report one).
Token ids come back when the server writes them into the token text (vLLM's
``return_tokens_as_token_ids`` request field, passed through the client's ``extra_body``).

Weights are not pushed from here: ``rollout.engine: vllm`` (trex.trainer.rollout.vllm_engine) samples through
vLLM's completions endpoint with token-id prompts and pushes the trainer's weights after every optimizer step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from trex.llm import ChatClient
from trex.llm.client import Message
from trex.trainer.rollout.sampling import uniform

_TOKEN_ID = "token_id:"


@dataclass
class ExternalRollout:
    """One sample from the server: text, per-token texts and log-probs, token ids when reported."""

    sample_id: int
    text: str
    token_texts: list[str]
    logprobs: list[float]
    tokens: list[int] | None
    policy_version: int
    finish_reason: str | None


def token_ids(texts: Sequence[str]) -> list[int] | None:
    """Ids from ``token_id:<id>`` token texts; None unless every token carries one."""
    ids = []
    for t in texts:
        if not t.startswith(_TOKEN_ID) or not t[len(_TOKEN_ID):].isdigit():
            return None
        ids.append(int(t[len(_TOKEN_ID):]))
    return ids


def request_seed(seed: int, sample_id: int) -> int:
    """The per-sample server seed (31 bits, what every server accepts)."""
    return int(uniform(seed, sample_id, -1) * 2**31)


async def generate_external(client: ChatClient, conversations: Sequence[Sequence[Message]], *, seed: int,
                            policy_version: int, sample_ids: Sequence[int] | None = None) -> list[ExternalRollout]:
    """One completion per conversation (concurrency bounded by the client), in order."""
    if not client.logprobs:
        raise ValueError("the ChatClient must be built with logprobs=True (rollouts need behaviour log-probs)")
    ids = list(range(len(conversations))) if sample_ids is None else list(sample_ids)
    if len(ids) != len(conversations) or len(set(ids)) != len(ids):
        raise ValueError("sample_ids must be distinct, one per conversation")
    results = await asyncio.gather(*(client.complete(msgs, seed=request_seed(seed, sid))
                                     for sid, msgs in zip(ids, conversations, strict=True)))
    return [ExternalRollout(sample_id=sid, text=r.text, token_texts=[t.token for t in r.logprobs],
                            logprobs=[t.logprob for t in r.logprobs],
                            tokens=token_ids([t.token for t in r.logprobs]), policy_version=policy_version,
                            finish_reason=r.finish_reason)
            for sid, r in zip(ids, results, strict=True)]
