"""The fixed output protocol of sandboxed solver programs (see :mod:`trex.sandbox`)."""

from __future__ import annotations

import json
import math
from typing import Any

PREFIX = "TREX_RESULT"
STATUSES: tuple[str, ...] = (
    "optimal", "infeasible", "unbounded", "infeasible_or_unbounded", "time_limit", "suboptimal", "error",
)


def _valid_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def parse_protocol(stdout: str) -> dict[str, Any] | None:
    """Parse the last ``TREX_RESULT {json}`` line of ``stdout``; None when absent or malformed.

    The record must be a JSON object with a string ``status``; ``objective`` must be a number or
    null (a missing objective counts as null); ``values``, when present, must map names to numbers
    or null. The objective comes back as a float.
    """
    last: str | None = None
    for line in stdout.splitlines():
        stripped = line.strip()
        if stripped == PREFIX or stripped.startswith(PREFIX + " ") or stripped.startswith(PREFIX + "\t"):
            last = stripped[len(PREFIX):].strip()
    if last is None:
        return None
    try:
        record = json.loads(last)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("status"), str):
        return None
    objective = record.get("objective")
    if objective is not None and not _valid_number(objective):
        return None
    values = record.get("values", {})
    if not isinstance(values, dict) or not all(v is None or _valid_number(v) for v in values.values()):
        return None
    out = dict(record)
    out["objective"] = None if objective is None else float(objective)
    out["values"] = values
    return out


def format_protocol(status: str, objective: float | None, values: dict[str, float] | None = None) -> str:
    """The protocol line a program prints (NaN objectives become null)."""
    obj = None if objective is None or (isinstance(objective, float) and math.isnan(objective)) else objective
    return f"{PREFIX} " + json.dumps({"status": status, "objective": obj, "values": values or {}})
