"""Admission-time validation: the validating webhook answers with the lines `trex validate` prints.

The API server's schema (and the CRDs' CEL rules) catch what a schema can express; the webhook adds the
rules only the models know (parallel folding, expert divisibility, device counts, the memory plan), so
an invalid job is refused at `kubectl apply` instead of failing later with reason InvalidSpec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trex_operator.api import KIND_INFO

PATH_PREFIX = "validate-"
"""kopf serves each handler at /<handler id>; the chart's ValidatingWebhookConfiguration uses these."""


def handler_id(kind: str) -> str:
    """The kopf handler id (and webhook URL path) of one kind: ``validate-trainjobs``."""
    return PATH_PREFIX + KIND_INFO[kind].plural


def denial(body: Mapping[str, Any]) -> str | None:
    """The message that refuses ``body`` (each problem as `trex validate` prints it, without the file
    name, joined by "; "), or None when the job is valid."""
    from trex_operator.validate import check_document

    doc = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    problems = check_document("", 0, doc).problems
    if not problems:
        return None
    return "; ".join(f"{p.obj}: {p.path}: {p.message}" for p in problems)
