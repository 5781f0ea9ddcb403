"""A local Kubernetes API server for `trex demo` and the tests, built on kmock's emulator.

kmock provides the HTTP server, request parsing and the object store; this subclass answers every
Kubernetes request itself with the semantics standard clients rely on (kubectl, helm, kopf, the
official client): legacy discovery for the core group and every CRD (short names, categories,
subresources), CRDs registered as they are created, typed lists with a resourceVersion, server-side
Tables from printer columns, label and field selectors, watches that resume from a resourceVersion
(and the initial-events bookmark), create / replace / merge, strategic and JSON patches / server-side
apply, optimistic concurrency, finalizers, ownerReference garbage collection (background, foreground,
orphan), strict field validation from CRD schemas, validating admission webhooks with a URL, OpenAPI v3
and pod logs from the local kubelet's files.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime as dt
import json
import random
import ssl
import string
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import kmock
import yaml
from kmock._internal import k8s_dicts, rendering

from trex_operator.local import apimachinery as am
from trex_operator.local import protobuf

SERVER_VERSION = {"major": "1", "minor": "36", "gitVersion": "v1.36.0", "gitCommit": "trex-local",
                  "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.22",
                  "compiler": "gc", "platform": "linux/amd64"}
"""What /version reports: a current Kubernetes (the chart's kubeVersion asks for >= 1.28)."""
HISTORY = 20000
"""Watch events kept for resuming a watch from a resourceVersion (older ones answer 410 Expired)."""
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class ApiFailure(Exception):
    """An error answered as a meta/v1 Status."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, dict(details or {})

    def status(self) -> dict[str, Any]:
        """The Status object."""
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
                "reason": self.reason, "details": self.details, "code": self.code}


@dataclass(frozen=True)
class Target:
    """What a request addresses: a resource collection, or one object and maybe a subresource."""

    res: am.Resource
    namespace: str | None
    name: str | None
    subresource: str | None


@dataclass(eq=False)
class Watcher:
    """One open watch: its filter and the queue its events go to."""

    res: am.Resource
    namespace: str | None
    labels: list[am.Requirement]
    fields: list[am.Requirement]
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)

    def wants(self, res: am.Resource, obj: Mapping[str, Any]) -> bool:
        """Whether an event about ``obj`` of ``res`` belongs to this watch."""
        ns = (obj.get("metadata") or {}).get("namespace")
        return (res.path == self.res.path and (self.namespace is None or ns == self.namespace)
                and am.matches(obj, self.labels, self.fields))


def now_iso() -> str:
    """The current time as the API server writes timestamps."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator answering with the Kubernetes API semantics listed in the module docstring.

    ``keep_history``: keep every object version and request (tests assert on them); without it only the
    last version and the request being served are kept, so long runs (the demo, scale benchmarks) stay
    O(1) per request. ``log_dir``: where the local kubelet writes ``<pod>.log`` (pods/log reads it).
    """

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.keep_history = True
        self.log_dir: Path | None = None
        self.stats: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.created: dict[str, list[float]] = collections.defaultdict(list)
        self.rv = 0
        self.types: dict[str, am.Resource] = {}
        self.history: collections.deque[tuple[int, am.Resource, dict[str, Any]]] = collections.deque(maxlen=HISTORY)
        self.watchers: set[Watcher] = set()
        self.applied: dict[tuple[str, str | None, str, str], Any] = {}
        self.index: dict[str, dict[tuple[str | None, str], k8s_dicts.Object]] = collections.defaultdict(dict)
        for res in am.BUILTIN:
            self.register(res)
        self.store(self.types["v1/namespaces"], None, "default", {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}, "status": {"phase": "Active"}})

    # ---- registry and storage -------------------------------------------------------------------

    def register(self, res: am.Resource) -> None:
        """Serve a resource type (discovery, OpenAPI, REST)."""
        self.types[res.path] = res
        self.resources[res.path] = kmock.ResourceInfo(
            kind=res.kind, singular=res.singular, namespaced=res.namespaced, verbs=set(am.VERBS),
            shortnames=set(res.short_names), categories=set(res.categories), subresources=set(res.subresources))

    def _key(self, res: am.Resource, namespace: str | None, name: str) -> tuple[Any, str | None, str]:
        return (kmock.resource(group=res.group, version=res.version, plural=res.plural),
                namespace if res.namespaced else None, name)

    def fetch(self, res: am.Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The live object, or None."""
        obj = self.index[res.path].get((namespace if res.namespaced else None, name))
        return None if obj is None or obj.deleted else obj.raw

    def live(self, res: am.Resource, namespace: str | None = None) -> Iterator[dict[str, Any]]:
        """Live objects of a resource (in one namespace, or all)."""
        for (ns, _name), obj in list(self.index[res.path].items()):
            if not obj.deleted and (namespace is None or ns == namespace):
                yield obj.raw

    def store(self, res: am.Resource, namespace: str | None, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Write a new version of an object (a new resourceVersion)."""
        self.rv += 1
        body.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        key = self._key(res, namespace, name)
        obj = self._objects._objects.get(key)
        if obj is None:
            obj = k8s_dicts.Object(body)
            self._objects._objects[key] = obj
        else:
            obj.create(body)
            if not self.keep_history:
                obj.history[:] = [body]
        self.index[res.path][(key[1], name)] = obj
        return body

    def remove(self, res: am.Resource, namespace: str | None, name: str) -> None:
        """Delete an object for good (soft-deleted in kmock's store: tests see its history)."""
        key = self._key(res, namespace, name)
        obj = self._objects._objects.get(key)
        if obj is None or obj.deleted:
            return
        last = copy.deepcopy(obj.raw)
        self.rv += 1
        last["metadata"]["resourceVersion"] = str(self.rv)
        obj.delete()
        if not self.keep_history:
            del self._objects._objects[key]
        self.index[res.path].pop((key[1], name), None)
        self.emit(res, "DELETED", last)
        if res.path == "apiextensions.k8s.io/v1/customresourcedefinitions":
            for r in am.crd_resources(last):
                self.types.pop(r.path, None)
                self.resources.pop(r.path, None)
        self.collect_garbage({str(last["metadata"].get("uid"))})

    def emit(self, res: am.Resource, kind: str, obj: dict[str, Any]) -> None:
        """Record a watch event and hand it to every matching watch."""
        event = {"type": kind, "object": obj}
        self.history.append((int(obj["metadata"]["resourceVersion"]), res, event))
        for w in list(self.watchers):
            if w.wants(res, obj):
                w.queue.put_nowait(event)

    # ---- HTTP -----------------------------------------------------------------------------------

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Every request: recorded (as kmock's Request, for the tests' assertions), then served.

        kmock's own parsing is bypassed: it decodes every body as text, which protobuf bodies are not.
        """
        body = await raw.read()
        try:
            target = self.target(raw.path)
            data = json.loads(body) if body and raw.content_type == "application/json" else None
        except ApiFailure as exc:
            return aiohttp.web.json_response(exc.status(), status=exc.code)
        except ValueError:
            target, data = None, None
        request = rendering.Request(
            id=len(self._requests), raw_request=raw, url=raw.url, method=raw.method, params=dict(raw.query),
            headers=dict(raw.headers), body=body, data=data, name=target.name if target else None,
            namespace=target.namespace if target else None, subresource=target.subresource if target else None,
            resource=kmock.resource(group=target.res.group, version=target.res.version, plural=target.res.plural)
            if target else None)
        if self.keep_history:
            self._requests.append(request)
        agent = str(raw.headers.get("User-Agent", "")).split("/")[0]
        self.stats[(agent, raw.method, target.res.plural if target else "")] += 1
        try:
            if target is None:
                return await self.serve_meta(raw)
            return await self.serve(raw, target, body)
        except ApiFailure as exc:
            return aiohttp.web.json_response(exc.status(), status=exc.code)

    def target(self, path: str) -> Target | None:
        """Parse a REST path; None for discovery, OpenAPI and other non-resource paths."""
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 3 and parts[0] == "api":
            gv, rest = parts[1], parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis":
            gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            return None
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        res = self.types.get(f"{gv}/{rest[0]}")
        if res is None:
            raise ApiFailure(404, "NotFound", f"the server could not find the requested resource ({path})")
        if not res.namespaced and namespace is not None:
            rest = ["namespaces", namespace, *rest] if res.plural == "namespaces" else rest
        return Target(res, namespace, rest[1] if len(rest) > 1 else None, "/".join(rest[2:]) or None)

    async def serve_meta(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Version, health, discovery and OpenAPI."""
        path = raw.path.rstrip("/") or "/"
        if path == "/version":
            return aiohttp.web.json_response(SERVER_VERSION)
        if path in ("/healthz", "/readyz", "/livez"):
            return aiohttp.web.Response(text="ok")
        if path == "/api":
            return aiohttp.web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": raw.host}]})
        groups = self.groups()
        if path == "/apis":
            return aiohttp.web.json_response({"kind": "APIGroupList", "apiVersion": "v1",
                                              "groups": [self.group_doc(g, vs) for g, vs in sorted(groups.items())]})
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) == 2 and parts[1] == "v1":
            return aiohttp.web.json_response(self.resource_list("", "v1"))
        if parts[0] == "apis" and len(parts) == 2 and parts[1] in groups:
            return aiohttp.web.json_response({"apiVersion": "v1", **self.group_doc(parts[1], groups[parts[1]])})
        if parts[0] == "apis" and len(parts) == 3 and parts[2] in groups.get(parts[1], []):
            return aiohttp.web.json_response(self.resource_list(parts[1], parts[2]))
        if path == "/openapi/v3":
            return aiohttp.web.json_response({"paths": {
                ("api/v1" if not g else f"apis/{g}/{v}"): {"serverRelativeURL": f"/openapi/v3/{'api/v1' if not g else f'apis/{g}/{v}'}?hash={self.rv}"}
                for g, vs in [("", ["v1"]), *groups.items()] for v in vs}})
        if path.startswith("/openapi/v3/"):
            gv = path[len("/openapi/v3/"):]
            group, version = ("", "v1") if gv == "api/v1" else tuple(gv.removeprefix("apis/").split("/", 1))
            resources = [r for r in self.types.values() if r.group == group and r.version == version]
            if resources:
                return aiohttp.web.json_response(am.openapi_document(resources))
        raise ApiFailure(404, "NotFound", f"the server could not find the requested resource ({raw.path})")

    def groups(self) -> dict[str, list[str]]:
        """Served API groups (not the core group) and their versions."""
        out: dict[str, list[str]] = {}
        for r in self.types.values():
            if r.group and r.version not in out.setdefault(r.group, []):
                out[r.group].append(r.version)
        return out

    @staticmethod
    def group_doc(group: str, versions: list[str]) -> dict[str, Any]:
        """An APIGroup entry."""
        vs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"kind": "APIGroup", "name": group, "versions": vs, "preferredVersion": vs[0]}

    def resource_list(self, group: str, version: str) -> dict[str, Any]:
        """The APIResourceList of one group version, subresources included."""
        items: list[dict[str, Any]] = []
        for r in self.types.values():
            if r.group != group or r.version != version:
                continue
            items.append({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
                          "verbs": am.VERBS, "shortNames": list(r.short_names), "categories": list(r.categories)})
            for sub in r.subresources:
                verbs = ["get"] if sub == "log" else ["get", "patch", "update"]
                items.append({"name": f"{r.plural}/{sub}", "singularName": "", "namespaced": r.namespaced,
                              "kind": "Pod" if sub == "log" else r.kind, "verbs": verbs})
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}" if group else version,
                "resources": items}

    async def serve(self, raw: aiohttp.web.BaseRequest, t: Target, body: bytes) -> aiohttp.web.StreamResponse:
        """One resource request."""
        q = raw.query
        method = raw.method
        if method == "GET" and t.subresource == "log":
            return await self.serve_log(raw, t)
        if method == "GET" and q.get("watch") in ("true", "1"):
            return await self.serve_watch(raw, t)
        if method == "GET" and t.name is None:
            return self.respond(raw, t.res, self.listing(t, q))
        if method == "GET":
            obj = self.fetch(t.res, t.namespace, t.name or "")
            if obj is None:
                raise self.not_found(t)
            return self.respond(raw, t.res, obj)
        data = self.decode(raw, body)
        if method in ("POST", "PUT", "PATCH") and (method == "POST") == (t.name is None):
            if t.subresource is None:
                await self.call_webhooks(method, t, data, raw.content_type, q)
            return self.respond(raw, t.res, self.write(method, t, data, raw.content_type, q),
                                status=201 if method == "POST" else 200)
        if method == "DELETE" and t.name:
            return self.respond(raw, t.res, self.delete_obj(t, data, q))
        if method == "DELETE":
            gone = [self.delete_obj(Target(t.res, (o["metadata"].get("namespace")), o["metadata"]["name"], None), data, q)
                    for o in self.listing(t, q)["items"]]
            return aiohttp.web.json_response({"kind": f"{t.res.kind}List", "apiVersion": t.res.group_version,
                                              "metadata": {"resourceVersion": str(self.rv)}, "items": gone})
        raise ApiFailure(405, "MethodNotAllowed", f"{method} is not supported on {raw.path}")

    def write(self, method: str, t: Target, data: Any, content_type: str, q: Mapping[str, str]) -> dict[str, Any]:
        """Create (POST), replace (PUT) or patch (PATCH) an object; the stored (or dry-run) result."""
        if method == "POST":
            return self.create_obj(t, data, q)
        if method == "PUT":
            return self.replace_obj(t, data, q)
        return self.patch_obj(t, data, content_type, q)

    async def call_webhooks(self, method: str, t: Target, data: Any, content_type: str, q: Mapping[str, str]) -> None:
        """Run the matching validating webhooks on what the write would store (a dry run first)."""
        old = self.fetch(t.res, t.namespace, t.name) if t.name else None
        operation = "CREATE" if old is None else "UPDATE"
        hooks = self.webhooks(t.res, operation)
        if not hooks:
            return
        candidate = self.write(method, t, data, content_type, {**q, "dryRun": "All"})
        for hook in hooks:
            denial = await review(hook, t.res, operation, candidate, old)
            if denial is not None:
                raise ApiFailure(400, "BadRequest", f'admission webhook "{hook.get("name")}" denied the request: {denial}')

    @staticmethod
    def decode(raw: aiohttp.web.BaseRequest, body: bytes) -> Any:
        """A request body: JSON, or YAML for server-side apply."""
        if not body:
            return {}
        if raw.content_type == protobuf.CONTENT_TYPE:
            try:
                return protobuf.decode(body)
            except (ValueError, IndexError) as exc:
                raise ApiFailure(415, "UnsupportedMediaType", str(exc)) from None
        try:
            return yaml.safe_load(body) if "yaml" in raw.content_type else json.loads(body)
        except (ValueError, yaml.YAMLError) as exc:
            raise ApiFailure(400, "BadRequest", f"the request body could not be decoded: {exc}") from None

    def respond(self, raw: aiohttp.web.BaseRequest, res: am.Resource, data: dict[str, Any],
                status: int = 200) -> aiohttp.web.Response:
        """JSON, or a Table when the client asks for one (kubectl get)."""
        if am.wants_table(raw.headers.get("Accept", "")) and data.get("kind") != "Status":
            objs = data["items"] if "items" in data and data.get("kind", "").endswith("List") else [data]
            data = am.table(res, objs, dt.datetime.now(dt.UTC), raw.query.get("includeObject", "Metadata"),
                            str(self.rv))
        return aiohttp.web.json_response(data, status=status)

    @staticmethod
    def not_found(t: Target) -> ApiFailure:
        return ApiFailure(404, "NotFound", f'{t.res.plural}{"." + t.res.group if t.res.group else ""} "{t.name}" not found',
                          {"name": t.name, "group": t.res.group, "kind": t.res.plural})

    # ---- reads ----------------------------------------------------------------------------------

    def selectors(self, q: Mapping[str, str]) -> tuple[list[am.Requirement], list[am.Requirement]]:
        """Parsed labelSelector and fieldSelector (400 when malformed)."""
        try:
            return am.parse_label_selector(q.get("labelSelector", "")), am.parse_field_selector(q.get("fieldSelector", ""))
        except ValueError as exc:
            raise ApiFailure(400, "BadRequest", str(exc)) from None

    def listing(self, t: Target, q: Mapping[str, str]) -> dict[str, Any]:
        """A typed list (``<Kind>List``) of the objects passing the selectors."""
        labels, fields = self.selectors(q)
        items = [o for o in self.live(t.res, t.namespace) if am.matches(o, labels, fields)]
        items.sort(key=lambda o: (str(o["metadata"].get("namespace") or ""), str(o["metadata"]["name"])))
        return {"kind": f"{t.res.kind}List", "apiVersion": t.res.group_version,
                "metadata": {"resourceVersion": str(self.rv)},
                "items": [{"apiVersion": t.res.group_version, "kind": t.res.kind, **o} for o in items]}

    async def serve_watch(self, raw: aiohttp.web.BaseRequest, t: Target) -> aiohttp.web.StreamResponse:
        """A watch stream: the initial ADDED events (or the events since ``resourceVersion``), then live ones."""
        q = raw.query
        labels, fields = self.selectors(q)
        if t.name:
            fields = [*fields, am.Requirement("metadata.name", "=", (t.name,))]
        watcher = Watcher(t.res, t.namespace, labels, fields)
        since = q.get("resourceVersion", "")
        initial = q.get("sendInitialEvents") == "true" or since in ("", "0")
        backlog: list[dict[str, Any]] = []
        if initial:
            backlog = [{"type": "ADDED", "object": o} for o in self.listing(t, q)["items"]]
            if q.get("sendInitialEvents") == "true":
                backlog.append({"type": "BOOKMARK", "object": {
                    "kind": t.res.kind, "apiVersion": t.res.group_version,
                    "metadata": {"resourceVersion": str(self.rv), "annotations": {INITIAL_EVENTS_END: "true"}}}})
        else:
            try:
                start = int(since)
            except ValueError:
                raise ApiFailure(400, "BadRequest", f"invalid resourceVersion {since!r}") from None
            oldest = self.history[0][0] if self.history else self.rv + 1
            if self.history and len(self.history) == self.history.maxlen and start < oldest - 1:
                backlog = [{"type": "ERROR", "object": ApiFailure(
                    410, "Expired", f"too old resource version: {start} ({oldest - 1})").status()}]
            else:
                backlog = [e for rv, res, e in self.history if rv > start and watcher.wants(res, e["object"])]
        self.watchers.add(watcher)
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        table = am.wants_table(raw.headers.get("Accept", ""))
        timeout = float(q.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        try:
            await resp.prepare(raw)
            for e in backlog:
                await self._write_event(resp, t.res, e, table, q)
                if e["type"] == "ERROR":
                    return resp
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), timeout=min(left, 30.0))
                except TimeoutError:
                    continue
                if event is None:
                    break
                await self._write_event(resp, t.res, event, table, q)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
        finally:
            self.watchers.discard(watcher)
        return resp

    async def _write_event(self, resp: aiohttp.web.StreamResponse, res: am.Resource, event: dict[str, Any],
                           table: bool, q: Mapping[str, str]) -> None:
        obj = event["object"]
        if obj.get("kind") != "Status":
            obj = {"apiVersion": res.group_version, "kind": res.kind, **obj}
            if table and event["type"] != "BOOKMARK":
                obj = am.table(res, [obj], dt.datetime.now(dt.UTC), q.get("includeObject", "Metadata"),
                               obj["metadata"].get("resourceVersion", ""))
        await resp.write(json.dumps({"type": event["type"], "object": obj}).encode() + b"\n")

    async def serve_log(self, raw: aiohttp.web.BaseRequest, t: Target) -> aiohttp.web.StreamResponse:
        """pods/log: the local kubelet's log file (``tailLines``, ``follow`` until the pod is done)."""
        pod = self.fetch(t.res, t.namespace, t.name or "")
        if pod is None:
            raise self.not_found(t)
        path = (self.log_dir / f"{t.name}.log") if self.log_dir is not None else None
        if path is None or not path.exists():
            raise ApiFailure(400, "BadRequest", f'container in pod "{t.name}" is waiting to start: no log yet')
        text = path.read_text(encoding="utf-8", errors="replace")
        tail = raw.query.get("tailLines")
        if tail is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail):]) if int(tail) > 0 else ""
        if raw.query.get("follow") != "true":
            return aiohttp.web.Response(text=text, content_type="text/plain")
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(raw)
        await resp.write(text.encode())
        offset = path.stat().st_size
        while True:
            current = self.fetch(t.res, t.namespace, t.name or "")
            done = current is None or (current.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            size = path.stat().st_size
            if size > offset:
                with path.open("rb") as f:
                    f.seek(offset)
                    await resp.write(f.read(size - offset))
                offset = size
            if done:
                return resp
            await asyncio.sleep(0.2)

    # ---- writes ---------------------------------------------------------------------------------

    def create_obj(self, t: Target, data: Any, q: Mapping[str, str]) -> dict[str, Any]:
        """POST: a new object with server-set metadata."""
        if not isinstance(data, dict):
            raise ApiFailure(400, "BadRequest", "the body of a create must be an object")
        body = copy.deepcopy(data)
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        name = meta.get("name")
        if not name:
            raise ApiFailure(422, "Invalid", f"{t.res.kind}: metadata.name: Required value: name or generateName is required")
        if t.res.namespaced:
            ns = meta.get("namespace") or t.namespace or "default"
            if t.namespace is not None and ns != t.namespace:
                raise ApiFailure(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                                 "sent on the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
            ns = None
        if self.fetch(t.res, ns, name) is not None:
            raise ApiFailure(409, "AlreadyExists", f'{t.res.plural}{"." + t.res.group if t.res.group else ""} "{name}" already exists',
                             {"name": name, "group": t.res.group, "kind": t.res.plural})
        body["apiVersion"], body["kind"] = t.res.group_version, t.res.kind
        meta.update({"uid": str(uuid.uuid4()), "creationTimestamp": now_iso()})
        meta.pop("deletionTimestamp", None)
        if "spec" in body or t.res.schema is not None:
            meta["generation"] = 1
        self.admit(t.res, "CREATE", body, None, q)
        if t.res.path == "apiextensions.k8s.io/v1/customresourcedefinitions":
            self.establish(body)
        if q.get("dryRun") == "All":
            return body
        self.store(t.res, ns, name, body)
        if t.res.path == "v1/pods" or t.res.path == "v1/configmaps" or t.res.path == "v1/services":
            job = (meta.get("labels") or {}).get("trex.dev/job-name")
            if job:
                self.created[job].append(time.perf_counter())
        self.emit(t.res, "ADDED", body)
        return body

    def establish(self, crd: dict[str, Any]) -> None:
        """Accept a CRD: register what it serves and report it Established."""
        try:
            resources = am.crd_resources(crd)
        except (KeyError, TypeError) as exc:
            raise ApiFailure(422, "Invalid", f"CustomResourceDefinition: spec.names: {exc}") from None
        for r in resources:
            self.register(r)
        names = (crd.get("spec") or {}).get("names") or {}
        ts = now_iso()
        crd["status"] = {"acceptedNames": names, "storedVersions": [r.version for r in resources],
                         "conditions": [{"type": t, "status": "True", "lastTransitionTime": ts, "reason": r, "message": m}
                                        for t, r, m in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                                                        ("Established", "InitialNamesAccepted",
                                                         "the initial names have been accepted"))]}

    def replace_obj(self, t: Target, data: Any, q: Mapping[str, str]) -> dict[str, Any]:
        """PUT: replace the object (or its status), with optimistic concurrency on resourceVersion."""
        old = self.fetch(t.res, t.namespace, t.name or "")
        if old is None:
            raise self.not_found(t)
        if not isinstance(data, dict):
            raise ApiFailure(400, "BadRequest", "the body of an update must be an object")
        self.precondition(t, old, data)
        if t.subresource == "status":
            new = {**old, "status": data.get("status")}
        else:
            new = copy.deepcopy(data)
            if "status" in t.res.subresources and "status" in old:
                new["status"] = old["status"]
        return self.update_obj(t, old, new, q)

    def patch_obj(self, t: Target, data: Any, content_type: str, q: Mapping[str, str]) -> dict[str, Any]:
        """PATCH: JSON patch, merge patch, strategic merge patch or server-side apply."""
        old = self.fetch(t.res, t.namespace, t.name or "")
        if content_type == "application/apply-patch+yaml":
            return self.apply_obj(t, old, data, q)
        if old is None:
            raise self.not_found(t)
        try:
            if content_type == "application/json-patch+json":
                new = am.json_patch(copy.deepcopy(old), data)
            elif content_type == "application/strategic-merge-patch+json":
                if t.res.schema is not None:
                    raise ApiFailure(415, "UnsupportedMediaType", "strategic merge patch is not supported for custom "
                                     "resources; use a merge patch")
                new = am.strategic_merge_patch(old, data)
            else:
                new = am.merge_patch(old, data)
        except ValueError as exc:
            raise ApiFailure(422, "Invalid", f"the patch does not apply: {exc}") from None
        if isinstance(data, dict):
            self.precondition(t, old, data)
        if t.subresource == "status":
            new = {**old, "status": new.get("status")}
        return self.update_obj(t, old, new, q)

    def apply_obj(self, t: Target, old: dict[str, Any] | None, data: Any, q: Mapping[str, str]) -> dict[str, Any]:
        """Server-side apply for one field manager: fields it applied before and applies no more are
        removed, the rest is merged over the live object (other managers' fields stay)."""
        if not isinstance(data, dict):
            raise ApiFailure(400, "BadRequest", "the body of an apply must be an object")
        manager = q.get("fieldManager", "")
        key = (t.res.path, t.namespace, t.name or "", manager)
        if old is None:
            body = self.create_obj(Target(t.res, t.namespace, None, None),
                               {**data, "metadata": {**(data.get("metadata") or {}), "name": t.name}}, q)
        else:
            diff = am.merge_diff(self.applied.get(key, {}), data)
            body = self.update_obj(t, old, am.merge_patch(old, diff), q)
        if q.get("dryRun") != "All":
            self.applied[key] = copy.deepcopy(data)
        return body

    @staticmethod
    def precondition(t: Target, old: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        """409 Conflict when the request names a resourceVersion other than the stored one."""
        wanted = (data.get("metadata") or {}).get("resourceVersion")
        if wanted and str(wanted) != old["metadata"]["resourceVersion"]:
            raise ApiFailure(409, "Conflict", f'Operation cannot be fulfilled on {t.res.plural}{"." + t.res.group if t.res.group else ""} '
                             f'"{t.name}": the object has been modified; please apply your changes to the latest version '
                             "and try again", {"name": t.name, "group": t.res.group, "kind": t.res.plural})

    def update_obj(self, t: Target, old: dict[str, Any], new: dict[str, Any], q: Mapping[str, str]) -> dict[str, Any]:
        """Store a changed object: server metadata kept, generation bumped on spec changes, finalizers
        honoured (a terminating object without finalizers goes away)."""
        meta = new.setdefault("metadata", {})
        om = old["metadata"]
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "namespace", "name"):
            if k in om:
                meta[k] = om[k]
            else:
                meta.pop(k, None)
        new["apiVersion"], new["kind"] = t.res.group_version, t.res.kind
        meta["resourceVersion"] = om["resourceVersion"]
        if "generation" in om:
            meta["generation"] = int(om["generation"]) + (new.get("spec") != old.get("spec"))
        if new == old:
            return old
        self.admit(t.res, "UPDATE", new, old, q)
        if t.res.path == "apiextensions.k8s.io/v1/customresourcedefinitions":
            self.establish(new)
        if q.get("dryRun") == "All":
            return new
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.store(t.res, t.namespace, t.name or "", new)
            self.remove(t.res, t.namespace, t.name or "")
            return new
        self.store(t.res, t.namespace, t.name or "", new)
        self.emit(t.res, "MODIFIED", new)
        return new

    def delete_obj(self, t: Target, data: Any, q: Mapping[str, str]) -> dict[str, Any]:
        """DELETE with propagationPolicy Background (default), Foreground or Orphan; an object with
        finalizers is only marked (deletionTimestamp) until they are removed."""
        old = self.fetch(t.res, t.namespace, t.name or "")
        if old is None:
            raise self.not_found(t)
        opts = data if isinstance(data, dict) else {}
        policy = q.get("propagationPolicy") or opts.get("propagationPolicy") or (
            "Orphan" if opts.get("orphanDependents") else "Background")
        pre = (opts.get("preconditions") or {})
        if pre.get("uid") and pre["uid"] != old["metadata"].get("uid"):
            raise ApiFailure(409, "Conflict", f"Precondition failed: UID in precondition: {pre['uid']}")
        if q.get("dryRun") == "All":
            return old
        uid = str(old["metadata"].get("uid"))
        if policy == "Orphan":
            self.orphan({uid})
        finalizers = list(old["metadata"].get("finalizers") or [])
        if policy == "Foreground" and self.dependents_of(uid):
            finalizers = [*finalizers, "foregroundDeletion"] if "foregroundDeletion" not in finalizers else finalizers
        if finalizers:
            if old["metadata"].get("deletionTimestamp") and finalizers == old["metadata"].get("finalizers"):
                return old
            new = copy.deepcopy(old)
            new["metadata"].update({"deletionTimestamp": now_iso(), "finalizers": finalizers})
            new["metadata"]["deletionTimestamp"] = old["metadata"].get("deletionTimestamp") or now_iso()
            self.store(t.res, t.namespace, t.name or "", new)
            self.emit(t.res, "MODIFIED", new)
            if "foregroundDeletion" in finalizers:
                self.collect_garbage({uid})
            return new
        self.remove(t.res, t.namespace, t.name or "")
        return old

    # ---- garbage collection ---------------------------------------------------------------------

    def _all_live(self) -> Iterator[tuple[am.Resource, str | None, str, dict[str, Any]]]:
        for path, objs in list(self.index.items()):
            res = self.types.get(path)
            if res is None:
                continue
            for (ns, name), obj in list(objs.items()):
                if not obj.deleted:
                    yield res, ns, name, obj.raw

    def dependents_of(self, uid: str) -> list[tuple[am.Resource, str | None, str, dict[str, Any]]]:
        """Live objects with an ownerReference to ``uid``."""
        return [(r, ns, n, o) for r, ns, n, o in self._all_live()
                if any(ref.get("uid") == uid for ref in (o["metadata"].get("ownerReferences") or []))]

    def orphan(self, uids: set[str]) -> None:
        """Drop the ownerReferences to ``uids`` (propagationPolicy Orphan)."""
        for res, ns, name, obj in self._all_live():
            refs = obj["metadata"].get("ownerReferences") or []
            if any(r.get("uid") in uids for r in refs):
                new = copy.deepcopy(obj)
                new["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") not in uids]
                self.store(res, ns, name, new)
                self.emit(res, "MODIFIED", new)

    def collect_garbage(self, gone: set[str]) -> None:
        """Delete the dependents left without a live owner by the owners in ``gone`` (each deletion
        collects its own dependents in turn), and finish foreground deletions whose dependents are gone."""
        everything = list(self._all_live())
        live = {str(o["metadata"].get("uid")) for _r, _ns, _n, o in everything
                if "foregroundDeletion" not in (o["metadata"].get("finalizers") or [])}
        by_path = {r.path: r for r, _ns, _n, _o in everything}
        decision = am.orphaned(((r.path, ns, n, o) for r, ns, n, o in everything), gone, live - gone)
        for path, ns, name, rest in decision.release:
            res = by_path[path]
            current = self.fetch(res, ns, name)
            if current is not None:
                new = copy.deepcopy(current)
                new["metadata"]["ownerReferences"] = rest
                self.store(res, ns, name, new)
                self.emit(res, "MODIFIED", new)
        for path, ns, name in decision.delete:
            if self.fetch(by_path[path], ns, name) is not None:
                self.delete_obj(Target(by_path[path], ns, name, None), {}, {"propagationPolicy": "Background"})
        for res, ns, name, obj in list(self._all_live()):
            fins = obj["metadata"].get("finalizers") or []
            if "foregroundDeletion" in fins and not self.dependents_of(str(obj["metadata"].get("uid"))):
                new = copy.deepcopy(obj)
                new["metadata"]["finalizers"] = [f for f in fins if f != "foregroundDeletion"]
                self.update_obj(Target(res, ns, name, None), obj, new, {})

    # ---- admission ------------------------------------------------------------------------------

    def admit(self, res: am.Resource, operation: str, obj: dict[str, Any], old: dict[str, Any] | None,
              q: Mapping[str, str]) -> None:
        """Schema validation (CRDs; unknown fields rejected with fieldValidation=Strict), then the
        validating admission webhooks that match (422 with the webhook's message when one denies)."""
        if res.schema is None:
            return
        name = obj["metadata"].get("name")
        unknown = am.unknown_fields(res.schema, obj)
        if unknown and q.get("fieldValidation") == "Strict":
            raise ApiFailure(400, "BadRequest", f'{res.kind} in version "{res.version}" cannot be handled as a {res.kind}: '
                             "strict decoding error: " + ", ".join(f'unknown field "{f}"' for f in unknown))
        problems = am.schema_problems(res.schema, obj)
        if problems:
            raise ApiFailure(422, "Invalid", f'{res.kind}.{res.group} "{name}" is invalid: '
                             + ", ".join(f"{f}: {m}" for f, m in problems[:5]),
                             {"name": name, "group": res.group, "kind": res.kind,
                              "causes": [{"reason": "FieldValueInvalid", "field": f, "message": m} for f, m in problems]})

    def webhooks(self, res: am.Resource, operation: str) -> list[dict[str, Any]]:
        """The validating webhooks (with a clientConfig.url) whose rules match a request."""
        out = []
        cfgs = self.types.get("admissionregistration.k8s.io/v1/validatingwebhookconfigurations")
        for cfg in self.live(cfgs) if cfgs is not None else []:
            for hook in cfg.get("webhooks") or []:
                if not (hook.get("clientConfig") or {}).get("url"):
                    continue
                for rule in hook.get("rules") or []:
                    if (_matches_rule(rule.get("apiGroups"), res.group) and _matches_rule(rule.get("apiVersions"), res.version)
                            and _matches_rule(rule.get("resources"), res.plural)
                            and _matches_rule(rule.get("operations"), operation)):
                        out.append(hook)
                        break
        return out


