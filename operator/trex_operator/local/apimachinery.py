"""Pure pieces of the Kubernetes API semantics the local API server implements.

Label and field selectors, JSON merge / strategic merge / JSON patches, server-side Table rows from
printer columns, CRD schemas for strict field validation, garbage-collection decisions and OpenAPI v3
documents. No I/O: `trex_operator.local.apiserver` serves them over HTTP.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# ---- resources ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resource:
    """One served resource type: what discovery, tables, OpenAPI and storage need to know."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    columns: tuple[Mapping[str, Any], ...] = ()
    """additionalPrinterColumns (CRDs) or built-in columns; Name is always first."""
    schema: Mapping[str, Any] | None = None
    """openAPIV3Schema (CRDs); None: any object is accepted."""

    @property
    def group_version(self) -> str:
        """``v1`` for the core group, ``group/version`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def path(self) -> str:
        """Discovery-style key such as ``v1/pods`` or ``trex.dev/v1alpha1/trainjobs``."""
        return f"{self.group_version}/{self.plural}"


VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def _core(group: str, version: str, plural: str, kind: str, namespaced: bool = True, short: tuple[str, ...] = (),
          subs: tuple[str, ...] = (), cats: tuple[str, ...] = (),
          columns: tuple[Mapping[str, Any], ...] = (_AGE,)) -> Resource:
    return Resource(group, version, plural, kind, namespaced, kind.lower(), short, cats, subs, columns)


BUILTIN: tuple[Resource, ...] = (
    _core("", "v1", "pods", "Pod", short=("po",), subs=("status", "log"), cats=("all",), columns=(
        {"name": "Status", "type": "string", "jsonPath": ".status.phase"},
        {"name": "IP", "type": "string", "jsonPath": ".status.podIP", "priority": 1}, _AGE)),
    _core("", "v1", "configmaps", "ConfigMap", short=("cm",)),
    _core("", "v1", "secrets", "Secret", columns=(
        {"name": "Type", "type": "string", "jsonPath": ".type"}, _AGE)),
    _core("", "v1", "services", "Service", short=("svc",), subs=("status",), cats=("all",), columns=(
        {"name": "Cluster-IP", "type": "string", "jsonPath": ".spec.clusterIP"}, _AGE)),
    _core("", "v1", "serviceaccounts", "ServiceAccount", short=("sa",)),
    _core("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", short=("pvc",), subs=("status",)),
    _core("", "v1", "endpoints", "Endpoints", short=("ep",)),
    _core("", "v1", "events", "Event", short=("ev",), columns=(
        {"name": "Type", "type": "string", "jsonPath": ".type"},
        {"name": "Reason", "type": "string", "jsonPath": ".reason"},
        {"name": "Object", "type": "string", "jsonPath": ".involvedObject.name"},
        {"name": "Message", "type": "string", "jsonPath": ".message"}, _AGE)),
    _core("", "v1", "nodes", "Node", namespaced=False, short=("no",), subs=("status",)),
    _core("", "v1", "namespaces", "Namespace", namespaced=False, short=("ns",), subs=("status",)),
    _core("apps", "v1", "deployments", "Deployment", short=("deploy",), subs=("status", "scale"), cats=("all",)),
    _core("apps", "v1", "statefulsets", "StatefulSet", short=("sts",), subs=("status", "scale"), cats=("all",)),
    _core("batch", "v1", "jobs", "Job", subs=("status",), cats=("all",), columns=(
        {"name": "Succeeded", "type": "integer", "jsonPath": ".status.succeeded"}, _AGE)),
    _core("coordination.k8s.io", "v1", "leases", "Lease"),
    _core("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _core("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _core("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    _core("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    _core("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
          "ValidatingWebhookConfiguration", namespaced=False),
    _core("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
          namespaced=False, short=("crd", "crds"), subs=("status",)),
    _core("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", short=("pg",), subs=("status",)),
)
"""The built-in resources: what the operator, the local kubelet, kubectl and the chart use."""


def crd_resources(crd: Mapping[str, Any]) -> list[Resource]:
    """The resources a CustomResourceDefinition serves (one per served version)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for v in spec.get("versions") or []:
        if not v.get("served", True):
            continue
        subs = tuple(s for s in ("status", "scale") if s in (v.get("subresources") or {}))
        out.append(Resource(
            group=str(spec.get("group")), version=str(v["name"]), plural=str(names["plural"]), kind=str(names["kind"]),
            namespaced=spec.get("scope", "Namespaced") == "Namespaced", singular=str(names.get("singular") or ""),
            short_names=tuple(names.get("shortNames") or ()), categories=tuple(names.get("categories") or ()),
            subresources=subs, columns=tuple(v.get("additionalPrinterColumns") or (_AGE,)),
            schema=(v.get("schema") or {}).get("openAPIV3Schema")))
    return out


