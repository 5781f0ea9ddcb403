"""Zero-shot prompt templates (one per protocol) and the output contract every program follows.

The contract is the same for every protocol, so every sample is executed and scored the same way:
one ```python block; the program solves the model and prints, as its last stdout line,
``TREX_RESULT {"status": ..., "objective": ..., "values": {...}}``. Templates differ only in the
framing their published harness used (ORLM's "build a mathematical model and code", MAMO's
"mathematical modeling", OptiBench's named results); a template's text never contains the answer.
"""

from __future__ import annotations

import hashlib
import json

from trex.evaluation.benchmarks.base import Item

PROMPT_VERSION = "1"

SYSTEM = (
    "You are an expert in operations research and mathematical optimization. You formulate problems "
    "precisely and write correct, runnable Python solver code."
)

CONTRACT = """Write one complete Python program in a single ```python code block. Use gurobipy (or highspy).
The program must build and solve the model, then print as the LAST line of its output:
TREX_RESULT {{"status": STATUS, "objective": VALUE, "values": {{...}}}}
(print "TREX_RESULT " followed by json.dumps of the dict). STATUS is the solver's outcome, one of
"optimal", "infeasible", "unbounded" or "infeasible_or_unbounded"; VALUE is the optimal objective
value as a number (null unless optimal).{values}"""

NAMED = """
"values" must contain these keys exactly as written, each with its optimal numeric value:
{names}"""

BENCH4OPT = """
The parameters are in the file "data.json" in the working directory: read them with json.load and
do not hard-code them. Before optimizing, write the instantiated model to "model.lp" in the working
directory: model.write("model.lp") with gurobipy, or h.writeModel("model.lp") with highspy."""

TEMPLATES: dict[str, str] = {
    "strict": "Solve the following optimization problem.\n\n{question}\n\n{contract}",
    "sirl": "Below is an operations research question. Build a mathematical model and corresponding "
            "Python code that solves it.\n\n# Question:\n{question}\n\n# Response requirements:\n{contract}",
    "orlm": "Below is an operations research question. Build a mathematical model and corresponding "
            "python code using `gurobipy` that appropriately addresses the question.\n\n"
            "# Question:\n{question}\n\n# Response:\n{contract}",
    "mamo": "Formulate the following problem as a mathematical optimization model and solve it with a "
            "solver.\n\n{question}\n\n{contract}",
    "optibench": "Model the following optimization problem and solve it with a solver; report every "
                 "requested quantity.\n\n{question}\n\n{contract}",
}


def build_messages(item: Item, protocol: str, benchmark_format: str) -> list[dict[str, str]]:
    """Chat messages for one item under ``protocol``'s template."""
    extra = ""
    if item.named:
        extra = NAMED.format(names="\n".join(f"- {json.dumps(k)}" for k in item.named))
    if benchmark_format == "bench4opt":
        extra += BENCH4OPT
    contract = CONTRACT.format(values=extra)
    template = TEMPLATES.get(protocol, TEMPLATES["strict"])
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": template.format(question=item.question.strip(), contract=contract)}]


def prompt_hash(messages: list[dict[str, str]]) -> str:
    """sha256 of the messages (canonical JSON): a changed prompt never reuses an old sample."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
