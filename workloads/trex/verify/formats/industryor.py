"""IndustryOR (original ORLM release and the corrected 'fixed' variant share the format).

JSONL, one ``{"en_question", "en_answer", "difficulty"[, "id"]}`` object a line; difficulty
(Easy / Medium / Hard) is the category; answers may be 'No Best Solution'. Corrected releases
(e.g. SIRL's test_data/IndustryOR_fixed.json) drop ``difficulty``; their items get no category.
"""

from __future__ import annotations

from trex.verify.items import Item, read_json_records, require, require_truth

REQUIRED = ("en_question", "en_answer")
DETECT = ("en_question", "en_answer", "difficulty")


def parse(data: bytes, what: str) -> list[Item]:
    """Items keyed by id when present, else by line order; category = difficulty."""
    items: list[Item] = []
    for i, r in enumerate(read_json_records(data, what)):
        truth = require_truth(r, "en_answer", what, i)
        items.append(Item(
            id=str(r.get("id", i)), question=str(require(r, "en_question", what, i)), truth=truth,
            category=str(r.get("difficulty", "")),
        ))
    return items