# ---- selectors ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One selector term: ``key op values``; op in =, !=, in, notin, exists, !exists."""

    key: str
    op: str
    values: tuple[str, ...] = ()


_SET_TERM = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\)|(==|!=|=)\s*([A-Za-z0-9_.-]*))?\s*$")


def _split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    terms, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    return [t for t in [*terms, cur] if t.strip()]


def parse_label_selector(text: str) -> list[Requirement]:
    """Parse a label selector (``a=b,c!=d,e in (x,y),f notin (z),g,!h``); ValueError on bad syntax."""
    reqs = []
    for term in _split_terms(text or ""):
        m = _SET_TERM.match(term)
        if m is None:
            raise ValueError(f"unable to parse requirement: {term.strip()!r}")
        neg, key, set_op, set_values, op, value = m.groups()
        if neg and (set_op or op):
            raise ValueError(f"unable to parse requirement: {term.strip()!r}")
        if set_op:
            reqs.append(Requirement(key, set_op, tuple(v.strip() for v in set_values.split(",") if v.strip())))
        elif op:
            reqs.append(Requirement(key, "!=" if op == "!=" else "=", (value,)))
        else:
            reqs.append(Requirement(key, "!exists" if neg else "exists"))
    return reqs


def requirement_matches(req: Requirement, values: Mapping[str, str]) -> bool:
    """Whether ``values`` (labels, or field values) satisfy one requirement."""
    have = req.key in values
    value = values.get(req.key)
    if req.op == "exists":
        return have
    if req.op == "!exists":
        return not have
    if req.op in ("=", "in"):
        return have and value in req.values
    return not have or value not in req.values  # != and notin also match a missing key


def parse_field_selector(text: str) -> list[Requirement]:
    """Parse a field selector (``metadata.name=x,status.phase!=Running``); ValueError on bad syntax."""
    reqs = []
    for term in _split_terms(text or ""):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
        if m is None:
            raise ValueError(f"invalid field selector: {term.strip()!r}")
        key, op, value = m.groups()
        reqs.append(Requirement(key, "!=" if op == "!=" else "=", (value,)))
    return reqs


def field_value(obj: Mapping[str, Any], dotted: str) -> str | None:
    """The string value at a dotted path (as field selectors compare it); None when absent."""
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return None if isinstance(cur, (Mapping, list)) else str(cur)


def matches(obj: Mapping[str, Any], labels: Sequence[Requirement], fields: Sequence[Requirement]) -> bool:
    """Whether an object passes a parsed label selector and field selector."""
    obj_labels = (obj.get("metadata") or {}).get("labels") or {}
    if not all(requirement_matches(r, obj_labels) for r in labels):
        return False
    for r in fields:
        value = field_value(obj, r.key)
        if not requirement_matches(r, {} if value is None else {r.key: value}):
            return False
    return True


# ---- patches -----------------------------------------------------------------------------------


