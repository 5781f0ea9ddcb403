"""NL4OPT as published by OptMATH: JSONL, one ``{"en_question", "en_answer"}`` object a line."""

from __future__ import annotations

from trex.verify.items import Item, read_json_records, require, require_truth

REQUIRED = ("en_question", "en_answer")


def parse(data: bytes, what: str) -> list[Item]:
    """Items numbered by line order (the file has no ids); answers may be 'No Best Solution'."""
    items: list[Item] = []
    for i, r in enumerate(read_json_records(data, what)):
        q = require(r, "en_question", what, i)
        truth = require_truth(r, "en_answer", what, i)
        items.append(Item(id=str(r.get("id", i)), question=str(q), truth=truth))
    return items
