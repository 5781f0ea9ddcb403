"""Scoring protocols: named, versioned answer-matching rules (the rule text is also printed in reports).

Every protocol takes one sample per attempt and never retries with ground-truth knowledge (no flipped
variable types, senses or directions). They differ only in how a reported number is compared with a
published one. Shared by all protocols, the *label rule*: a ground truth that is a status ("No Best
Solution", "infeasible", ...) is matched only by a program that reports a matching non-optimal
status, never by a number:

* "No Best Solution" / "infeasible or unbounded" (the dataset does not say which) <- infeasible,
  unbounded or infeasible_or_unbounded;
* "infeasible" <- infeasible;  "unbounded" <- unbounded.

Items with several named results (OptiBench, NL4OPT-E) are correct when *every* named value is
reported (same name, compared case- and punctuation-insensitively) and matches under the protocol's
number rule. Protocols:

``strict`` v1 (this project's default): |pred - gt| / (|gt| + 1) < 1e-6.

``sirl`` v1: the SIRL / OptMATH tolerance, "a solution is considered valid if the relative error is
less than 1e-6" (SIRL README; check_result.py in Cardinal-Operations/SIRL computes
|pred - gt| / (|gt| + 1) < 1e-6). Numerically the same as ``strict``. Deliberately NOT reproduced
from that script: its retry that re-runs a mismatching program with variable types changed
(``change_variable_types``, a ground-truth-aware second attempt), counting a timeout as correct
when the answer is "No Best Solution", and accepting any output containing "nfeasible" for it;
here the shared label rule applies instead.

``orlm`` v1: the ORLM harness rule (eval/execute.py in Cardinal-Operations/ORLM, arXiv 2405.17743;
used for NL4OPT, MAMO and IndustryOR): round prediction and answer to integers; with a rounded
answer g != 0 correct when |round(p) - g| / |g| <= 0.05, with g = 0 when |round(p)| <= 0.05. ORLM
matches "No Best Solution" with any non-optimal solver status; here the shared label rule applies.
ORLM's pass@k is "any of k samples"; scores here use the unbiased estimator for every protocol.

``mamo`` v1: the MAMO rule (FreedomIntelligence/Mamo, arXiv 2405.13144): relative error <= 1e-4
(absolute when gt = 0), or an absolute difference below one unit of the answer's printed precision
(answer "8350" -> < 1, "57.0" -> < 0.1).

``optibench`` v1: the ReSocratic/OptiBench rule (yangzhch6/ReSocratic, arXiv 2407.09887): every
value within 1e-4 absolute.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from trex.verify.items import Item, Truth

PROTOCOL_NAMES = ("strict", "orlm", "mamo", "optibench", "sirl")
STATUSES = ("optimal", "infeasible", "unbounded", "infeasible_or_unbounded")

_STATUS_SYNONYMS = {
    "optimal": "optimal", "opt": "optimal",
    "infeasible": "infeasible", "inf": "infeasible",
    "unbounded": "unbounded", "unbd": "unbounded",
    "infeasible_or_unbounded": "infeasible_or_unbounded", "inf_or_unbd": "infeasible_or_unbounded",
    "infeasible or unbounded": "infeasible_or_unbounded", "unbounded_or_infeasible": "infeasible_or_unbounded",
}
_LABEL_MATCHES: dict[str, frozenset[str]] = {
    "no_solution": frozenset({"infeasible", "unbounded", "infeasible_or_unbounded"}),
    "infeasible_or_unbounded": frozenset({"infeasible", "unbounded", "infeasible_or_unbounded"}),
    "infeasible": frozenset({"infeasible"}),
    "unbounded": frozenset({"unbounded"}),
}


def normalise_status(status: object) -> str:
    """A reported status in the protocol vocabulary (unknown spellings pass through lowercased)."""
    s = str(status).strip().lower() if status is not None else ""
    return _STATUS_SYNONYMS.get(s, s)


def _strict(p: float, t: Truth) -> bool:
    assert t.value is not None
    return abs(p - t.value) / (abs(t.value) + 1.0) < 1e-6


def _orlm(p: float, t: Truth) -> bool:
    assert t.value is not None
    rp, rg = round(p), round(t.value)
    return abs(rp - rg) <= 0.05 * abs(rg)


def _mamo(p: float, t: Truth) -> bool:
    assert t.value is not None
    diff = abs(p - t.value)
    rel = diff / abs(t.value) if t.value != 0 else diff
    if rel <= 1e-4:
        return True
    return t.decimals is not None and diff < 10.0 ** (-t.decimals)


def _optibench(p: float, t: Truth) -> bool:
    assert t.value is not None
    return abs(p - t.value) <= 1e-4


@dataclass(frozen=True)
class Protocol:
    """A named, versioned answer-matching rule."""

    name: str
    version: str
    rule: str
    number: Callable[[float, Truth], bool] = field(repr=False)

    @property
    def tag(self) -> str:
        """name@version, as recorded in every sample."""
        return f"{self.name}@v{self.version}"


PROTOCOLS: dict[str, Protocol] = {
    "strict": Protocol("strict", "1", "|pred - gt| / (|gt| + 1) < 1e-6; status labels matched only by status", _strict),
    "sirl": Protocol("sirl", "1", "SIRL/OptMATH: |pred - gt| / (|gt| + 1) < 1e-6", _strict),
    "orlm": Protocol("orlm", "1", "ORLM: round both to integers, relative error <= 5 %", _orlm),
    "mamo": Protocol("mamo", "1", "MAMO: relative error <= 1e-4 or |pred - gt| below one unit of gt's printed precision",
                     _mamo),
    "optibench": Protocol("optibench", "1", "OptiBench: every named value within 1e-4 absolute", _optibench),
}


def get_protocol(name: str) -> Protocol:
    """Protocol by name; ValueError lists the known ones."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; known: {', '.join(PROTOCOLS)}") from None


