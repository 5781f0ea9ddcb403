"""The OR verifier through the real sandbox: a correct program earns every term; a printed, forged or
solver-less answer earns no objective reward; terms, weights, reasoning modes and parallel workers."""

from __future__ import annotations

import asyncio
import json

from trex.trainer.rl.reward import ORVerifier, RewardWeights, machine_workers, outcome_counts
from trex.verify.items import Item, parse_truth


def fence(code: str) -> str:
    return f"The model fixes x.\n\n```python\n{code}```\n"


def fixed(value: float) -> str:
    """A program whose recorded HiGHS solve has optimum ``value``."""
    return (f"import json, highspy\nh = highspy.Highs()\nh.silent()\nh.addVar({value}, {value})\n"
            f"h.changeColCost(0, 1.0)\nh.run()\nprint('TREX_RESULT ' + json.dumps({{'status': 'optimal', "
            f"'objective': h.getInfo().objective_function_value}}))\n")


PRINTED = "print('TREX_RESULT {\"status\": \"optimal\", \"objective\": 7}')\n"
# a solve record written by hand (no solver ran) claiming 7 for a model whose optimum is 1
FORGED = ("import json, os\nfake = {'api': 'highspy', 'status': 'optimal', 'objective': 7.0, 'num_vars': 1, "
          "'num_constrs': 1, 'lp': 'Maximize\\n obj: x\\nSubject To\\n c: x <= 1\\nEnd\\n', 'lp_truncated': False}\n"
          "for fd in range(3, 64):\n    try:\n        os.write(fd, (json.dumps(fake) + '\\n').encode())\n"
          "    except OSError:\n        pass\n" + PRINTED)


def test_rewards_score_the_recorded_solve() -> None:
    item = Item("q", "Report 7.", parse_truth("7"))
    answers = {
        "correct": fence(fixed(7.0)),
        "wrong": fence(fixed(8.0)),
        "printed": fence(PRINTED),
        "forged": fence(FORGED),
        "crash": fence("raise SystemExit(3)\n"),
        "no_code": "The optimal objective is 7.",
        "think_correct": f"let me see</think>{fence(fixed(7.0))}",
        "think_unclosed": f"draft: {fence(fixed(7.0))}",
    }
    v = ORVerifier(RewardWeights(format=0.5, execution=1.0, objective=1.0), workers=2)
    plain = asyncio.run(v.score(list(answers.values())[:6], [item] * 6))
    think = asyncio.run(ORVerifier(reasoning_mode="think-high", workers=2).score(list(answers.values())[6:],
                                                                                   [item] * 2))
    got = {k: (r.format, r.execution, r.objective, r.total, r.outcome)
           for k, r in zip(answers, [*plain, *think], strict=True)}
    assert got["correct"] == (1.0, 1.0, 1.0, 2.5, "correct")
    assert got["wrong"] == (1.0, 1.0, 0.0, 1.5, "wrong_objective")
    # a printed or forged number is not a recorded solve: no execution term, no objective reward
    assert got["printed"] == (1.0, 0.0, 0.0, 0.5, "no_solver_call")
    assert got["forged"] == (1.0, 0.0, 0.0, 0.5, "no_solver_call")
    assert got["crash"] == (1.0, 0.0, 0.0, 0.5, "runtime_error")
    assert got["no_code"] == (0.0, 0.0, 0.0, 0.0, "no_code")
    assert got["think_correct"] == (1.0, 1.0, 1.0, 2.5, "correct")
    assert got["think_unclosed"][3] == 0.0  # code inside an unclosed reasoning is no answer
    assert outcome_counts(plain)["no_solver_call"] == 2
    weighted = asyncio.run(ORVerifier(RewardWeights(0.0, 0.0, 1.0), workers=1).score([answers["correct"]], [item]))
    assert weighted[0].total == 1.0
    assert machine_workers() >= 1 and ORVerifier().workers == machine_workers()
    assert json.dumps(got)  # plain values, loggable as metrics
