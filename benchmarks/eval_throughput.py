"""Evaluation harness throughput with an instant model: samples per second including sandboxed execution.

Usage: python benchmarks/eval_throughput.py [--items N] [--workers 2] [--full-bench4opt]

Three runs on the same items, each into a fresh output directory:

* ``in-process``: an instant in-process model answers with a small program that prints the ground
  truth through the protocol (harness + sandbox cost only);
* ``http``: the same answers served by an instant OpenAI-compatible server on loopback through
  :class:`trex.llm.ChatClient` (adds the HTTP client);
* ``gurobipy``: answers that import gurobipy and solve a 2-variable LP (a realistic program start);
* ``no-exec``: answers without code (scored ``no_code``, nothing executed): the harness alone.

Goal: >= 10 samples/s on 2 cores. ``--full-bench4opt`` also runs the reference model on all 425
Bench4Opt instances under ORGEval (needs ../shared/benchmarks) and prints its scores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trex.evaluation.config import EvalConfig
from trex.evaluation.models import ReferenceModel
from trex.evaluation.models.openai_model import OpenAIModel
from trex.evaluation.runner import run_eval
from trex.llm.client import ChatClient, ChatResult, Usage
from trex.verify.items import Item, parse_truth

GUROBI = """import json
import gurobipy as gp
from gurobipy import GRB
env = gp.Env(empty=True)
env.setParam("OutputFlag", 0)
env.start()
m = gp.Model(env=env)
x = m.addVar()
y = m.addVar()
m.addConstr(x + 2 * y <= 4)
m.addConstr(3 * x + y <= 6)
m.setObjective(x + y, GRB.MAXIMIZE)
m.optimize()
print("TREX_RESULT " + json.dumps({"status": "optimal", "objective": m.ObjVal, "values": {}}))
"""


class InstantModel:
    """Answers at once with a fixed program (reference answer or the gurobipy LP)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = f"instant-{kind}"
        self.ref = ReferenceModel()

    async def generate(self, messages: list[dict[str, str]], *, item: Item, sample_index: int) -> ChatResult:
        if self.kind == "no-exec":
            return ChatResult("The optimal value is 42.", Usage(10, 10), 0.0, "stop")
        if self.kind == "gurobipy":
            return ChatResult(f"```python\n{GUROBI}```\n", Usage(10, 10), 0.0, "stop")
        return await self.ref.generate(messages, item=item, sample_index=sample_index)

    async def aclose(self) -> None:
        return None


async def serve_instant(answers: dict[str, str]) -> tuple[Any, str]:
    from aiohttp import web

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        case = re.search(r"ITEM(\d+)", body["messages"][-1]["content"])
        text = answers[case.group(1) if case else "0"]
        return web.json_response({"choices": [{"message": {"content": text}, "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/v1"


async def one_run(kind: str, data: Path, items: int, workers: int, tmp: Path) -> float:
    out = tmp / f"{kind}-{time.perf_counter_ns()}"
    cfg = EvalConfig.model_validate({"benchmarks": [{"name": "nl4opt", "path": str(data)}],
                                     "model": {"kind": "reference"}, "output": str(out),
                                     "execution": {"workers": workers}})
    runner = None
    if kind == "http":
        ref = ReferenceModel()
        answers = {}
        for i in range(items):
            it = Item(str(i), "", parse_truth(str(i + 0.5)))
            answers[str(i)] = (await ref.generate([], item=it, sample_index=0)).text
        runner, url = await serve_instant(answers)
        model: Any = OpenAIModel(ChatClient(url, "instant", concurrency=8))
    else:
        model = InstantModel(kind)
    t0 = time.perf_counter()
    outcome = await run_eval(cfg, model)
    wall = time.perf_counter() - t0
    if runner is not None:
        await runner.cleanup()
    s = outcome.summary["benchmarks"]["nl4opt"]
    expected_correct = kind in ("in-process", "http")
    if expected_correct and s["pass@1"] != 1.0:
        raise SystemExit(f"{kind}: harness error, pass@1 = {s['pass@1']} (expected 1.0)")
    return items / wall


async def full_bench4opt(workers: int, tmp: Path) -> None:
    shared = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks" / "bench4opt"
    if not shared.is_dir():
        print("full Bench4Opt: skipped (../shared/benchmarks/bench4opt not present)")
        return
    cfg = EvalConfig.model_validate({"benchmarks": [{"name": "bench4opt", "path": str(shared)}],
                                     "model": {"kind": "reference"}, "output": str(tmp / "b4o"),
                                     "execution": {"workers": workers}})
    t0 = time.perf_counter()
    outcome = await run_eval(cfg, ReferenceModel())
    s = outcome.summary["benchmarks"]["bench4opt"]
    print(f"full Bench4Opt reference: items={s['items']} pass@1={s['pass@1']:.4f} "
          f"structural={s['structural_accuracy']:.4f} objective(feasible {s['feasible_samples']})="
          f"{s['objective_accuracy_feasible']:.4f} wall={time.perf_counter() - t0:.1f}s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=60)
    p.add_argument("--workers", type=int, action="append", help="sandbox workers (repeatable; default 2 and 4)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--full-bench4opt", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        data = tmp / "items.jsonl"
        data.write_text("".join(json.dumps({"en_question": f"ITEM{i} maximise.", "en_answer": str(i + 0.5)}) + "\n"
                                for i in range(args.items)))
        for workers in args.workers or [2, 4]:
            results: dict[str, float] = {}
            for kind in ("no-exec", "in-process", "http", "gurobipy"):
                rates = [asyncio.run(one_run(kind, data, args.items, workers, tmp)) for _ in range(args.repeats)]
                results[kind] = statistics.median(rates)
                print(f"workers={workers} {kind:>10}: median {results[kind]:.1f} samples/s over {args.repeats} runs "
                      f"of {args.items} (runs: {', '.join(f'{r:.1f}' for r in rates)})")
            base = results["in-process"]
            print(f"workers={workers} ratios vs in-process: no-exec {results['no-exec'] / base:.1f}, "
                  f"http {results['http'] / base:.2f}, gurobipy {results['gurobipy'] / base:.2f}; goal >= 10 "
                  f"samples/s with execution: {'met' if min(base, results['http']) >= 10 else 'NOT met'}")
        if args.full_bench4opt:
            asyncio.run(full_bench4opt(max(args.workers or [2]), tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