def _matches_rule(values: Any, value: str) -> bool:
    return not values or "*" in values or value in values


async def review(hook: Mapping[str, Any], res: am.Resource, operation: str, obj: Mapping[str, Any],
                 old: Mapping[str, Any] | None) -> str | None:
    """POST an AdmissionReview to a webhook; the denial message, or None when allowed (a webhook that
    cannot be reached denies unless its failurePolicy is Ignore)."""
    cfg = hook.get("clientConfig") or {}
    ctx: ssl.SSLContext | bool = False
    if str(cfg.get("url", "")).startswith("https"):
        import base64

        ctx = ssl.create_default_context(cadata=base64.b64decode(cfg["caBundle"]).decode() if cfg.get("caBundle") else None)
    uid = str(uuid.uuid4())
    meta = obj.get("metadata") or {}
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": res.group, "version": res.version, "kind": res.kind},
        "resource": {"group": res.group, "version": res.version, "resource": res.plural},
        "requestKind": {"group": res.group, "version": res.version, "kind": res.kind},
        "name": meta.get("name"), "namespace": meta.get("namespace"), "operation": operation,
        "userInfo": {"username": "trex-local"}, "object": obj, "oldObject": old, "dryRun": False}}
    timeout = aiohttp.ClientTimeout(total=float(hook.get("timeoutSeconds") or 10))
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.post(
                str(cfg["url"]), json=body, ssl=ctx) as resp:
            answer = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        if hook.get("failurePolicy") == "Ignore":
            return None
        return f'failed calling webhook "{hook.get("name")}": {exc}'
    response = (answer or {}).get("response") or {}
    if response.get("allowed"):
        return None
    return str((response.get("status") or {}).get("message") or "denied by the admission webhook")
