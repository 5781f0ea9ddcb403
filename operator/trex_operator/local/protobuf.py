"""Decode the Kubernetes protobuf encoding of the few built-in objects clients write that way.

Typed Go clients (helm's release storage, `kubectl create configmap|secret`) send
``application/vnd.kubernetes.protobuf``: the magic ``k8s\\0`` and a runtime.Unknown envelope around
the generated message. The local API server stores JSON, so it turns Secret, ConfigMap and
DeleteOptions bodies into their JSON form here (field numbers from k8s.io/api generated.proto);
other kinds answer 415 and the client is told to send JSON.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) pairs of one message: ints for varints, bytes for length-delimited ones."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield number, value
        elif wire == 2:
            n, i = _varint(buf, i)
            yield number, buf[i:i + n]
            i += n
        elif wire == 5:
            i += 4
        elif wire == 1:
            i += 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _text(v: int | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _bytes(v: int | bytes | None) -> bytes:
    return v if isinstance(v, bytes) else b""


def _map_entry(v: int | bytes, value: Callable[[bytes], Any]) -> tuple[str, Any]:
    entry = dict(fields(_bytes(v)))
    return _text(entry.get(1, b"")), value(_bytes(entry.get(2)))


def _time(v: int | bytes) -> str:
    parts = dict(fields(v if isinstance(v, bytes) else b""))
    seconds = int(parts.get(1, 0)) if isinstance(parts.get(1, 0), int) else 0
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owner(v: int | bytes) -> dict[str, Any]:
    names = {1: "kind", 3: "name", 4: "uid", 5: "apiVersion"}
    out: dict[str, Any] = {}
    for n, x in fields(v if isinstance(v, bytes) else b""):
        if n in names:
            out[names[n]] = _text(x)
        elif n == 6:
            out["controller"] = bool(x)
        elif n == 7:
            out["blockOwnerDeletion"] = bool(x)
    return out


def object_meta(buf: bytes) -> dict[str, Any]:
    """metav1.ObjectMeta."""
    strings = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    out: dict[str, Any] = {}
    for n, v in fields(buf):
        if n in strings:
            out[strings[n]] = _text(v)
        elif n == 7:
            out["generation"] = v
        elif n in (11, 12):
            k, x = _map_entry(v, lambda b: b.decode())
            out.setdefault("labels" if n == 11 else "annotations", {})[k] = x
        elif n == 13:
            out.setdefault("ownerReferences", []).append(_owner(v))
        elif n == 14:
            out.setdefault("finalizers", []).append(_text(v))
        elif n in (8, 9):
            out["creationTimestamp" if n == 8 else "deletionTimestamp"] = _time(v)
    return out


def _secret(buf: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n, v in fields(buf):
        if n == 1 and isinstance(v, bytes):
            out["metadata"] = object_meta(v)
        elif n == 2:
            k, x = _map_entry(v, lambda b: base64.b64encode(b).decode())
            out.setdefault("data", {})[k] = x
        elif n == 3:
            out["type"] = _text(v)
        elif n == 4:
            k, x = _map_entry(v, lambda b: b.decode())
            out.setdefault("stringData", {})[k] = x
        elif n == 5:
            out["immutable"] = bool(v)
    return out


def _config_map(buf: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n, v in fields(buf):
        if n == 1 and isinstance(v, bytes):
            out["metadata"] = object_meta(v)
        elif n == 2:
            k, x = _map_entry(v, lambda b: b.decode())
            out.setdefault("data", {})[k] = x
        elif n == 3:
            k, x = _map_entry(v, lambda b: base64.b64encode(b).decode())
            out.setdefault("binaryData", {})[k] = x
        elif n == 4:
            out["immutable"] = bool(v)
    return out


def _delete_options(buf: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n, v in fields(buf):
        if n == 1:
            out["gracePeriodSeconds"] = v
        elif n == 2 and isinstance(v, bytes):
            out["preconditions"] = {({1: "uid", 2: "resourceVersion"}.get(k, str(k))): _text(x) for k, x in fields(v)}
        elif n == 3:
            out["orphanDependents"] = bool(v)
        elif n == 4:
            out["propagationPolicy"] = _text(v)
    return out


DECODERS: dict[str, Callable[[bytes], dict[str, Any]]] = {
    "Secret": _secret, "ConfigMap": _config_map, "DeleteOptions": _delete_options}


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded object; ValueError for a kind this module cannot read."""
    if not body.startswith(MAGIC):
        raise ValueError("not a Kubernetes protobuf body (no k8s\\0 magic)")
    envelope = dict(fields(body[len(MAGIC):]))
    type_meta = dict(fields(_bytes(envelope.get(1))))
    api_version, kind = _text(type_meta.get(1, b"")), _text(type_meta.get(2, b""))
    raw = envelope.get(2, b"")
    if kind not in DECODERS or not isinstance(raw, bytes):
        raise ValueError(f"{kind or 'this kind'} in protobuf is not supported here; send JSON")
    return {"apiVersion": api_version, "kind": kind, **DECODERS[kind](raw)}
