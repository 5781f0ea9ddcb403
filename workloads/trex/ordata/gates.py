"""Quality gates of the ORData pipeline: pure decisions with one reason code per rejection.

Order in the pipeline: :class:`Cleaner` -> :func:`ast_gate` (static contract of the generated code)
-> :func:`review_gate` (rule-based checks of text and formulation; :func:`llm_review` optionally)
-> sandbox run -> :func:`execution_gate` (the solve the sandbox *recorded* from the solver, not a
printed line) -> :func:`structural_gate` (the recorded model is the instance's model, by ORGEval
equivalence) -> :func:`objective_gate` (the recorded objective agrees with the reference solve). Failures of the LLM reconstructor (:mod:`trex.ordata.llm_reconstruct`) use the ``llm.*``
codes. Every reason code is listed in :data:`REASONS`, the label values of
``trex_ordata_samples_total{outcome}`` besides ``accepted``.
"""

from __future__ import annotations

import ast
import math
import re
import textwrap
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from trex.verify.imports import called_name, import_problem

if TYPE_CHECKING:
    from trex.ordata.config import EndpointConfig
    from trex.ordata.ir import Instance
    from trex.verify.orgeval import LinearModel

ACCEPTED = "accepted"

REASONS: dict[str, str] = {
    "ast.syntax_error": "the code does not parse",
    "ast.forbidden_import": "the code imports a module outside the allow-list",
    "ast.forbidden_call": "the code calls a function that touches files, processes, the network or dynamic code",
    "ast.forbidden_attribute": "the code reaches a private or dunder attribute, a module as a value or a name outside the allow-list",
    "ast.no_solver_call": "the code never calls a solver (gurobipy .optimize(), highspy .run()/.minimize()/.maximize())",
    "ast.no_protocol_output": "the code never prints the TREX_RESULT protocol line",
    "exec.timeout": "the program ran past its wall-clock or CPU limit",
    "exec.resource_limit": "the program hit a memory, output, file-size or process limit",
    "exec.runtime_error": "the program exited with an error",
    "exec.no_result": "the recorded solve is optimal but has no objective",
    "exec.forged_record": "a solve record the sandbox's solver recorder did not write (the run's records are refused)",
    "exec.no_solver_call": "the sandbox recorded no gurobipy/highspy solve (a printed TREX_RESULT does not count)",
    "structure.no_model": "the recorded solve carries no model text (larger than the cap, or not writable)",
    "structure.mismatch": "the recorded model is not the instance's model (ORGEval equivalence)",
    "exec.solver_status": "the program's solver status is not optimal",
    "objective.missing": "no objective to compare",
    "objective.mismatch": "the objective differs from the reference beyond tolerance",
    "review.too_short": "the problem text is shorter than the minimum",
    "review.too_long": "the problem text is longer than the maximum",
    "review.template_marker": "the problem text contains leftover template markers",
    "review.missing_number": "a number of the instance does not appear in the problem text",
    "review.formulation_incomplete": "the formulation lacks a variables, objective or constraints section",
    "review.llm_rejected": "the LLM reviewer rejected the sample",
    "review.llm_error": "the LLM reviewer could not be reached or gave no verdict",
    "llm.no_code": "the reconstructing LLM's answer holds no fenced python code block",
    "llm.http_error": "the reconstruction endpoint failed (after retries for transient errors) or sent a malformed body",
    "llm.timeout": "the reconstruction request ran past the endpoint's timeout",
}


@dataclass(frozen=True)
class GateResult:
    """Outcome of one gate: accepted, or rejected with a reason code from :data:`REASONS`."""

    accepted: bool
    reason: str | None
    detail: str = ""

    @property
    def outcome(self) -> str:
        """``accepted`` or the reason code (the metric label)."""
        return ACCEPTED if self.accepted else str(self.reason)


def accept(detail: str = "") -> GateResult:
    """An accepting result."""
    return GateResult(True, None, detail)


def reject(reason: str, detail: str = "") -> GateResult:
    """A rejection; ``reason`` must be a registered code."""
    if reason not in REASONS:
        raise ValueError(f"unknown gate reason {reason!r}; known: {', '.join(sorted(REASONS))}")
    return GateResult(False, reason, detail)


# --- cleaner --------------------------------------------------------------------------------------
_ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-",
                         "\u2212": "-"})
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


