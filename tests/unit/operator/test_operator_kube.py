"""The API adapter: REST paths, retries with backoff on 5xx/429, 404/409 handling."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from trex_operator.kube import ApiError, Connection, Kube, resource_path


def test_resource_paths() -> None:
    assert resource_path("v1", "Pod", "ns", "p", "status") == "/api/v1/namespaces/ns/pods/p/status"
    assert resource_path("batch/v1", "Job", "ns") == "/apis/batch/v1/namespaces/ns/jobs"
    assert resource_path("v1", "Node", "ns", "n1") == "/api/v1/nodes/n1"
    assert resource_path("trex.dev/v1alpha1", "TrainJob", "a", "b") == "/apis/trex.dev/v1alpha1/namespaces/a/trainjobs/b"


async def _server(handler: Any) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def test_retries_transient_errors_then_succeeds() -> None:
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.method)
        if len(seen) <= 2:
            return web.json_response({"reason": "ServiceUnavailable"}, status=503)
        return web.json_response({"metadata": {"name": "x"}})

    runner, url = await _server(handler)
    try:
        kube = Kube(Connection(server=url), retries=3, backoff_s=0.01)
        assert await kube.get("v1", "Pod", "ns", "x") == {"metadata": {"name": "x"}}
        assert seen == ["GET", "GET", "GET"]
        await kube.close()
    finally:
        await runner.cleanup()


async def test_not_found_and_conflict() -> None:
    async def handler(request: web.Request) -> web.Response:
        if request.method == "POST":
            return web.json_response({"reason": "AlreadyExists", "message": "exists"}, status=409)
        return web.json_response({"reason": "NotFound"}, status=404)

    runner, url = await _server(handler)
    try:
        kube = Kube(Connection(server=url), retries=3, backoff_s=0.01)
        assert await kube.get("v1", "Pod", "ns", "x") is None
        assert await kube.delete("v1", "Pod", "ns", "x") is False
        with pytest.raises(ApiError) as err:
            await kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "ns"}})
        assert err.value.status == 409 and err.value.reason == "AlreadyExists"
        await kube.close()
    finally:
        await runner.cleanup()


async def test_pre_encoded_create_sends_the_same_object_on_every_retry() -> None:
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"},
                "data": {"a": "1", "ü": "é"}}
    received: list[tuple[str, str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        received.append((request.path, request.content_type, await request.json()))
        if len(received) == 1:
            return web.json_response({"reason": "ServiceUnavailable"}, status=503)
        return web.json_response({"metadata": {"name": "c"}})

    runner, url = await _server(handler)
    try:
        kube = Kube(Connection(server=url), retries=2, backoff_s=0.01)
        encoded = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
        assert await kube.create(manifest, encoded=encoded) == {"metadata": {"name": "c"}}
        assert received == [("/api/v1/namespaces/ns/configmaps", "application/json", manifest)] * 2
        await kube.close()
    finally:
        await runner.cleanup()
