"""The single number formatter of rendered text: plain decimals, no exponents, no trailing zeros."""

from __future__ import annotations

import math


def fmt_num(x: float, max_decimals: int = 6) -> str:
    """Format ``x`` as plain decimal text: integral values without ".0", others with at most ``max_decimals``.

    >>> fmt_num(3.0), fmt_num(0.00001), fmt_num(2.50), fmt_num(-0.0)
    ('3', '0.00001', '2.5', '0')
    """
    if not math.isfinite(x):
        raise ValueError(f"cannot render a non-finite number: {x!r}")
    if abs(x - round(x)) < 10.0 ** (-max_decimals - 3) * max(1.0, abs(x)):
        v = round(x)
        return str(v) if v != 0 else "0"
    text = f"{x:.{max_decimals}f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


class NumberLog:
    """Formats numbers with :func:`fmt_num` and remembers every number it rendered (for the Reviewer gate)."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self.texts: list[str] = []

    def __call__(self, x: float) -> str:
        text = fmt_num(float(x))
        self.values.append(float(x))
        self.texts.append(text)
        return text
