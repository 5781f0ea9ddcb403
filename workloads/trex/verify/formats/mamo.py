"""MAMO optimization sets (EasyLP, ComplexLP): JSONL of ``{"id", "Question", "Answer", "Category", "Type"}``."""

from __future__ import annotations

from trex.verify.items import Item, read_json_records, require, require_truth

REQUIRED = ("Question", "Answer")


def parse(data: bytes, what: str) -> list[Item]:
    """Items keyed by the published id; category = Type (easy_lp / complex_lp)."""
    items: list[Item] = []
    for i, r in enumerate(read_json_records(data, what)):
        truth = require_truth(r, "Answer", what, i)
        items.append(Item(
            id=str(r.get("id", i)), question=str(require(r, "Question", what, i)), truth=truth,
            category=str(r.get("Type", "")),
        ))
    return items
