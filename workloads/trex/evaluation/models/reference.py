"""The reference model: answers every item with a program built from the item's own ground truth.

It checks the harness end to end (prompt -> extraction -> sandbox -> recorded solve -> scoring): a
harness that is right scores it 100 %. Answer-only items get a program that solves a one-variable
highspy model whose outcome is the published answer (fixed at the optimum, or infeasible, or
unbounded) and prints it through the TREX_RESULT protocol, because only a recorded solve counts;
Bench4Opt items get a program that loads the instance's
reference model.lp with gurobipy (highspy when gurobipy is missing or refuses the model), exports it
as model.lp for ORGEval, solves it and prints the solver's outcome.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from trex.llm.client import ChatResult, Usage
from trex.verify.items import Item, Truth

_STATUS = {"no_solution": "infeasible_or_unbounded", "infeasible_or_unbounded": "infeasible_or_unbounded",
           "infeasible": "infeasible", "unbounded": "unbounded"}

_LP_PROGRAM = '''import json
import re

LP = {lp!r}
with open("reference_model.lp", "w") as fh:
    fh.write(LP)


def with_gurobi():
    import gurobipy as gp
    from gurobipy import GRB

    env = gp.Env(empty=True)
    env.setParam("OutputFlag", 0)
    env.start()
    m = gp.read("reference_model.lp", env=env)
    m.write("model.lp")
    m.optimize()
    names = {{GRB.OPTIMAL: "optimal", GRB.INFEASIBLE: "infeasible", GRB.UNBOUNDED: "unbounded",
             GRB.INF_OR_UNBD: "infeasible_or_unbounded"}}
    status = names.get(m.Status, "solver_status_%d" % m.Status)
    return status, (m.ObjVal if status == "optimal" else None)


def with_highs():
    import highspy

    legal = re.sub(r"\\[([^\\]\\s]*)\\]", lambda g: "_" + g.group(1).replace(",", "_"), LP)
    with open("reference_legal.lp", "w") as fh:
        fh.write(legal)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.readModel("reference_legal.lp")
    h.writeModel("model.lp")
    h.run()
    ms = h.getModelStatus()
    names = {{highspy.HighsModelStatus.kOptimal: "optimal", highspy.HighsModelStatus.kInfeasible: "infeasible",
             highspy.HighsModelStatus.kUnbounded: "unbounded",
             highspy.HighsModelStatus.kUnboundedOrInfeasible: "infeasible_or_unbounded"}}
    status = names.get(ms, h.modelStatusToString(ms))
    return status, (h.getInfo().objective_function_value if status == "optimal" else None)


try:
    status, objective = with_gurobi()
except Exception:
    status, objective = with_highs()
print("TREX_RESULT " + json.dumps({{"status": status, "objective": objective, "values": {{}}}}))
'''


def _status_value(t: Truth) -> tuple[str, float | None]:
    if t.status == "optimal":
        return "optimal", t.value
    return _STATUS.get(t.status, "unknown"), None


def reference_program(item: Item) -> str:
    """A Python program that reports ``item``'s ground truth through the protocol."""
    if item.reference_lp is not None:
        return _LP_PROGRAM.format(lp=item.reference_lp)
    status, objective = _status_value(item.truth) if item.truth is not None else ("optimal", None)
    values: dict[str, float] = {}
    for name, t in item.named.items():
        s, v = _status_value(t)
        if s != "optimal" or v is None:
            status = s
            continue
        values[name] = v
    result = {"status": status, "objective": objective, "values": values}
    return (f"import json\n\nimport highspy\n\nresult = json.loads({json.dumps(result)!r})\n{_answer_model(status, objective)}"
            "print('TREX_RESULT ' + json.dumps(result))\n")


def _answer_model(status: str, objective: float | None) -> str:
    """highspy lines that solve a one-variable model with outcome ``status`` (and ``objective``)."""
    lines = ["h = highspy.Highs()", "h.silent()", "inf = highspy.kHighsInf"]
    if status == "optimal":
        v = 0.0 if objective is None else float(objective)
        lines += [f"h.addVar({v!r}, {v!r})", "h.changeColCost(0, 1.0)"]
    elif status == "unbounded":
        lines += ["h.setOptionValue('presolve', 'off')", "h.addVar(0.0, inf)", "h.changeColCost(0, -1.0)",
                  "h.addRow(0.0, inf, 1, [0], [1.0])"]
    else:  # infeasible, infeasible_or_unbounded, no solution
        lines += ["h.addVar(0.0, 1.0)", "h.addRow(2.0, inf, 1, [0], [1.0])"]
    return "\n".join([*lines, "h.run()", ""])


class ReferenceModel:
    """Answers with :func:`reference_program` in a fenced block; costs no tokens."""

    name = "reference"

    async def generate(self, messages: list[dict[str, str]], *, item: Item, sample_index: int) -> ChatResult:
        """The reference answer for ``item``."""
        return ChatResult(f"Reference program.\n\n```python\n{reference_program(item)}```\n", Usage(), 0.0, "stop")

    async def aclose(self) -> None:
        """Nothing to release."""


def cut_to_tokens(text: str, tokenizer: Any, max_tokens: int) -> tuple[str, bool]:
    """``text`` cut at ``max_tokens`` tokens of ``tokenizer`` (a `tokenizers.Tokenizer` or a Hugging Face
    tokenizer), as generation under that budget would end; and whether it was cut."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    ids = list(getattr(ids, "ids", ids))
    if len(ids) <= max_tokens:
        return text, False
    return str(tokenizer.decode(ids[:max_tokens])), True


class OracleModel:
    """Answers each item with its recorded reference answer (``Item.meta["reference"]``, ORData's held-out
    samples), cut at ``max_tokens`` tokens of ``tokenizer`` when both are given: what a perfect model
    writes under the job's sampling budget. A harness and budget that are right score it 100 %."""

    def __init__(self, tokenizer: Any = None, max_tokens: int | None = None, *,
                 answers: Mapping[str, str] | None = None, name: str = "oracle") -> None:
        self.tokenizer, self.max_tokens = tokenizer, max_tokens
        self.answers = dict(answers or {})
        """Per item id, an answer used instead of the item's own reference (the control: another item's)."""
        self.name = name

    async def generate(self, messages: list[dict[str, str]], *, item: Item, sample_index: int) -> ChatResult:
        """The item's reference answer (cut to the budget)."""
        text = self.answers.get(item.id, item.meta.get("reference"))
        if not isinstance(text, str):
            raise ValueError(f"item {item.id!r} has no reference answer (ORData held-out records carry one)")
        cut = False
        if self.tokenizer is not None and self.max_tokens is not None:
            text, cut = cut_to_tokens(text, self.tokenizer, self.max_tokens)
        return ChatResult(text, Usage(), 0.0, "length" if cut else "stop")

    async def aclose(self) -> None:
        """Nothing to release."""