class Cleaner:
    """Normalises generated text and code before the gates look at them."""

    def clean_text(self, text: str) -> str:
        """NFKC, plain quotes and dashes, no zero-width characters, LF line endings, single spaces,
        no trailing blanks, at most one empty line in a row."""
        t = unicodedata.normalize("NFKC", text.replace("\r\n", "\n").replace("\r", "\n"))
        t = t.translate(_ZERO_WIDTH).translate(_QUOTES)
        lines = [re.sub(r"[ \t]+", " ", ln).strip() for ln in t.split("\n")]
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"

    def clean_code(self, code: str) -> str:
        """Strip markdown fences (the last python block wins), LF endings, dedent, no trailing blanks."""
        c = code.replace("\r\n", "\n").replace("\r", "\n").translate(_ZERO_WIDTH)
        blocks = _FENCE.findall(c)
        if blocks:
            py = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
            c = (py or [body for _, body in blocks])[-1]
        c = textwrap.dedent(c.expandtabs(4))
        lines = [ln.rstrip() for ln in c.split("\n")]
        while lines and not lines[0]:
            lines.pop(0)
        return "\n".join(lines).rstrip() + "\n"


# --- AST contract -----------------------------------------------------------------------------------
SOLVER_METHODS = frozenset({"optimize", "run", "minimize", "maximize"})
PROTOCOL_MARK = "TREX_RESULT"


def _mentions_protocol(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and PROTOCOL_MARK in n.value
               for n in ast.walk(node))


def import_gate(code: str, solver: str | None = None) -> GateResult:
    """The import contract (:func:`trex.verify.imports.import_problem`) as a gate: ``ast.*`` reason codes."""
    problem = import_problem(code, solver)
    return accept() if problem is None else reject(f"ast.{problem[0]}", problem[1])


def ast_gate(code: str, solver: str | None = None) -> GateResult:
    """Static contract: :func:`import_gate` (allowed names only), a solver call, the TREX_RESULT line printed."""
    g = import_gate(code, solver)
    if not g.accepted:
        return g
    tree = ast.parse(code)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    if not any(called_name(c)[1] in SOLVER_METHODS for c in calls):
        return reject("ast.no_solver_call", "no .optimize(), .run(), .minimize() or .maximize() call")
    if not any(called_name(c)[0] == "print" and _mentions_protocol(c) for c in calls):
        return reject("ast.no_protocol_output", f"no print(...) of a {PROTOCOL_MARK} line")
    return accept()


# --- execution and objective -------------------------------------------------------------------------
class RunLike(Protocol):
    """What the execution gate reads from a sandbox result (:class:`trex.sandbox.SandboxResult`)."""

    @property
    def exit_code(self) -> int | None: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def killed_reason(self) -> str | None: ...
    @property
    def stderr(self) -> str: ...
    @property
    def solve(self) -> dict[str, Any] | None: ...
    @property
    def records_refused(self) -> str | None: ...
    @property
    def ok(self) -> bool: ...


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def execution_gate(run: RunLike) -> GateResult:
    """The program ran to completion and the solve the sandbox recorded from its solver is optimal."""
    if run.timed_out or run.killed_reason == "cpu_limit":
        return reject("exec.timeout", run.killed_reason or "timeout")
    if run.killed_reason in ("memory_limit", "output_limit", "file_size_limit", "disk_limit", "process_limit"):
        return reject("exec.resource_limit", str(run.killed_reason))
    if not run.ok:
        return reject("exec.runtime_error", f"exit {run.exit_code}, {run.killed_reason or ''} {_last_line(run.stderr)}".strip())
    if run.records_refused:
        return reject("exec.forged_record", run.records_refused)
    solve = run.solve
    if solve is None:
        return reject("exec.no_solver_call", "no gurobipy Model.optimize or highspy Highs.run was recorded")
    if solve["status"] != "optimal":
        return reject("exec.solver_status", f"recorded status {solve['status']}")
    if solve["objective"] is None:
        return reject("exec.no_result", "recorded status optimal without an objective")
    return accept()


def instance_model(inst: Instance) -> LinearModel:
    """The instance as ORGEval's model (the reference of :func:`structural_gate`), built from the IR itself."""
    from trex.verify import orgeval

    kinds = {"continuous": "C", "integer": "I", "binary": "B"}
    index = inst.var_index()
    variables = [orgeval.Variable(v.name, kinds[v.vtype], float(v.lb) if v.vtype != "binary" else 0.0,
                                  (math.inf if v.ub is None else float(v.ub)) if v.vtype != "binary" else 1.0,
                                  float(inst.objective.linear.get(v.name, 0.0))) for v in inst.variables]
    senses = {"<=": "<", ">=": ">", "==": "="}
    rows = [orgeval.Constraint(c.name, senses[c.sense], float(c.rhs),
                               tuple((index[n], float(a)) for n, a in c.coeffs.items() if a != 0.0))
            for c in inst.constraints]
    quad = tuple((min(index[u], index[w]), max(index[u], index[w]), float(q)) for u, w, q in inst.objective.quadratic)
    return orgeval.LinearModel(inst.objective.sense, float(inst.objective.constant), variables, rows, {}, quad)


