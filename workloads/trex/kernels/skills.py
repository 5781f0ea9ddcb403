"""Stage 3: every verified gain becomes a skill (kernel class, regime, shape bucket, device, direction,
parameter change, measured gain) in a JSONL library; later searches retrieve matching skills to order
their moves."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Skill:
    """One verified improvement, stated so that it can transfer to a related kernel or shape."""

    kernel: str
    kclass: str
    regime: str
    bucket: str
    device: str
    backend: str
    direction: str
    param: str
    old: int
    new: int
    gain: float


@dataclass(frozen=True)
class Context:
    """What a search is about, for matching skills."""

    kernel: str
    kclass: str
    regime: str
    bucket: str
    device: str
    backend: str


def similarity(s: Skill, c: Context) -> float:
    """0 when unrelated (other backend, or other class and other kernel); else 1 + shared attributes."""
    if s.backend != c.backend or (s.kclass != c.kclass and s.kernel != c.kernel):
        return 0.0
    return 1.0 + sum((s.kernel == c.kernel, s.regime == c.regime, s.bucket == c.bucket, s.device == c.device))


class SkillLibrary:
    """Append-only JSONL file of skills (one line per skill; writes are single appends + fsync)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self) -> list[Skill]:
        """All readable skills (a torn last line from a crash is skipped)."""
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(Skill(**json.loads(line)))
            except (json.JSONDecodeError, TypeError):
                continue
        return out

    def add(self, skills: Iterable[Skill]) -> None:
        """Append skills durably."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            for s in skills:
                fh.write(json.dumps(asdict(s), sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def retrieve(self, ctx: Context) -> list[tuple[Skill, float]]:
        """Matching skills with their similarity weight, most similar first."""
        scored = [(s, similarity(s, ctx)) for s in self.load()]
        return sorted([x for x in scored if x[1] > 0], key=lambda x: -x[1])


def move_scores(matches: Iterable[tuple[Skill, float]]) -> tuple[dict[tuple[str, int], float], dict[str, float]]:
    """Scores for exact moves (param, new value) and for parameters: sum of weight * log(gain)."""
    exact: dict[tuple[str, int], float] = {}
    by_param: dict[str, float] = {}
    for s, w in matches:
        v = w * math.log(max(s.gain, 1.0 + 1e-9))
        exact[(s.param, s.new)] = exact.get((s.param, s.new), 0.0) + v
        by_param[s.param] = by_param.get(s.param, 0.0) + v
    return exact, by_param
