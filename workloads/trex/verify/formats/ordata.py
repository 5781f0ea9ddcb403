"""Held-out ORData samples: JSONL of ``{"id", "question", "answer"[, "family", "reference"]}``.

``answer`` is the solver-verified optimal objective (a number) or a status label
("infeasible", "unbounded"); ``family`` is the generator family used as category; ``reference`` is
the sample's reference answer (kept in ``Item.meta["reference"]``: the oracle check replays it, length
budgets measure it; it never enters a prompt).
"""

from __future__ import annotations

from trex.verify.items import Item, read_json_records, require, require_truth

REQUIRED = ("question", "answer")


def parse(data: bytes, what: str) -> list[Item]:
    """Items keyed by id (else line order); category = family."""
    items: list[Item] = []
    for i, r in enumerate(read_json_records(data, what)):
        truth = require_truth(r, "answer", what, i)
        items.append(Item(
            id=str(r.get("id", i)), question=str(require(r, "question", what, i)), truth=truth,
            category=str(r.get("family", "")),
            meta={"reference": str(r["reference"])} if isinstance(r.get("reference"), str) else {},
        ))
    return items