@dataclass(frozen=True)
class Prediction:
    """What a program reported on its TREX_RESULT line."""

    status: str
    objective: float | None = None
    values: dict[str, float] = field(default_factory=dict)


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", name.lower()).strip()


def _finite(x: float | None) -> bool:
    return x is not None and isinstance(x, int | float) and math.isfinite(x)


def match_truth(protocol: Protocol, status: str, value: float | None, truth: Truth) -> bool:
    """One reported (status, value) against one ground truth under ``protocol``."""
    status = normalise_status(status)
    if truth.status == "optimal":
        return status == "optimal" and _finite(value) and protocol.number(float(value), truth)  # type: ignore[arg-type]
    allowed = _LABEL_MATCHES.get(truth.status)
    return allowed is not None and status in allowed


def judge(protocol: Protocol, item: Item, pred: Prediction) -> tuple[bool, str]:
    """(correct, one-line reason) for ``pred`` on ``item``; the item's ground truth decides."""
    if item.named:
        reported = {_key(k): v for k, v in pred.values.items()}
        for name, truth in item.named.items():
            if truth.status != "optimal":
                if not match_truth(protocol, pred.status, None, truth):
                    return False, f"{name!r}: expected status {truth.status}, got {pred.status}"
                continue
            if normalise_status(pred.status) != "optimal":
                return False, f"status {pred.status!r}, expected optimal"
            v = reported.get(_key(name))
            if v is None:
                return False, f"value {name!r} not reported"
            if not match_truth(protocol, "optimal", v, truth):
                return False, f"{name!r}: {v!r} vs {truth.raw}"
        return True, "all named values match"
    if item.truth is None:
        return False, "item has no ground truth"
    ok = match_truth(protocol, pred.status, pred.objective, item.truth)
    if ok:
        return True, "match"
    if item.truth.status == "optimal":
        return False, f"{pred.status} {pred.objective!r} vs {item.truth.raw}"
    return False, f"expected status {item.truth.status}, got {pred.status} {pred.objective!r}"
