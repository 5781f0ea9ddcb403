"""registry.json: the tuned configurations the trainer loads (kernel -> shape bucket -> dtype -> best params
and the source hash of the compiled variant)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trex.kernels.suite.base import shape_bucket

REGISTRY_VERSION = 1


def empty(backend: str, device: str) -> dict[str, Any]:
    """A registry with no entries."""
    return {"version": REGISTRY_VERSION, "backend": backend, "device": device, "kernels": {}}


def put(reg: dict[str, Any], kernel: str, shape: Mapping[str, int], dtype: str, entry: Mapping[str, Any]) -> None:
    """Insert or replace the entry for (kernel, bucket of shape, dtype)."""
    reg["kernels"].setdefault(kernel, {}).setdefault(shape_bucket(shape), {})[dtype] = {"shape": dict(shape), **entry}


def lookup(reg: Mapping[str, Any], kernel: str, shape: Mapping[str, int], dtype: str) -> dict[str, Any] | None:
    """The tuned entry for a problem (same bucket and dtype), or None."""
    e = reg.get("kernels", {}).get(kernel, {}).get(shape_bucket(shape), {}).get(dtype)
    return dict(e) if e else None


def save(reg: Mapping[str, Any], path: str | Path) -> None:
    """Atomic write."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(reg, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, p)


def load(path: str | Path) -> dict[str, Any]:
    """Read and check a registry file."""
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("version") != REGISTRY_VERSION or not isinstance(data.get("kernels"), dict):
        raise ValueError(f"{path}: not a trex kernel registry (version {REGISTRY_VERSION} with a 'kernels' map)")
    return data
