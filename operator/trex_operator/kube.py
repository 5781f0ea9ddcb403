"""A thin async Kubernetes API adapter (aiohttp): create, get, merge-patch, delete, list, with retries.

Credentials come from the official `kubernetes` client's config loaders (kubeconfig or in-cluster),
so the operator's own requests and kopf's use the same identity.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from trex_operator.api import GROUP, KIND_INFO, VERSION

RESOURCES: dict[tuple[str, str], str] = {
    ("v1", "Pod"): "pods", ("v1", "Service"): "services", ("v1", "ConfigMap"): "configmaps",
    ("v1", "Event"): "events", ("v1", "Node"): "nodes", ("batch/v1", "Job"): "jobs",
    ("apps/v1", "Deployment"): "deployments", ("scheduling.volcano.sh/v1beta1", "PodGroup"): "podgroups",
    **{(f"{GROUP}/{VERSION}", k): info.plural for k, info in KIND_INFO.items()},
}
CLUSTER_SCOPED = frozenset({("v1", "Node")})
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Connection:
    """Where and how to reach the API server."""

    server: str
    token: str | None = None
    ca_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    insecure: bool = False

    @staticmethod
    def load(kubeconfig: str | None = None, context: str | None = None) -> Connection:
        """In-cluster service account when available, else the kubeconfig (KUBECONFIG / ~/.kube/config)."""
        from kubernetes import client, config

        cfg = client.Configuration()
        try:
            if kubeconfig is None and context is None:
                config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            else:
                raise config.ConfigException("explicit kubeconfig")
        except config.ConfigException:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=cfg)
        auth = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        token = auth.split(" ", 1)[1] if isinstance(auth, str) and " " in auth else auth
        return Connection(server=str(cfg.host), token=token, ca_path=cfg.ssl_ca_cert, cert_path=cfg.cert_file,
                          key_path=cfg.key_file, insecure=not cfg.verify_ssl)


def resource_path(api_version: str, kind: str, namespace: str | None, name: str | None = None,
                  subresource: str | None = None) -> str:
    """REST path of a collection or an object."""
    plural = RESOURCES[(api_version, kind)]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace is not None and (api_version, kind) not in CLUSTER_SCOPED:
        base += f"/namespaces/{namespace}"
    path = f"{base}/{plural}"
    if name is not None:
        path += f"/{name}"
    if subresource is not None:
        path += f"/{subresource}"
    return path


class Kube:
    """Async API client; ``on_request(method, path)`` observes every request (metrics, RBAC tests)."""

    def __init__(self, conn: Connection, *, retries: int = 4, backoff_s: float = 0.2,
                 on_request: Callable[[str, str], None] | None = None, timeout_s: float = 30.0,
                 user_agent: str = "trex-operator") -> None:
        self.conn = conn
        self.retries = retries
        self.backoff_s = backoff_s
        self.on_request = on_request
        self.timeout_s = timeout_s
        self.user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.conn.server.startswith("https"):
            return False
        if self.conn.insecure:
            return False
        ctx = ssl.create_default_context(cafile=self.conn.ca_path)
        if self.conn.cert_path and self.conn.key_path:
            ctx.load_cert_chain(self.conn.cert_path, self.conn.key_path)
        return ctx

    async def session(self) -> aiohttp.ClientSession:
        """The shared HTTP session (created on first use)."""
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json", "User-Agent": self.user_agent}
            if self.conn.token:
                headers["Authorization"] = f"Bearer {self.conn.token}"
            self._session = aiohttp.ClientSession(
                base_url=None, headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(ssl=self._ssl(), limit=64))
        return self._session

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, path: str, *, body: Any = None, params: dict[str, str] | None = None,
                      content_type: str = "application/json", encoded: str | None = None) -> dict[str, Any]:
        """One API call with retries on 429/5xx and connection errors (exponential backoff).

        ``encoded``: ``body`` already serialised as JSON (sent as is, sparing a second encoding).
        """
        session = await self.session()
        payload = encoded.encode() if encoded is not None else None
        url = self.conn.server.rstrip("/") + path
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            if self.on_request is not None:
                self.on_request(method, path)
            try:
                async with session.request(method, url, json=body if payload is None else None, data=payload,
                                           params=params, headers={"Content-Type": content_type}) as resp:
                    data: Any = await resp.json(content_type=None) if resp.content_length != 0 else {}
                    if resp.status < 300:
                        return data if isinstance(data, dict) else {}
                    if resp.status in RETRY_STATUSES and attempt < self.retries:
                        await asyncio.sleep(delay)
                        delay *= 2
                        continue
                    info = data if isinstance(data, dict) else {}
                    raise ApiError(resp.status, str(info.get("reason", "")), str(info.get("message", ""))[:500])
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                if attempt >= self.retries:
                    raise ApiError(0, "ConnectionError", str(exc)) from exc
                await asyncio.sleep(delay)
                delay *= 2
        raise ApiError(0, "RetriesExhausted", f"{method} {path}")

    async def create(self, manifest: dict[str, Any], encoded: str | None = None) -> dict[str, Any]:
        """POST an object into its namespace (``encoded``: the manifest already serialised as JSON)."""
        meta = manifest["metadata"]
        path = resource_path(manifest["apiVersion"], manifest["kind"], meta.get("namespace"))
        return await self.request("POST", path, body=manifest, encoded=encoded)

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """GET an object; None when it does not exist."""
        try:
            return await self.request("GET", resource_path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def patch(self, api_version: str, kind: str, namespace: str | None, name: str, body: dict[str, Any],
                    subresource: str | None = None) -> dict[str, Any]:
        """JSON merge patch (RFC 7386)."""
        return await self.request("PATCH", resource_path(api_version, kind, namespace, name, subresource),
                                  body=body, content_type="application/merge-patch+json")

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        """DELETE with background propagation; False when it was already gone."""
        try:
            await self.request("DELETE", resource_path(api_version, kind, namespace, name),
                               body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})
            return True
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
