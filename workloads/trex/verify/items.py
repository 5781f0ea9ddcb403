"""The OR contract's items and ground truth (what every published format parses into), and the record readers
the format parsers share."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

TruthStatus = Literal["optimal", "infeasible", "unbounded", "infeasible_or_unbounded", "no_solution", "unknown"]

# Published spellings of "this problem has no optimal solution" and what they assert.
_LABELS: dict[str, TruthStatus] = {
    "no best solution": "no_solution",
    "no solution": "no_solution",
    "no optimal solution": "no_solution",
    "none": "no_solution",
    "infeasible": "infeasible",
    "the problem is infeasible": "infeasible",
    "unbounded": "unbounded",
    "the problem is unbounded": "unbounded",
    "infeasible or unbounded": "infeasible_or_unbounded",
    "inf_or_unbd": "infeasible_or_unbounded",
}
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


@dataclass(frozen=True)
class Truth:
    """A ground-truth answer: an optimal value (with its printed precision) or a status label."""

    status: TruthStatus
    value: float | None = None
    raw: str = ""
    decimals: int | None = None
    """Digits after the decimal point as printed in the dataset (MAMO's 'one unit' rule)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"status": self.status, "value": self.value, "raw": self.raw, "decimals": self.decimals}


def parse_truth(raw: Any) -> Truth:
    """Published answer (number, numeric string or label) -> Truth; ValueError when unreadable."""
    if isinstance(raw, bool):
        raise ValueError(f"answer {raw!r} is a boolean, not a number or label")
    if isinstance(raw, int | float):
        if not math.isfinite(float(raw)):
            raise ValueError(f"answer {raw!r} is not finite")
        text = repr(raw)
        return Truth("optimal", float(raw), text, _decimals(text))
    if raw is None:
        return Truth("no_solution", None, "None")
    text = str(raw).strip()
    cleaned = text.replace(",", "").replace("$", "").strip()
    if _NUMBER.match(cleaned):
        return Truth("optimal", float(cleaned), text, _decimals(cleaned))
    label = _LABELS.get(text.lower().rstrip("."))
    if label is None:
        raise ValueError(f"answer {text[:60]!r} is neither a number nor a known label ({sorted(_LABELS)})")
    return Truth(label, None, text)


def _decimals(text: str) -> int | None:
    """Printed decimals of a plain numeric string (None for exponent notation)."""
    if "e" in text.lower():
        return None
    return len(text.split(".", 1)[1]) if "." in text else 0


@dataclass(frozen=True)
class Item:
    """One benchmark question with its ground truth and everything its prompt and scoring need."""

    id: str
    question: str
    truth: Truth | None
    """Objective ground truth (None: the item is scored on named values or structure only)."""
    named: dict[str, Truth] = field(default_factory=dict)
    """OptiBench / NL4OPT-E: several named result values, all of which must match."""
    category: str = ""
    """Family / type / difficulty used for per-category scores."""
    files: dict[str, str] = field(default_factory=dict)
    """Input files handed to the program (Bench4Opt: data.json)."""
    reference_lp: str | None = None
    """Bench4Opt: the instance's reference model (LP text) for ORGEval and the reference model."""
    meta: dict[str, Any] = field(default_factory=dict)


def sha256_bytes(*chunks: bytes) -> str:
    """Hex sha256 of the concatenated chunks."""
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()


def read_json_records(data: bytes, what: str) -> list[dict[str, Any]]:
    """A JSON list or JSONL of objects -> records; ValueError names the line or index at fault."""
    text = data.decode("utf-8-sig")
    stripped = text.lstrip()
    records: list[Any]
    if stripped.startswith("["):
        try:
            records = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise ValueError(f"{what}: invalid JSON: {e}") from e
    else:
        records = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{what}: line {i} is not valid JSON: {e}") from e
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise ValueError(f"{what}: record {i} is a {type(r).__name__}, expected an object")
    return records


def require(record: dict[str, Any], key: str, what: str, index: int) -> Any:
    """record[key], or ValueError naming the record and the missing field."""
    if key not in record:
        raise ValueError(f"{what}: record {index} has no field {key!r} (fields: {sorted(record)})")
    return record[key]


def require_truth(record: dict[str, Any], key: str, what: str, index: int) -> Truth:
    """parse_truth(record[key]); a missing or unreadable answer is a ValueError naming record and field."""
    raw = require(record, key, what, index)
    try:
        return parse_truth(raw)
    except ValueError as e:
        raise ValueError(f"{what}: record {index} {key}: {e}") from e
