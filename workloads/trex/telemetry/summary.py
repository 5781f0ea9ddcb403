"""Termination summary: a compact JSON written to the pod's termination message on exit (<= 4 KiB)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

LIMIT_BYTES = 4096
DEFAULT_PATH = "/dev/termination-log"


def encode_summary(summary: dict[str, Any], limit: int = LIMIT_BYTES) -> str:
    """JSON of ``summary`` within ``limit`` bytes: long values are dropped (largest first) and listed."""
    data = dict(summary)
    text = json.dumps(data, separators=(",", ":"), sort_keys=True, default=str)
    dropped: list[str] = []
    while len(text.encode()) > limit and data:
        largest = max(data, key=lambda k: len(json.dumps(data[k], default=str)))
        data.pop(largest)
        dropped.append(largest)
        data["truncated"] = sorted(dropped)
        text = json.dumps(data, separators=(",", ":"), sort_keys=True, default=str)
    return text


def write_termination_summary(summary: dict[str, Any], path: str | None = None) -> Path | None:
    """Write the summary to TREX_TERMINATION_PATH, /dev/termination-log when writable, else nowhere."""
    target = path or os.environ.get("TREX_TERMINATION_PATH") or DEFAULT_PATH
    p = Path(target)
    try:
        if p.parent.exists() and (p.exists() or os.access(p.parent, os.W_OK)):
            p.write_text(encode_summary(summary), encoding="utf-8")
            return p
    except OSError:
        return None
    return None
