"""OptiBench and NL4OPT-E (ReSocratic release): JSON list of ``{"question", "index", "type", "results"}``.

``results`` maps a description ("Maximized number of fish transported") to a numeric string; every
named value is ground truth, so items carry them in ``Item.named`` and no single objective.
"""

from __future__ import annotations

from trex.verify.items import Item, Truth, parse_truth, read_json_records, require

REQUIRED = ("question", "results")


def parse(data: bytes, what: str) -> list[Item]:
    """Items keyed by index; category = type (linear-notable, nonlinear-table, ...)."""
    items: list[Item] = []
    for i, r in enumerate(read_json_records(data, what)):
        results = require(r, "results", what, i)
        if not isinstance(results, dict) or not results:
            raise ValueError(f"{what}: record {i} results must be a non-empty object")
        named: dict[str, Truth] = {}
        for k, v in results.items():
            try:
                named[str(k)] = parse_truth(v)
            except ValueError as e:
                raise ValueError(f"{what}: record {i} results[{k!r}]: {e}") from e
        items.append(Item(
            id=str(r.get("index", i)), question=str(require(r, "question", what, i)), truth=None,
            named=named, category=str(r.get("type", "")),
        ))
    return items
