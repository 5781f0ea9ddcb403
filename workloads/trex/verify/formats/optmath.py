"""OptMATH-Bench: one JSON list of ``{"en_question", "en_answer", "id"}`` objects."""

from __future__ import annotations

from trex.verify.items import Item, read_json_records, require, require_truth

REQUIRED = ("en_question", "en_answer", "id")


def parse(data: bytes, what: str) -> list[Item]:
    """Items keyed by the published id."""
    items: list[Item] = []
    seen: set[str] = set()
    for i, r in enumerate(read_json_records(data, what)):
        item_id = str(require(r, "id", what, i))
        if item_id in seen:
            raise ValueError(f"{what}: record {i} repeats id {item_id!r}")
        seen.add(item_id)
        truth = require_truth(r, "en_answer", what, i)
        items.append(Item(id=item_id, question=str(require(r, "en_question", what, i)), truth=truth))
    return items
