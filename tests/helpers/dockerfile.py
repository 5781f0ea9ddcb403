"""Read Dockerfiles the way the image tests need: instructions and the final stage."""

from __future__ import annotations

from pathlib import Path


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: comments dropped, continuation lines joined."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def final_stage(path: Path) -> list[tuple[str, str]]:
    """The instructions of the last ``FROM`` stage (the image that ships), its ``FROM`` first."""
    ins = instructions(path.read_text())
    last = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    return ins[last:]
