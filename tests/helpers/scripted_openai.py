"""A scripted OpenAI-compatible chat server on 127.0.0.1 for tests.

``ScriptedOpenAI(handler)`` serves ``POST /v1/chat/completions``; ``handler(request_json)`` returns the
answer text (wrapped into a chat completion with usage counts) or ``(status, body)`` to answer with
that HTTP status and body (a dict is sent as JSON, a str as text). The handler may be sync or async.
Use it as ``async with ScriptedOpenAI(h) as srv:`` inside a test's event loop, or ``with
ScriptedOpenAI(h) as srv:`` from sync code (the server then runs on its own thread and loop).
``srv.url`` is the base URL (``http://127.0.0.1:PORT/v1``); ``srv.requests`` records every body.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

Answer = str | tuple[int, Any]
Handler = Callable[[dict[str, Any]], Answer | Awaitable[Answer]]


def completion_body(request: dict[str, Any], text: str) -> dict[str, Any]:
    """A chat completion body for ``text`` with whitespace-token usage counts."""
    prompt_words = sum(len(str(m.get("content", "")).split()) for m in request.get("messages", []))
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "model": request.get("model", ""),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_words, "completion_tokens": len(text.split()),
                  "total_tokens": prompt_words + len(text.split())},
    }


class ScriptedOpenAI:
    """Loopback OpenAI-compatible server whose answers come from a callable."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[dict[str, Any]] = []
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        """Base URL clients use (``…/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": "body is not JSON"}, status=400)
        self.requests.append(body)
        answer = self.handler(body)
        if inspect.isawaitable(answer):
            answer = await answer
        if isinstance(answer, tuple):
            status, payload = answer
            if isinstance(payload, dict | list):
                return web.json_response(payload, status=status)
            return web.Response(text=str(payload), status=status)
        return web.json_response(completion_body(body, str(answer)))

    async def start(self) -> ScriptedOpenAI:
        """Bind a free loopback port and serve."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        return self

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ScriptedOpenAI:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __enter__(self) -> ScriptedOpenAI:
        started = threading.Event()

        async def main() -> None:
            self._stop = asyncio.Event()
            await self.start()
            started.set()
            await self._stop.wait()
            await self.stop()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(main())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="scripted-openai", daemon=True)
        self._thread.start()
        if not started.wait(30):
            raise RuntimeError("scripted OpenAI server did not start within 30 s")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)
