"""Code extraction from a model response; the rules, in order (first that applies wins):

1. the last fenced block tagged ``python``, ``py`` or ``python3`` (```` ```python ... ``` ````);
2. an opening ```` ```python ```` fence that is never closed (a response cut by max_tokens): the rest
   of the response after it;
3. the last untagged fenced block (```` ``` ... ``` ````);
4. the whole response, when it compiles as Python and contains an ``import`` statement (models that
   answer with bare code);
5. otherwise no code: the sample is scored ``no_code``.

Blocks tagged with another language (```` ```json ````, ```` ```text ````) are never taken.
"""

from __future__ import annotations

import re

EXTRACT_VERSION = "1"
_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
_OPEN_PY = re.compile(r"^[ \t]*```[ \t]*(python3?|py)[ \t]*\n", re.M | re.I)
_PY_TAGS = {"python", "py", "python3"}


def extract_code(response: str) -> tuple[str | None, str]:
    """(code or None, the rule that produced it)."""
    blocks = [(m.group(1).lower(), m.group(2), m.end()) for m in _FENCE.finditer(response)]
    tagged = [b for b in blocks if b[0] in _PY_TAGS]
    if tagged:
        code, end = tagged[-1][1], tagged[-1][2]
        # A later unclosed python fence (truncated answer) supersedes the closed one.
        tail = _OPEN_PY.search(response, end)
        if tail is not None:
            return response[tail.end():], "unclosed-python-fence"
        return code, "python-fence"
    opened = list(_OPEN_PY.finditer(response))
    if opened:
        return response[opened[-1].end():], "unclosed-python-fence"
    plain = [b for b in blocks if b[0] == ""]
    if plain:
        return plain[-1][1], "plain-fence"
    text = response.strip()
    if text and re.search(r"^\s*(import|from)\s+\w", text, re.M):
        try:
            compile(text, "<response>", "exec")
        except (SyntaxError, ValueError):
            return None, "none"
        return text + "\n", "bare-code"
    return None, "none"
