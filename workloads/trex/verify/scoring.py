"""Verdicts and scores: failure categories of one sample, unbiased pass@k, per-benchmark aggregates.

Categories, decided in this order (first that applies):

* ``no_code``: no code could be extracted (see :mod:`trex.verify.extract`);
* ``syntax_error``: the code does not compile;
* ``timeout``: the program ran past the wall-clock or CPU limit;
* ``import_error``: it exited with ModuleNotFoundError/ImportError, or an AttributeError on a module
  or solver API object (an API the installed library does not have);
* ``solver_error``: a solver exception (GurobiError, licence limits, no solution to query), or a
  reported status other than optimal/infeasible/unbounded (time_limit, suboptimal, error);
* ``runtime_error``: any other non-zero exit or signal, or exit 0 without a valid TREX_RESULT line;
* ``no_solver_call``: exit 0, but the sandbox recorded no solve (or none that its own re-solve of the
  recorded model confirms), so a printed TREX_RESULT is not believed (unless the run accepts printed
  answers, ``acceptPrintedAnswers``);
* ``infeasible`` / ``unbounded``: it reported infeasible (resp. unbounded or infeasible-or-unbounded)
  where the ground truth says otherwise;
* ``wrong_objective``: it reported an optimum (or values) that the protocol does not accept;
* ``correct``: the protocol accepts the report.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trex.verify.items import Item
from trex.verify.protocols import Prediction, Protocol, judge, normalise_status

# Ordered from "furthest from working" to "right".
CATEGORIES: tuple[str, ...] = (
    "no_code", "syntax_error", "import_error", "runtime_error", "no_solver_call", "solver_error", "timeout",
    "infeasible", "unbounded", "wrong_objective", "correct",
)

_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)|[A-Za-z_][\w.]*Error)\b(:.*)?$")
_IMPORT_EXC = {"ModuleNotFoundError", "ImportError"}
_SYNTAX_EXC = {"SyntaxError", "IndentationError", "TabError"}
_SOLVER_EXC = {"GurobiError", "HighsError", "PulpSolverError", "CplexError", "CoptError", "SolverError",
               "ApplicationError"}
_SOLVER_MODULES = ("gurobipy", "highspy", "pulp", "pyomo", "ortools", "cvxpy", "scipy.optimize", "coptpy", "mip")
# Solver API objects: "'Model' object has no attribute 'addVarr'" is an API error, not a logic error.
_API_OBJECT = re.compile(r"^'(Model|Var|Constr|QConstr|LinExpr|QuadExpr|MVar|MConstr|MLinExpr|tupledict|tuplelist|Env|"
                         r"Highs|HighsLp|HighsInfo|HighsOptions|highs_var|highs_linear_expression|LpProblem|"
                         r"LpVariable|ConcreteModel|Solver)' object has no attribute")


@dataclass(frozen=True)
class Execution:
    """The parts of a sandbox run that decide a verdict."""

    exit_code: int | None
    timed_out: bool
    stderr: str
    result: Mapping[str, Any] | None
    signal: int | None = None
    unrecorded: str | None = None
    """Why no solver-recorded answer exists (then ``result`` is ignored); None when it does."""


@dataclass(frozen=True)
class Verdict:
    """Category and one-line reason of one sample."""

    category: str
    reason: str

    @property
    def correct(self) -> bool:
        """True for the category ``correct``."""
        return self.category == "correct"


def last_exception(stderr: str) -> tuple[str, str]:
    """(exception class name without module, message) of the last traceback line in ``stderr``."""
    for line in reversed(stderr.strip().splitlines()):
        m = _EXC_LINE.match(line.strip())
        if m:
            return m.group(1).rsplit(".", 1)[-1], (m.group(2) or "")[1:].strip()
    return "", ""


def classify_failure(stderr: str) -> tuple[str, str]:
    """Category of a program that exited non-zero, from its traceback."""
    exc, msg = last_exception(stderr)
    where = f"{exc}: {msg}"[:300] if exc else (stderr.strip().splitlines() or ["no output"])[-1][:300]
    if exc in _IMPORT_EXC:
        return "import_error", where
    if exc == "AttributeError" and msg.startswith("Unable to retrieve attribute"):
        return "solver_error", where  # gurobipy: solution queried but the solver has none
    if exc == "AttributeError" and (msg.startswith("module ") or _API_OBJECT.match(msg)
                                    or any(mod in msg for mod in _SOLVER_MODULES)):
        return "import_error", where  # an API the installed library does not have
    if exc in _SYNTAX_EXC:
        return "syntax_error", where
    if exc in _SOLVER_EXC:
        return "solver_error", where
    return "runtime_error", where


def classify(code: str | None, syntax_error: str | None, execution: Execution | None,
             protocol: Protocol, item: Item) -> tuple[Verdict, Prediction | None]:
    """The verdict of one sample (and the parsed prediction, when the program reported one)."""
    if code is None:
        return Verdict("no_code", "no code block in the response"), None
    if syntax_error is not None:
        return Verdict("syntax_error", syntax_error), None
    if execution is None:
        return Verdict("runtime_error", "not executed"), None
    if execution.timed_out:
        return Verdict("timeout", "execution time limit reached"), None
    if execution.exit_code != 0:
        if execution.signal is not None and execution.signal != 0:
            return Verdict("runtime_error", f"killed by signal {execution.signal}"), None
        cat, why = classify_failure(execution.stderr)
        return Verdict(cat, why), None
    if execution.unrecorded is not None:
        return Verdict("no_solver_call", execution.unrecorded), None
    res = execution.result
    if not isinstance(res, Mapping):
        return Verdict("runtime_error", "exited 0 without a TREX_RESULT line"), None
    pred = prediction_from_result(res)
    if pred is None:
        return Verdict("runtime_error", f"malformed TREX_RESULT: {str(dict(res))[:200]}"), None
    ok, why = judge(protocol, item, pred)
    if ok:
        return Verdict("correct", why), pred
    status = normalise_status(pred.status)
    if status == "optimal":
        return Verdict("wrong_objective", why), pred
    if status == "infeasible":
        return Verdict("infeasible", why), pred
    if status in ("unbounded", "infeasible_or_unbounded"):
        return Verdict("unbounded", why), pred
    return Verdict("solver_error", f"solver status {pred.status!r}"), pred


def prediction_from_result(res: Mapping[str, Any]) -> Prediction | None:
    """TREX_RESULT dict -> Prediction (None when its fields have the wrong types)."""
    status = res.get("status")
    if not isinstance(status, str):
        return None
    obj = res.get("objective")
    if obj is not None and (isinstance(obj, bool) or not isinstance(obj, int | float)):
        try:
            obj = float(obj)
        except (TypeError, ValueError):
            return None
    values: dict[str, float] = {}
    raw_values = res.get("values") or {}
    if not isinstance(raw_values, Mapping):
        return None
    for k, v in raw_values.items():
        try:
            values[str(k)] = float(v)
        except (TypeError, ValueError):
            continue
    return Prediction(status, float(obj) if obj is not None else None, values)


def syntax_check(code: str) -> str | None:
    """None when ``code`` compiles, else 'SyntaxError: msg (line N)'."""
    try:
        compile(code, "<candidate>", "exec")
    except SyntaxError as e:
        return f"{type(e).__name__}: {e.msg} (line {e.lineno})"
    except ValueError as e:  # null bytes
        return f"SyntaxError: {e}"
    return None


# --- pass@k ----------------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), as a stable product."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def wilson_interval(successes: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion (for Pass@1 error bars)."""
    if total == 0:
        return 0.0, 0.0
    p = successes / total
    den = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / den
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def aggregate(records: Iterable[Mapping[str, Any]], ks: Iterable[int]) -> dict[str, Any]:
    """Per-benchmark scores from sample records (keys: benchmark, item_id, category, item_category,
    and for Bench4Opt ``structural`` and ``truth_status``)."""
    by_bench: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        by_bench[str(r["benchmark"])].append(r)
    out: dict[str, Any] = {}
    ks = sorted(set(ks))
    for bench, recs in sorted(by_bench.items()):
        per_item: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for r in recs:
            per_item[str(r["item_id"])].append(r)
        cats = Counter(str(r["category"]) for r in recs)
        scores: dict[str, Any] = {
            "items": len(per_item), "samples": len(recs),
            "categories": {c: cats.get(c, 0) for c in CATEGORIES},
        }
        for k in ks:
            vals = [pass_at_k(len(v), sum(1 for r in v if r["category"] == "correct"), k)
                    for v in per_item.values() if len(v) >= k]
            scores[f"pass@{k}"] = sum(vals) / len(vals) if vals else None
        first = [v for v in per_item.values()]
        c1 = sum(sum(1 for r in v if r["category"] == "correct") / len(v) for v in first)
        lo, hi = wilson_interval(round(c1), len(first))
        scores["pass@1_ci95"] = [lo, hi]
        groups: dict[str, list[list[Mapping[str, Any]]]] = defaultdict(list)
        for v in per_item.values():
            groups[str(v[0].get("item_category") or "-")].append(v)
        by_cat: dict[str, dict[str, Any]] = {}
        for g, item_recs in sorted(groups.items()):
            entry: dict[str, Any] = {"items": len(item_recs)}
            for k in ks:
                vals = [pass_at_k(len(v), sum(1 for r in v if r["category"] == "correct"), k)
                        for v in item_recs if len(v) >= k]
                entry[f"pass@{k}"] = sum(vals) / len(vals) if vals else None
            by_cat[g] = entry
        scores["by_category"] = by_cat
        structural = [r for r in recs if r.get("structural") is not None]
        if structural:
            scores["structural_accuracy"] = sum(1 for r in structural if r["structural"]) / len(structural)
            feasible = [r for r in recs if r.get("truth_status") == "optimal"]
            scores["objective_accuracy_feasible"] = (
                sum(1 for r in feasible if r["category"] == "correct") / len(feasible) if feasible else None)
            scores["feasible_samples"] = len(feasible)
        out[bench] = scores
    return out
