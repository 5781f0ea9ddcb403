"""Compose the problem statement from an instance's domain text and parameter templates.

Styles: ``formal`` (report prose), ``narrative`` (a story with connectives), ``bulleted`` (lists).
Forms: ``long`` (every number in a sentence of its own) and ``concise`` (compact lists).
Every parameter value goes through one :class:`NumberLog`, so the rendered numbers are known exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal, cast

from trex.ordata.ir import Instance, Param
from trex.ordata.render.numbers import NumberLog

Style = Literal["formal", "narrative", "bulleted"]
Form = Literal["long", "concise"]
STYLES: tuple[Style, ...] = ("formal", "narrative", "bulleted")
FORMS: tuple[Form, ...] = ("long", "concise")

_OPENERS = ("In addition, ", "Moreover, ", "Note also that ", "Furthermore, ", "On top of that, ", "Besides, ")
_ASK = {
    "formal": "Formulate this problem as a mathematical optimisation model and determine the optimal value.",
    "narrative": "Help them build an optimisation model and work out the best achievable value.",
    "bulleted": "Task: write the optimisation model and report the optimal objective value.",
}


@dataclass(frozen=True)
class Rendered:
    """The problem text and every number written into it (in order)."""

    text: str
    numbers: list[float]
    number_texts: list[str]
    style: Style
    form: Form


def _entities(inst: Instance, p: Param, axis: int) -> list[str]:
    return inst.sets[p.index[axis]]


def _sentence(template: str, e: str = "", f: str = "", v: str = "") -> str:
    return template.replace("<e>", e).replace("<f>", f).replace("<v>", v)


def _lower_first(s: str) -> str:
    return s[:1].lower() + s[1:] if s[:2] != s[:2].upper() else s


def _long_param(inst: Instance, p: Param, num: NumberLog) -> list[str]:
    v = p.value
    if not isinstance(v, list):
        return [_sentence(p.template, v=num(v))]
    rows = _entities(inst, p, 0)
    out: list[str] = []
    for i, row in enumerate(v):
        if isinstance(row, list):
            cols = _entities(inst, p, 1)
            out.extend(_sentence(p.template, rows[i], cols[j], num(float(x))) for j, x in enumerate(row))
        else:
            out.append(_sentence(p.template, rows[i], v=num(cast(float, row))))
    return out


def _compact_param(inst: Instance, p: Param, num: NumberLog, bullet: bool) -> list[str]:
    head = p.description[:1].upper() + p.description[1:]
    v = p.value
    if not isinstance(v, list):
        text = num(float(v))
        return [f"- {head}: {text}" if bullet else f"{head}: {text}."]
    rows = _entities(inst, p, 0)
    if v and isinstance(v[0], list):
        cols = _entities(inst, p, 1)
        lines = []
        for i, row in enumerate(v):
            assert isinstance(row, list)
            cells = ", ".join(f"{cols[j]} = {num(float(x))}" for j, x in enumerate(row))
            lines.append(f"- {head}, {rows[i]}: {cells}" if bullet else f"{head}, {rows[i]}: {cells}.")
        return lines
    cells = ", ".join(f"{rows[i]} = {num(cast(float, x))}" for i, x in enumerate(v) if not isinstance(x, list))
    return [f"- {head}: {cells}" if bullet else f"{head}: {cells}."]


def render(inst: Instance, style: Style = "formal", form: Form = "long") -> Rendered:
    """Render ``inst`` as a word problem; deterministic given the instance seed, style and form."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    rnd = random.Random(f"{inst.seed}:{style}:{form}")
    num = NumberLog()
    intro = inst.notes.get("intro", "")
    rules = [s for s in inst.notes.get("rules", "").split("\n") if s]
    objective = inst.notes.get("objective", "")
    parts: list[str] = []
    if form == "concise":
        parts.append(f"{inst.title}. {intro.split('. ')[0].rstrip('.')}.")
    elif style == "bulleted":
        parts.append(f"{inst.title}\n\n{intro}")
    else:
        parts.append(intro)
    data: list[str] = []
    for p in inst.params.values():
        if form == "long" and style != "bulleted":
            sentences = _long_param(inst, p, num)
            if style == "narrative" and data:
                sentences[0] = rnd.choice(_OPENERS) + _lower_first(sentences[0])
            data.append(" ".join(sentences))
        else:
            data.append("\n".join(_compact_param(inst, p, num, bullet=style == "bulleted")))
    if style == "bulleted":
        parts.append("Data:\n" + "\n".join(data))
        if rules:
            parts.append("Rules:\n" + "\n".join(f"- {s}" for s in rules))
        parts.append(f"Goal: {objective}")
    else:
        parts.append(("\n\n" if form == "long" else "\n").join(data))
        if rules:
            parts.append(" ".join(rules))
        lead = "Their goal: " if style == "narrative" else ""
        parts.append(lead + (_lower_first(objective) if lead else objective))
    parts.append(_ASK[style])
    return Rendered("\n\n".join(parts), num.values, num.texts, style, form)
