"""OR verifier throughput: rewards per second with one sandboxed program at a time against the machine's worker count.

Usage: python benchmarks/or_verifier.py [--completions N] [--workers W]

The completions are GRPO-shaped: a batch of a few prompts x G samples, half correct HiGHS programs (their recorded
solve matches), a quarter printing the number without solving, a quarter without code. Prints rewards/s for
workers=1 and workers=W (default: the CPUs this process may use) and their ratio; the goal is a ratio close to W
(the verifier runs programs in parallel and does nothing else while they run).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from trex.trainer.rl.reward import ORVerifier, machine_workers, outcome_counts
from trex.verify.items import Item, parse_truth


def _answer(i: int, value: int) -> str:
    if i % 4 == 3:
        return f"The optimum is {value}."
    if i % 4 == 2:
        return f"```python\nprint('TREX_RESULT {{\"status\": \"optimal\", \"objective\": {value}}}')\n```"
    return (f"```python\nimport json, highspy\nh = highspy.Highs()\nh.silent()\nh.addVar({value}, {value})\n"
            f"h.changeColCost(0, 1.0)\nh.run()\nprint('TREX_RESULT ' + json.dumps({{'status': 'optimal', "
            f"'objective': h.getInfo().objective_function_value}}))\n```")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--completions", type=int, default=32)
    ap.add_argument("--workers", type=int, default=machine_workers())
    args = ap.parse_args()
    items = [Item(str(i), "q", parse_truth(str(i % 8))) for i in range(args.completions)]
    texts = [_answer(i, i % 8) for i in range(args.completions)]
    rates = {}
    for w in sorted({1, args.workers}):
        t0 = time.perf_counter()
        rewards = asyncio.run(ORVerifier(workers=w).score(texts, items))
        dt = time.perf_counter() - t0
        rates[w] = len(rewards) / dt
        mean = sum(r.total for r in rewards) / len(rewards)
        print(f"workers={w}: {rates[w]:.2f} rewards/s ({dt:.1f} s, mean reward {mean:.3f}, {outcome_counts(rewards)})")
    if args.workers != 1:
        print(f"ratio workers={args.workers} / workers=1: {rates[args.workers] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
