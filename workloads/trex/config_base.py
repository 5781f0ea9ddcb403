"""Shared base for every workload config model: strict types, unknown fields rejected, camelCase keys.

The same YAML section is read by `trex <command> --config` locally and by the operator from a job's
spec, so both go through :func:`load_section` (aliases only, exactly as the CRD schema spells them).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class TrexModel(BaseModel):
    """Base model: strict, extra fields forbidden, camelCase aliases, field docstrings as descriptions."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        validate_default=False,
    )


M = TypeVar("M", bound=BaseModel)


def load_section(model: type[M], data: Any) -> M:
    """Validate a mapping with the CRD spelling (camelCase aliases only) into ``model``."""
    return model.model_validate(data, by_alias=True, by_name=False)


def load_yaml_config(model: type[M], path: str | Path, section: str | None = None) -> M:
    """Read a YAML file (optionally one top-level section of it) and validate it into ``model``."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if data is None:
        data = {}
    if section is not None and isinstance(data, dict) and section in data:
        data = data[section]
    return load_section(model, data)


def check_dns1123_label(value: str, what: str = "name") -> str:
    """Raise ValueError unless ``value`` is a valid DNS-1123 label (lowercase, digits, '-', <= 63)."""
    if len(value) > 63 or not DNS1123_LABEL.match(value):
        lead = f"{what} " if what else ""
        raise ValueError(
            f"{lead}{value!r} is not a valid DNS-1123 label "
            "(lowercase letters, digits and '-', starting and ending alphanumeric, at most 63 characters)"
        )
    return value


def format_validation_error(err: ValidationError, prefix: str = "") -> list[str]:
    """One line per problem: dotted field path, what is wrong, and what is allowed."""
    lines: list[str] = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        path = ".".join(p for p in (prefix, loc) if p)
        msg = e["msg"]
        if e["type"] == "value_error":
            # Validators phrase problems as "<relative.field>: what is wrong; allowed ...", several
            # joined by newlines, each starting with its field path.
            text = msg.removeprefix("Value error, ")
            parts = _split_problems(text)
            for sub, detail in parts:
                full = ".".join(p for p in (prefix, loc, sub) if p)
                lines.append(f"{full or '<root>'}: {detail}")
            continue
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; fields are camelCase)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "literal_error":
            msg = f"invalid value {e.get('input')!r}; {e['msg'].replace('Input should be', 'allowed:')}"
        elif e["type"].endswith("_type"):
            msg = f"wrong type ({type(e.get('input')).__name__}): {e['msg'].replace('Input should be', 'expected')}"
        lines.append(f"{path or '<root>'}: {msg.replace('Input should be', 'must be')}")
    return lines


_FIELD_LEAD = re.compile(r"^([A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*): (.*)$", re.S)


def _split_problems(text: str) -> list[tuple[str, str]]:
    """Split "a.b: msg\\nc: msg2" into [("a.b", "msg"), ("c", "msg2")]; text without a lead path -> [("", text)]."""
    chunks = text.split("\n")
    if len(chunks) > 1 and all(_FIELD_LEAD.match(c) for c in chunks):
        out = []
        for c in chunks:
            m = _FIELD_LEAD.match(c)
            assert m is not None
            out.append((m.group(1), m.group(2)))
        return out
    m = _FIELD_LEAD.match(text)
    if m and " " not in m.group(1):
        return [(m.group(1), m.group(2))]
    return [("", text)]
