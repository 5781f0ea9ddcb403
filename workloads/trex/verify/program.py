"""The sandboxed program runner of the OR contract: run a generated solver program in :mod:`trex.sandbox` and read
the answer the sandbox recorded from the solver (re-solved to confirm it), never a printed number unless asked.

`trex eval` and GRPO's reward (:mod:`trex.trainer.rl.reward`) run every program through :func:`run_program`, so a
sample is executed and believed the same way in evaluation and in training.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from trex.verify.items import Item
from trex.verify.orgeval import verify_recorded_solve
from trex.verify.scoring import Execution

LP_OUT = "model.lp"
"""The file a Bench4Opt program writes its model to (collected for ORGEval)."""
_TAIL = 2000


async def run_program(code: str, item: Item, *, timeout_s: float, memory_mb: int, max_output_kb: int,
                      printed: bool = False, want_lp: bool = False,
                      keep_model: bool = False) -> tuple[Execution, dict[str, Any], str | None]:
    """Run ``code`` in the sandbox: (verdict inputs, record of the run, collected LP text). The answer is the
    solve the sandbox recorded and re-solved, or with ``printed`` the TREX_RESULT line; ``keep_model`` keeps the
    recorded model's LP text in the record's ``solve`` (the GRPO verifier's structural check reads it)."""
    from trex.sandbox import Limits, run_python_async

    t = timeout_s
    limits = Limits(timeout_s=t, cpu_s=max(1, math.ceil(t)), memory_mb=memory_mb, max_output_kb=max_output_kb)
    res = await run_python_async(code, limits=limits, files=item.files or None,
                                 collect=(LP_OUT,) if want_lp else ())
    timed_out = bool(res.timed_out or res.killed_reason in ("timeout", "cpu_limit"))
    result, unrecorded = res.result, None
    if not printed:
        result, unrecorded = await recorded_answer(res.solve, res.result, t)
        if res.records_refused:
            result, unrecorded = None, f"solve records refused ({res.records_refused})"
    ex = Execution(exit_code=res.exit_code, timed_out=timed_out, stderr=res.stderr, result=result,
                   signal=None if timed_out else res.signal, unrecorded=unrecorded)
    lp = res.files.get(LP_OUT)
    solve = res.solve
    record = {
        "exit_code": res.exit_code, "signal": res.signal, "timed_out": timed_out, "wall_s": round(res.wall_s, 4),
        "killed_reason": res.killed_reason, "result": result, "printed": res.result, "mode": res.mode,
        "answers": ANSWERS_PRINTED if printed else ANSWERS_RECORDED,
        "solve": None if solve is None else {k: v for k, v in solve.items() if keep_model or k != "lp"},
        "solves": len(res.solves), "records_refused": res.records_refused,
        "stdout_tail": res.stdout[-_TAIL:], "stderr_tail": res.stderr[-_TAIL:], "lp_collected": lp is not None,
    }
    return ex, record, lp.decode("utf-8", "replace") if lp is not None else None


ANSWERS_RECORDED = "solver-recorded"
ANSWERS_PRINTED = "printed"


async def recorded_answer(solve: dict[str, Any] | None, printed: dict[str, Any] | None,
                          time_limit_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """The answer to score from the last recorded solve: (result, None), or (None, why there is none).

    Status and objective come from the solver record, confirmed by re-solving its model; named values
    (OptiBench, NL4OPT-E) still come from the printed line, which alone cannot make a sample correct.
    """
    if solve is None:
        return None, "no gurobipy/highspy solve was recorded" + (" (the printed TREX_RESULT is not believed)"
                                                                  if printed is not None else "")
    ok, why = await asyncio.to_thread(verify_recorded_solve, solve, time_limit_s)
    if not ok:
        return None, f"recorded solve not confirmed: {why}"
    values = (printed or {}).get("values") or {}
    return {"status": solve["status"], "objective": solve["objective"], "values": values}, None