def structural_gate(solve: dict[str, Any] | None, reference: LinearModel) -> GateResult:
    """The recorded model is the instance's model (ORGEval WL-equivalence, :func:`orgeval.structural_check`),
    beyond objective agreement: a dropped constraint, relaxed integrality or wrong coefficient is rejected
    whatever the objective."""
    from trex.verify import orgeval

    code, why = orgeval.structural_check(solve, reference)
    return accept(why) if code is None else reject(f"structure.{code}", why)


def objective_agrees(value: float, reference: float, tol: float) -> bool:
    """|a - b| / (|b| + 1) <= tol (finite values only)."""
    if not (math.isfinite(value) and math.isfinite(reference)):
        return False
    return abs(value - reference) / (abs(reference) + 1.0) <= tol


def objective_gate(value: float | None, reference: float | None, tol: float) -> GateResult:
    """The executed objective agrees with the reference solve within the relative tolerance."""
    if tol <= 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    if value is None or reference is None:
        return reject("objective.missing", f"value={value!r}, reference={reference!r}")
    if not objective_agrees(value, reference, tol):
        rel = abs(value - reference) / (abs(reference) + 1.0) if math.isfinite(value - reference) else math.inf
        return reject("objective.mismatch", f"got {value!r}, reference {reference!r}, relative error {rel:.3g} > {tol:g}")
    return accept()


# --- reviewer ----------------------------------------------------------------------------------------
_NUMBER = re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])-?\d+(?:\.\d+)?|(?<![\w\d])-?\.\d+")
_TEMPLATE = re.compile(r"[{}]|<<|>>|\$\{|\bnan\b|\bNaN\b")
_SECTIONS = (("variables", ("variable",)), ("objective", ("objective", "minimi", "maximi")),
             ("constraints", ("constraint", "subject to", "s.t.")))


def numbers_in(text: str) -> list[float]:
    """Every number written in ``text`` (thousands separators understood)."""
    return [float(m.group(0).replace(",", "")) for m in _NUMBER.finditer(text)]


def _present(x: float, found: Sequence[float]) -> bool:
    tol = 0.5e-6 * max(1.0, abs(x))  # the renderer writes at most 6 decimals
    return any(abs(abs(x) - abs(y)) <= tol for y in found)


def review_gate(problem: str, formulation: str, numbers: Sequence[float], *, min_chars: int = 80,
                max_chars: int = 40_000) -> GateResult:
    """Rule-based review: length bounds, no template leftovers, every instance number written in the
    text, a formulation with variables, objective and constraints."""
    n = len(problem.strip())
    if n < min_chars:
        return reject("review.too_short", f"{n} < {min_chars} characters")
    if n > max_chars:
        return reject("review.too_long", f"{n} > {max_chars} characters")
    m = _TEMPLATE.search(problem)
    if m:
        return reject("review.template_marker", f"{m.group(0)!r} at offset {m.start()}")
    found = numbers_in(problem)
    missing = [x for x in numbers if not _present(float(x), found)]
    if missing:
        shown = ", ".join(repr(x) for x in missing[:5])
        return reject("review.missing_number", f"{len(missing)} missing, e.g. {shown}")
    low = formulation.lower()
    lacking = [name for name, keys in _SECTIONS if not any(k in low for k in keys)]
    if lacking:
        return reject("review.formulation_incomplete", f"no {', '.join(lacking)} section")
    return accept()


REVIEW_PROMPT = (
    "You review synthetic operations-research training data. Given a problem statement and its "
    "mathematical formulation, answer with exactly one line: 'ACCEPT' if the statement is clear, "
    "self-consistent and the formulation models it faithfully, otherwise 'REJECT: <short reason>'."
)


def parse_review(answer: str) -> GateResult:
    """Verdict of the LLM reviewer's answer (first non-empty line)."""
    line = next((ln.strip() for ln in answer.splitlines() if ln.strip()), "")
    word = line.split(":", 1)[0].strip().strip("*").upper()
    if word == "ACCEPT":
        return accept(line)
    if word == "REJECT":
        return reject("review.llm_rejected", line.split(":", 1)[1].strip() if ":" in line else "")
    return reject("review.llm_error", f"no verdict in answer: {line[:200]!r}")


async def llm_review(problem: str, formulation: str, endpoint: EndpointConfig) -> GateResult:
    """Optional LLM review through the OpenAI-compatible endpoint (transport errors -> review.llm_error)."""
    import os

    from trex.llm.client import ChatClient, ChatError

    key = os.environ.get(endpoint.api_key_env) if endpoint.api_key_env else None
    messages = [{"role": "system", "content": REVIEW_PROMPT},
                {"role": "user", "content": f"Problem:\n{problem}\n\nFormulation:\n{formulation}"}]
    async with ChatClient(endpoint.url, endpoint.model, key, timeout_s=endpoint.timeout_s, temperature=0.0,
                          max_tokens=64, concurrency=1) as client:
        try:
            res = await client.complete(messages)
        except ChatError as exc:
            return reject("review.llm_error", str(exc)[:300])
    return parse_review(res.text)
