"""Async client for OpenAI-compatible ``/chat/completions`` endpoints (vLLM, SGLang, TGI, OpenAI).

What callers can rely on:

* sampling is pinned per client (seed, temperature, top_p, max_tokens) and sent with every request;
* at most ``concurrency`` requests are in flight per client (an asyncio semaphore);
* only transport failures are retried: connection errors, HTTP 429 and HTTP 5xx, with exponential
  backoff and jitter (``Retry-After`` is honoured on 429, capped at ``backoff_max_s``). An answer is
  never retried, whatever it says; other HTTP errors and malformed bodies raise :class:`ChatError`
  at once; a request that exceeds ``timeout_s`` raises :class:`ChatTimeout` (not retried: a model
  that needs longer than the limit would only burn the same time again);
* token usage and latency come back with each result, and with ``logprobs=True`` each generated
  token's log-prob (a response without them is a ChatError).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

Message = Mapping[str, str]


@dataclass(frozen=True)
class Usage:
    """Token counts the endpoint reported (0 when it reported none)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        """Plain dict for JSON records."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token as the endpoint reported it (``logprobs.content[i]``): its text and log-prob.
    vLLM with ``return_tokens_as_token_ids`` writes the text as ``token_id:<id>``."""

    token: str
    logprob: float


@dataclass(frozen=True)
class ChatResult:
    """One completion: text, usage, wall latency of the successful attempt chain, finish reason, and the
    per-token log-probs when the client asked for them."""

    text: str
    usage: Usage = field(default_factory=Usage)
    latency_s: float = 0.0
    finish_reason: str | None = None
    attempts: int = 1
    logprobs: tuple[TokenLogprob, ...] = ()


class ChatError(RuntimeError):
    """The endpoint failed (after retries, if the failure was retryable)."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


class ChatTimeout(ChatError):
    """A request ran past the client's timeout."""


def is_retryable_status(status: int) -> bool:
    """HTTP statuses worth retrying: rate limiting and server-side errors."""
    return status == 429 or 500 <= status <= 599


