"""Rendering: every number of every family appears in the text, in every style and form; one number format."""

from __future__ import annotations

import re

import pytest
from trex.ordata.config import FAMILY_NAMES
from trex.ordata.generators import FAMILIES, derive_seed, sample_feasible
from trex.ordata.render import STYLES, fmt_num, render
from trex.ordata.render.text import FORMS


@pytest.mark.parametrize(("x", "text"), [
    (3.0, "3"), (-2.0, "-2"), (0.0, "0"), (-0.0, "0"), (2.5, "2.5"), (0.00001, "0.00001"), (1e-7, "0"),
    (1234567.0, "1234567"), (0.1 + 0.2, "0.3"), (12.340, "12.34"), (1e20, "100000000000000000000"),
])
def test_fmt_num_plain_decimals(x: float, text: str) -> None:
    assert fmt_num(x) == text


def test_fmt_num_rejects_non_finite() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        fmt_num(float("nan"))


def _present(num: str, text: str) -> bool:
    return re.search(rf"(?<![\d.]){re.escape(num)}(?!\.?\d)", text) is not None


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_parameter_number_is_rendered_in_every_style(family: str) -> None:
    for index in range(2):
        inst = sample_feasible(FAMILIES[family], derive_seed(3, family, index), 4 + index)[0]
        expected = [fmt_num(x) for p in inst.params.values() for x in p.flat()]
        texts = set()
        for style in STYLES:
            for form in FORMS:
                r = render(inst, style, form)
                texts.add(r.text)
                assert sorted(r.number_texts) == sorted(expected)
                missing = [n for n in expected if not _present(n, r.text)]
                assert not missing, (style, form, missing)
                assert not re.search(r"\d[eE][-+]?\d", r.text)
                assert not re.search(r"\d\.0(?!\d)", r.text)
                assert not re.search(r"[<>]\w>|[{}]", r.text.replace("->", ""))
        assert len(texts) == len(STYLES) * len(FORMS)


def test_render_rejects_unknown_style() -> None:
    inst = sample_feasible(FAMILIES["diet"], 1, 3)[0]
    with pytest.raises(ValueError, match="style"):
        render(inst, "poetic")  # type: ignore[arg-type]
