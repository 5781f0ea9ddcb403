"""Rewards from a pluggable verifier; the OR verifier scores the solve the sandbox recorded, never a printed number.

:class:`ORVerifier` takes a completion and its benchmark item (question + ground truth), runs the answer's
program in :mod:`trex.sandbox` exactly as `trex eval` does, and scores three terms:

* **format**: the answer (after ``</think>`` in a reasoning mode) holds one fenced ```python block that compiles;
* **execution**: the program exited 0 within its limits and the sandbox recorded a gurobipy/highspy solve that
  its own re-solve of the recorded model confirms;
* **objective**: that recorded solve matches the ground truth under an evaluation protocol (``sirl``:
  |pred - gt| / (|gt| + 1) < 1e-6). A printed TREX_RESULT that no recorded solve backs earns nothing here.

Where the item has a reference model (a Bench4Opt item's reference LP, or the model an ORData prompt's reference
answer's program records, recorded once per item), the execution and objective terms also need the recorded model
to be that model (ORGEval equivalence, :func:`trex.verify.orgeval.structural_check`, as ORData's structural gate):
a pinned or trivial model (a variable fixed to the answer, a constant objective) earns the format term only. With
the import gate on, a program outside the import contract (:func:`trex.verify.imports.import_problem`) is not run.

The reward is the weighted sum (:class:`RewardWeights`; SIRL's 0.5 / 1 / 1 is the example). Programs run in
parallel, as many at once as the machine has CPUs (each is one sandboxed process).
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from trex.reasoning import answer_of
from trex.verify.extract import extract_code
from trex.verify.items import Item
from trex.verify.protocols import get_protocol
from trex.verify.scoring import CATEGORIES, classify, syntax_check

if TYPE_CHECKING:
    from trex.verify.orgeval import LinearModel


OUTCOMES: tuple[str, ...] = (*CATEGORIES, "forbidden_code", "structure_mismatch")
"""What a completion's verification can end in: `trex eval`'s categories, a program outside the import contract,
a recorded model that is not the item's reference model."""


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the three terms (SIRL: format 0.5, execution 1, objective 1)."""

    format: float = 0.5
    execution: float = 1.0
    objective: float = 1.0


@dataclass(frozen=True)
class Reward:
    """One completion's reward, its terms (0 or 1 each) and the verifier's outcome category."""

    total: float
    format: float
    execution: float
    objective: float
    outcome: str
    reason: str


class Verifier(Protocol):
    """Scores completions against their items; rewards come back in input order."""

    async def score(self, completions: Sequence[str], items: Sequence[Item]) -> list[Reward]:
        """One reward per (completion, item)."""
        ...


def machine_workers() -> int:
    """CPUs this process may run on (its affinity set, else the CPU count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def outcome_counts(rewards: Sequence[Reward]) -> dict[str, int]:
    """How many completions ended in each verifier outcome (for the step's metrics)."""
    return dict(Counter(r.outcome for r in rewards))


class ORVerifier:
    """The OR verifier: sandboxed execution, solver-recorded answers, protocol matching (see module doc)."""

    def __init__(self, weights: RewardWeights = RewardWeights(), *, protocol: str = "sirl",
                 reasoning_mode: str | None = None, workers: int | None = None, timeout_s: float = 60.0,
                 memory_mb: int = 4096, max_output_kb: int = 1024, structure: bool = True,
                 import_gate: bool = False) -> None:
        self.weights, self.protocol, self.reasoning_mode = weights, get_protocol(protocol), reasoning_mode
        self.workers = workers or machine_workers()
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        self.timeout_s, self.memory_mb, self.max_output_kb = timeout_s, memory_mb, max_output_kb
        self.structure, self.import_gate = structure, import_gate
        self._references: dict[str, asyncio.Task[LinearModel | None]] = {}

    async def score(self, completions: Sequence[str], items: Sequence[Item]) -> list[Reward]:
        """Rewards of ``completions`` (one per item), at most ``workers`` programs running at once."""
        if len(completions) != len(items):
            raise ValueError(f"{len(completions)} completions for {len(items)} items")
        sem = asyncio.Semaphore(self.workers)

        async def one(text: str, item: Item) -> Reward:
            async with sem:
                return await self.score_one(text, item)

        return list(await asyncio.gather(*(one(t, it) for t, it in zip(completions, items, strict=True))))

    async def score_one(self, completion: str, item: Item) -> Reward:
        """The reward of one completion."""
        from trex.verify.imports import import_problem
        from trex.verify.orgeval import structural_check
        from trex.verify.program import run_program

        code, rule = extract_code(answer_of(completion, self.reasoning_mode, server_split=False))
        syn = syntax_check(code) if code is not None else None
        fmt = float(code is not None and rule == "python-fence" and syn is None)
        w = self.weights
        if code is not None and syn is None and self.import_gate:
            problem = import_problem(code)
            if problem is not None:
                return Reward(w.format * fmt, fmt, 0.0, 0.0, "forbidden_code", f"{problem[0]}: {problem[1]}")
        execution, record = None, None
        if code is not None and syn is None:
            execution, record, _ = await run_program(code, item, timeout_s=self.timeout_s, memory_mb=self.memory_mb,
                                                     max_output_kb=self.max_output_kb, keep_model=True)
        verdict, _ = classify(code, syn, execution, self.protocol, item)
        ran = float(execution is not None and execution.exit_code == 0 and not execution.timed_out
                    and execution.unrecorded is None)
        obj, outcome, reason = float(verdict.correct), verdict.category, verdict.reason
        if ran and self.structure and record is not None:
            reference = await self.reference_model(item)
            if reference is not None:
                mismatch, why = structural_check(record.get("solve"), reference)
                if mismatch is not None:  # the recorded solve is not of the item's model: it counts for nothing
                    ran, obj, outcome, reason = 0.0, 0.0, "structure_mismatch", why
        return Reward(w.format * fmt + w.execution * ran + w.objective * obj, fmt, ran, obj, outcome, reason)

    async def reference_model(self, item: Item) -> LinearModel | None:
        """The item's reference model, once per item: a Bench4Opt item's reference LP, else the model its reference
        answer's program records in the sandbox (ORData prompts; the ORData gates accepted that program because
        its model is the instance's); None when the item has neither (or the reference program records none)."""
        task = self._references.get(item.id)
        if task is None:
            task = self._references[item.id] = asyncio.ensure_future(self._reference_model(item))
        return await task

    async def _reference_model(self, item: Item) -> LinearModel | None:
        from trex.sandbox import Limits, run_python_async
        from trex.verify import orgeval

        lp = item.reference_lp
        if lp is None:
            text = item.meta.get("reference")
            code = extract_code(text)[0] if isinstance(text, str) else None
            if code is None:
                return None
            limits = Limits(timeout_s=self.timeout_s, cpu_s=max(1, int(self.timeout_s)), memory_mb=self.memory_mb,
                            max_output_kb=self.max_output_kb)
            res = await run_python_async(code, limits=limits, files=item.files or None)
            lp = res.solve.get("lp") if res.ok and res.solve is not None else None
        if not lp:
            return None
        try:
            return await asyncio.to_thread(orgeval.read_lp_text, lp)
        except ValueError:
            return None
