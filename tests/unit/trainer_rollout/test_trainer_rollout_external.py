"""External rollouts through ChatClient against a scripted OpenAI-compatible server: logprobs requested
and parsed, token ids read from vLLM's token_id:<id> texts, per-sample seeds, version tags, bad bodies."""

from __future__ import annotations

from typing import Any

import pytest
from scripted_openai import ScriptedOpenAI, completion_body
from trex.llm import ChatClient, ChatError
from trex.trainer.rollout.external import generate_external, request_seed, token_ids


def _answer(req: dict[str, Any]) -> tuple[int, Any]:
    n = int(req["messages"][0]["content"])
    body = completion_body(req, "x" * n)
    body["choices"][0]["logprobs"] = {"content": [{"token": f"token_id:{100 + i}", "logprob": -0.5 * i,
                                                   "top_logprobs": []} for i in range(n)]}
    return 200, body


async def test_logprobs_token_ids_seeds_and_versions() -> None:
    async with ScriptedOpenAI(_answer) as srv:
        client = ChatClient(srv.url, "policy", logprobs=True, temperature=1.0,
                            extra_body={"return_tokens_as_token_ids": True})
        async with client:
            out = await generate_external(client, [[{"role": "user", "content": "3"}],
                                                   [{"role": "user", "content": "1"}]],
                                          seed=9, policy_version=4, sample_ids=[7, 8])
    assert [r.tokens for r in out] == [[100, 101, 102], [100]]
    assert out[0].logprobs == [0.0, -0.5, -1.0] and out[0].policy_version == 4 and out[0].text == "xxx"
    assert [b["seed"] for b in srv.requests] == [request_seed(9, 7), request_seed(9, 8)]
    assert all(b["logprobs"] is True and b["return_tokens_as_token_ids"] is True for b in srv.requests)
    assert request_seed(9, 7) != request_seed(9, 8) and 0 <= request_seed(9, 7) < 2**31


def test_token_ids_need_every_token() -> None:
    assert token_ids(["token_id:5", "token_id:6"]) == [5, 6]
    assert token_ids(["token_id:5", "hello"]) is None


async def test_missing_logprobs_and_client_without_them() -> None:
    async with ScriptedOpenAI(lambda req: "no logprobs here") as srv:
        async with ChatClient(srv.url, "policy", logprobs=True, retries=0) as client:
            with pytest.raises(ChatError, match=r"logprobs\.content"):
                await generate_external(client, [[{"role": "user", "content": "1"}]], seed=0, policy_version=0)
        with pytest.raises(ValueError, match="logprobs=True"):
            await generate_external(ChatClient(srv.url, "policy"), [[{"role": "user", "content": "1"}]], seed=0,
                                    policy_version=0)