def backoff_delay(attempt: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Exponential backoff with jitter: uniform in [0.5, 1.5) x base * 2**attempt, capped at ``max_s``."""
    return float(min(max_s, base_s * (2.0**attempt) * (0.5 + rng.random())))


def chat_endpoint(url: str) -> str:
    """``…/v1`` (or a full ``…/chat/completions`` URL) -> the chat completions URL."""
    u = url.rstrip("/")
    return u if u.endswith("/chat/completions") else u + "/chat/completions"


def parse_completion(body: Any) -> tuple[str, Usage, str | None]:
    """Text, usage and finish reason of a chat completion body; ChatError names what is missing."""
    if not isinstance(body, dict):
        raise ChatError(f"response is not a JSON object: {str(body)[:200]}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ChatError(f"response has no choices: {json.dumps(body)[:200]}")
    msg = choices[0].get("message") or {}
    text = msg.get("content") if isinstance(msg, dict) else None
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise ChatError(f"choices[0].message.content is not a string: {str(text)[:200]}")
    u = body.get("usage") or {}
    usage = Usage(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)) if isinstance(u, dict) else Usage()
    fr = choices[0].get("finish_reason")
    return text, usage, fr if isinstance(fr, str) else None


def parse_logprobs(body: dict[str, Any]) -> tuple[TokenLogprob, ...]:
    """The chosen tokens' log-probs of choices[0] (``logprobs.content``); ChatError when absent or malformed."""
    content = ((body["choices"][0].get("logprobs") or {}).get("content"))
    if not isinstance(content, list):
        raise ChatError(f"response has no choices[0].logprobs.content: {json.dumps(body)[:200]}")
    out = []
    for i, entry in enumerate(content):
        token = entry.get("token") if isinstance(entry, dict) else None
        lp = entry.get("logprob") if isinstance(entry, dict) else None
        if not isinstance(token, str) or not isinstance(lp, int | float):
            raise ChatError(f"choices[0].logprobs.content[{i}] needs a string token and a numeric logprob")
        out.append(TokenLogprob(token, float(lp)))
    return tuple(out)


class ChatClient:
    """Chat client with pinned sampling, bounded concurrency and transport-only retries."""

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 300.0,
        retries: int = 3,
        seed: int | None = 0,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_tokens: int = 4096,
        concurrency: int = 8,
        backoff_s: float = 0.5,
        backoff_max_s: float = 30.0,
        extra_body: Mapping[str, Any] | None = None,
        logprobs: bool = False,
    ) -> None:
        if not url:
            raise ValueError("url must be a non-empty base URL such as http://host:8000/v1")
        if not model:
            raise ValueError("model must be a non-empty model name")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.endpoint = chat_endpoint(url)
        self.model = model
        self.api_key = api_key
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.seed = seed
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.max_tokens = int(max_tokens)
        self.concurrency = int(concurrency)
        self.backoff_s = float(backoff_s)
        self.backoff_max_s = float(backoff_max_s)
        self.extra_body = dict(extra_body or {})
        self.logprobs = bool(logprobs)
        self._rng = random.Random()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._sem: asyncio.Semaphore | None = None

    def request_body(self, messages: Sequence[Message]) -> dict[str, Any]:
        """The JSON body sent for ``messages`` (sampling parameters pinned)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if self.logprobs:
            body["logprobs"] = True
        body.update(self.extra_body)
        return body

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _state(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        """Session and semaphore bound to the running loop (recreated when the loop changes)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._sem is None or self._loop is not loop or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.concurrency),
                timeout=aiohttp.ClientTimeout(total=None),
            )
            self._sem = asyncio.Semaphore(self.concurrency)
            self._loop = loop
        return self._session, self._sem

    async def aclose(self) -> None:
        """Close the HTTP session of the current loop."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
        self._sem = None
        self._loop = None

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def complete(self, messages: Sequence[Message], *, seed: int | None = None) -> ChatResult:
        """One chat completion for ``messages`` (``seed`` overrides the pinned seed, e.g. per sample)."""
        session, sem = self._state()
        body = self.request_body(messages)
        if seed is not None:
            body["seed"] = seed
        data = json.dumps(body)
        async with sem:
            t0 = time.perf_counter()
            attempt = 0
            while True:
                wait_s: float | None = None
                try:
                    async with session.post(
                        self.endpoint, data=data, headers=self._headers(),
                        timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                    ) as resp:
                        raw = await resp.text()
                        if resp.status == 200:
                            try:
                                parsed = json.loads(raw)
                            except json.JSONDecodeError as e:
                                raise ChatError(f"response is not JSON: {raw[:200]!r}", status=200) from e
                            text, usage, finish = parse_completion(parsed)
                            lps = parse_logprobs(parsed) if self.logprobs else ()
                            return ChatResult(text, usage, time.perf_counter() - t0, finish, attempt + 1, lps)
                        err = ChatError(
                            f"HTTP {resp.status} from {self.endpoint}: {raw[:300]}",
                            status=resp.status, retryable=is_retryable_status(resp.status),
                        )
                        if resp.status == 429:
                            wait_s = _retry_after(resp.headers.get("Retry-After"))
                except TimeoutError as e:
                    raise ChatTimeout(
                        f"request to {self.endpoint} timed out after {self.timeout_s:g} s", retryable=False
                    ) from e
                except aiohttp.ClientConnectionError as e:
                    err = ChatError(f"connection error to {self.endpoint}: {e}", retryable=True)
                if not err.retryable or attempt >= self.retries:
                    if err.retryable:
                        raise ChatError(f"{err} (gave up after {attempt + 1} attempts)", status=err.status,
                                        retryable=True) from err
                    raise err
                delay = backoff_delay(attempt, self.backoff_s, self.backoff_max_s, self._rng)
                if wait_s is not None:
                    delay = min(self.backoff_max_s, max(delay, wait_s))
                await asyncio.sleep(delay)
                attempt += 1

    def complete_sync(self, messages: Sequence[Message], *, seed: int | None = None) -> ChatResult:
        """Blocking wrapper of :meth:`complete` (runs its own event loop; not for use inside one)."""

        async def _run() -> ChatResult:
            try:
                return await self.complete(messages, seed=seed)
            finally:
                await self.aclose()

        return asyncio.run(_run())


def _retry_after(value: str | None) -> float | None:
    """Seconds from a numeric Retry-After header (HTTP dates are ignored)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
