"""trex.llm.ChatClient against a scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from helpers.scripted_openai import ScriptedOpenAI
from trex.llm import ChatClient, ChatError, ChatTimeout
from trex.llm.client import backoff_delay, chat_endpoint

MSG = [{"role": "user", "content": "two words"}]


async def test_pinned_sampling_and_usage() -> None:
    async with ScriptedOpenAI(lambda req: "alpha beta gamma") as srv:
        client = ChatClient(srv.url, "m1", api_key="k", seed=7, temperature=0.3, top_p=0.9, max_tokens=99)
        async with client:
            res = await client.complete(MSG)
    assert res.text == "alpha beta gamma"
    assert res.usage.prompt_tokens == 2 and res.usage.completion_tokens == 3
    assert res.finish_reason == "stop" and res.attempts == 1
    body = srv.requests[0]
    assert body["model"] == "m1" and body["seed"] == 7
    assert body["temperature"] == 0.3 and body["top_p"] == 0.9 and body["max_tokens"] == 99
    assert body["messages"] == MSG


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_retries_transient_statuses(status: int) -> None:
    calls: list[int] = []

    def handler(req: dict[str, Any]) -> Any:
        calls.append(1)
        return (status, {"error": "busy"}) if len(calls) < 3 else "ok"

    async with ScriptedOpenAI(handler) as srv:
        async with ChatClient(srv.url, "m", retries=3, backoff_s=0.001) as client:
            res = await client.complete(MSG)
    assert res.text == "ok" and res.attempts == 3 and len(calls) == 3


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_client_errors_are_not_retried(status: int) -> None:
    async with ScriptedOpenAI(lambda req: (status, {"error": "bad"})) as srv:
        async with ChatClient(srv.url, "m", retries=5, backoff_s=0.001) as client:
            with pytest.raises(ChatError) as ei:
                await client.complete(MSG)
    assert ei.value.status == status and not ei.value.retryable
    assert len(srv.requests) == 1


async def test_gives_up_after_retries() -> None:
    async with ScriptedOpenAI(lambda req: (502, "bad gateway")) as srv:
        async with ChatClient(srv.url, "m", retries=2, backoff_s=0.001) as client:
            with pytest.raises(ChatError, match="gave up after 3 attempts"):
                await client.complete(MSG)
    assert len(srv.requests) == 3


async def test_connection_error_is_retried_then_raised() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with ChatClient(f"http://127.0.0.1:{port}/v1", "m", retries=2, backoff_s=0.001) as client:
        with pytest.raises(ChatError, match=r"connection error.*gave up after 3 attempts"):
            await client.complete(MSG)


async def test_timeout_raises_without_retry() -> None:
    async def slow(req: dict[str, Any]) -> str:
        await asyncio.sleep(1.0)
        return "late"

    async with ScriptedOpenAI(slow) as srv:
        async with ChatClient(srv.url, "m", timeout_s=0.2, retries=3, backoff_s=0.001) as client:
            with pytest.raises(ChatTimeout):
                await client.complete(MSG)
    assert len(srv.requests) == 1


async def test_concurrency_is_bounded() -> None:
    state = {"now": 0, "max": 0}

    async def handler(req: dict[str, Any]) -> str:
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.05)
        state["now"] -= 1
        return "x"

    async with ScriptedOpenAI(handler) as srv:
        async with ChatClient(srv.url, "m", concurrency=2) as client:
            res = await asyncio.gather(*(client.complete(MSG) for _ in range(7)))
    assert len(res) == 7 and state["max"] == 2


def test_sync_wrapper_and_seed_override() -> None:
    with ScriptedOpenAI(lambda req: f"seed={req['seed']}") as srv:
        client = ChatClient(srv.url, "m", seed=1)
        assert client.complete_sync(MSG).text == "seed=1"
        assert client.complete_sync(MSG, seed=5).text == "seed=5"


def test_malformed_body_is_an_error() -> None:
    with ScriptedOpenAI(lambda req: (200, {"nothing": 1})) as srv:
        with pytest.raises(ChatError, match="no choices"):
            ChatClient(srv.url, "m").complete_sync(MSG)


def test_backoff_and_endpoint_rules() -> None:
    import random

    rng = random.Random(0)
    for attempt in range(6):
        d = backoff_delay(attempt, 0.5, 10.0, rng)
        assert 0.25 * 2**attempt <= d <= min(10.0, 0.75 * 2**attempt + 1e-12) or d == 10.0
    assert chat_endpoint("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_endpoint("http://h:1/v1/chat/completions") == "http://h:1/v1/chat/completions"
    with pytest.raises(ValueError, match="model"):
        ChatClient("http://h/v1", "")