def merge_diff(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: changed values, nested objects
    diffed, removed keys set to null, lists replaced whole."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            out[k] = v
        elif old[k] != v:
            out[k] = merge_diff(old[k], v)
    return out


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply a JSON merge patch (RFC 7386): objects merge recursively, null deletes, the rest replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch for the common cases: like a merge patch, but lists of objects that all
    carry a ``name`` (containers, env, volumes, ports) merge element by element; ``$patch``,
    ``$setElementOrder`` and ``$retainKeys`` directives are honoured as far as delete/replace go."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    out = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if k.startswith("$") or k.startswith("$setElementOrder/") or k.startswith("$deleteFromPrimitiveList/"):
            continue
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and isinstance(out.get(k), list) and _named_list(v) and _named_list(out[k]):
            merged = {str(e["name"]): e for e in out[k]}
            for e in v:
                if e.get("$patch") == "delete":
                    merged.pop(str(e["name"]), None)
                else:
                    merged[str(e["name"])] = strategic_merge_patch(merged.get(str(e["name"])), e)
            out[k] = list(merged.values())
        else:
            out[k] = strategic_merge_patch(out.get(k), v) if isinstance(v, Mapping) else copy.deepcopy(v)
    return out


def _named_list(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(e, Mapping) and "name" in e for e in items)


def json_patch(target: Any, ops: Any) -> Any:
    """Apply a JSON patch (RFC 6902); ValueError when it does not apply."""
    import jsonpatch

    try:
        return jsonpatch.apply_patch(target, ops)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise ValueError(str(exc)) from exc


# ---- tables ------------------------------------------------------------------------------------


def json_path(obj: Any, path: str) -> Any:
    """Evaluate a printer column's simple JSONPath (``.a.b``, ``.a[0].b``, ``{.a.b}``); None when absent."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    cur = obj
    for name, index in re.findall(r"\.([^.\[\]]+)|\[(\d+)\]", path):
        if name:
            cur = cur.get(name) if isinstance(cur, Mapping) else None
        else:
            cur = cur[int(index)] if isinstance(cur, list) and int(index) < len(cur) else None
        if cur is None:
            return None
    return cur


def human_age(since: str | None, now: dt.datetime) -> str:
    """Age as kubectl prints it (``42s``, ``5m3s``, ``3h12m``, ``4d``); ``<unknown>`` without a time."""
    try:
        then = dt.datetime.strptime(str(since), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        try:
            then = dt.datetime.fromisoformat(str(since))
        except ValueError:
            return "<unknown>"
    s = max(0, int((now - then).total_seconds()))
    if s < 120:
        return f"{s}s"
    if s < 600:
        return f"{s // 60}m{s % 60}s" if s % 60 else f"{s // 60}m"
    if s < 3 * 3600:
        return f"{s // 60}m"
    if s < 8 * 3600:
        return f"{s // 3600}h{(s % 3600) // 60}m" if s % 3600 >= 60 else f"{s // 3600}h"
    if s < 48 * 3600:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _cell(column: Mapping[str, Any], obj: Mapping[str, Any], now: dt.datetime) -> Any:
    value = json_path(obj, str(column.get("jsonPath", "")))
    kind = column.get("type", "string")
    if kind == "date":
        return human_age(value, now) if value is not None else "<unknown>"
    if value is None:
        return None
    if kind == "integer" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return value if isinstance(value, (str, int, float, bool)) else str(value)


def table(res: Resource, objs: Iterable[Mapping[str, Any]], now: dt.datetime, include: str = "Metadata",
          resource_version: str = "") -> dict[str, Any]:
    """A meta.k8s.io/v1 Table: a Name column, then the resource's printer columns; each row carries the
    object's metadata (``include`` Metadata), the whole object (Object) or nothing (None)."""
    cols = [{"name": "Name", "type": "string", "format": "name", "description": "Name of the object", "priority": 0}]
    cols += [{"name": str(c["name"]), "type": "string" if c.get("type") == "date" else str(c.get("type", "string")),
              "format": str(c.get("format", "")), "description": str(c.get("description", "")),
              "priority": int(c.get("priority", 0))} for c in res.columns]
    rows = []
    for o in objs:
        row: dict[str, Any] = {"cells": [(o.get("metadata") or {}).get("name"), *(_cell(c, o, now) for c in res.columns)]}
        if include == "Object":
            row["object"] = o
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": o.get("metadata") or {}}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": cols, "rows": rows}


def wants_table(accept: str) -> bool:
    """Whether an Accept header asks for a server-side Table (as kubectl get does)."""
    return any("as=Table" in part for part in accept.split(","))


# ---- schemas -----------------------------------------------------------------------------------


def strict_jsonschema(node: Any) -> Any:
    """A CRD's structural schema as the API server applies it with strict field validation, as a
    jsonschema (Draft 4) document: unknown fields rejected, nullable and int-or-string translated."""
    if isinstance(node, list):
        return [strict_jsonschema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out = {"anyOf": [{"type": "integer"}, {"type": "string"}], **out}
    if "properties" in out and "additionalProperties" not in out and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if "enum" in out and isinstance(out.get("type"), list):
        out["enum"] = [*out["enum"], None]
    return out


def unknown_fields(schema: Mapping[str, Any], value: Any, path: str = "") -> list[str]:
    """Dotted paths of the fields ``value`` carries that a structural schema does not declare."""
    if not isinstance(schema, Mapping) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(value, Mapping):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            where = f"{path}.{k}" if path else str(k)
            if props is not None and k in props:
                out += [] if where == "metadata" else unknown_fields(props[k], v, where)
            elif isinstance(extra, Mapping):
                out += unknown_fields(extra, v, where)
            elif props is not None and extra is not True:
                out.append(where)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, v in enumerate(value):
            out += unknown_fields(schema["items"], v, f"{path}[{i}]")
    return out


def schema_problems(schema: Mapping[str, Any], obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field path, message) for each way ``obj`` breaks a CRD schema's types, bounds, enums and
    required fields (unknown fields are `unknown_fields`' business)."""
    import jsonschema

    doc = _allow_unknown(strict_jsonschema(copy.deepcopy(dict(schema))))
    doc["properties"] = {k: v for k, v in (doc.get("properties") or {}).items() if k != "metadata"}
    body = {k: v for k, v in obj.items() if k != "metadata"}
    errors = sorted(jsonschema.Draft4Validator(doc).iter_errors(body), key=lambda e: list(map(str, e.absolute_path)))
    return [(".".join(str(p) for p in e.absolute_path) or "<root>", e.message) for e in errors]


def _allow_unknown(node: Any) -> Any:
    if isinstance(node, list):
        return [_allow_unknown(v) for v in node]
    if not isinstance(node, dict):
        return node
    return {k: _allow_unknown(v) for k, v in node.items() if not (k == "additionalProperties" and v is False)}


# ---- garbage collection ------------------------------------------------------------------------


@dataclass
class Dependents:
    """What deleting some owners means for the objects that reference them."""

    delete: list[tuple[str, str | None, str]] = field(default_factory=list)
    """(resource path, namespace, name) of dependents left without any live owner."""
    release: list[tuple[str, str | None, str, list[dict[str, Any]]]] = field(default_factory=list)
    """Dependents that keep other live owners: their remaining ownerReferences."""


def orphaned(objects: Iterable[tuple[str, str | None, str, Mapping[str, Any]]], gone_uids: set[str],
             live_uids: set[str]) -> Dependents:
    """Dependents of the owners in ``gone_uids``: those whose every owner is gone are to be deleted,
    the others lose the references to the gone owners (the garbage collector's decision)."""
    out = Dependents()
    for path, ns, name, obj in objects:
        refs = list((obj.get("metadata") or {}).get("ownerReferences") or [])
        if not refs or not any(r.get("uid") in gone_uids for r in refs):
            continue
        rest = [r for r in refs if r.get("uid") not in gone_uids]
        if any(r.get("uid") in live_uids for r in rest):
            out.release.append((path, ns, name, rest))
        else:
            out.delete.append((path, ns, name))
    return out


# ---- OpenAPI -----------------------------------------------------------------------------------


def schema_name(res: Resource) -> str:
    """The component name kubectl expects (reversed group, version, kind: ``dev.trex.v1alpha1.TrainJob``)."""
    group = ".".join(reversed(res.group.split("."))) if res.group else "io.k8s.api.core"
    return f"{group}.{res.version}.{res.kind}"


def openapi_document(resources: Sequence[Resource]) -> dict[str, Any]:
    """The OpenAPI v3 document of one group version: a schema per kind (tagged with its
    x-kubernetes-group-version-kind) and paths whose operations declare the fieldValidation parameter,
    so kubectl validates on the server (``kubectl apply`` with validation on) and explains from it."""
    gvk = [{"group": r.group, "version": r.version, "kind": r.kind} for r in resources]
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    params = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True},
               "description": "Ignore, Warn or Strict handling of unknown and duplicate fields."},
              {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
              {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}}]
    for res, g in zip(resources, gvk, strict=True):
        schema: dict[str, Any] = copy.deepcopy(dict(res.schema)) if res.schema else {
            "type": "object", "description": f"{res.kind} ({res.group_version})",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                           "metadata": {"type": "object"}}}
        schema["x-kubernetes-group-version-kind"] = [g]
        props = schema.setdefault("properties", {})
        props["metadata"] = {"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}],
                             "description": "Standard object's metadata.", "default": {}}
        schemas[schema_name(res)] = schema
        ref = {"$ref": f"#/components/schemas/{schema_name(res)}"}
        body = {"content": {"application/json": {"schema": ref}}}
        ok = {"responses": {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}}
        base = f"/{'apis/' + res.group if res.group else 'api'}/{res.version}"
        coll = f"{base}/namespaces/{{namespace}}/{res.plural}" if res.namespaced else f"{base}/{res.plural}"
        ops = {"x-kubernetes-group-version-kind": g, "parameters": params, **ok}
        paths[coll] = {"post": {**ops, "requestBody": body, "x-kubernetes-action": "post"},
                       "get": {**ok, "x-kubernetes-group-version-kind": g, "x-kubernetes-action": "list"}}
        paths[f"{coll}/{{name}}"] = {
            "get": {**ok, "x-kubernetes-group-version-kind": g, "x-kubernetes-action": "get"},
            "put": {**ops, "requestBody": body, "x-kubernetes-action": "put"},
            "patch": {**ops, "requestBody": {"content": {"application/merge-patch+json": {"schema": {"type": "object"}}}},
                      "x-kubernetes-action": "patch"},
            "delete": {**ok, "x-kubernetes-group-version-kind": g, "x-kubernetes-action": "delete"}}
    schemas["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"] = {
        "type": "object", "description": "Standard object metadata: name, namespace, labels, annotations, ...",
        "properties": {
            "name": {"type": "string", "description": "Name, unique within a namespace."},
            "namespace": {"type": "string", "description": "Namespace of the object."},
            "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""},
                       "description": "Map of string keys and values for organising and selecting objects."},
            "annotations": {"type": "object", "additionalProperties": {"type": "string", "default": ""},
                            "description": "Unstructured key value map set by external tools."},
            "uid": {"type": "string"}, "resourceVersion": {"type": "string"},
            "generation": {"type": "integer", "format": "int64"},
            "creationTimestamp": {"type": "string", "format": "date-time"},
            "deletionTimestamp": {"type": "string", "format": "date-time"},
            "finalizers": {"type": "array", "items": {"type": "string", "default": ""}},
            "ownerReferences": {"type": "array", "items": {"type": "object"}},
            "generateName": {"type": "string"}}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.31.0"}, "paths": paths,
            "components": {"schemas": schemas}}
