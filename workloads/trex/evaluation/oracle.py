"""The oracle check: ORData's reference answers, cut at a job's generation budget, through the real harness.

A perfect model writes the reference answer; if that answer, cut at ``maxTokens`` tokens of the model's
tokenizer, does not score 100 % through prompt -> extraction -> sandbox -> scoring, the budget or the
harness is wrong, whatever the model. `trex demo` prints it next to the trained model's Pass@1.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from trex.config_base import load_section
from trex.evaluation.config import EvalConfig
from trex.evaluation.models.reference import OracleModel


def oracle_pass_at_1(items: str | Path, tokenizer_json: str | Path, max_tokens: int, out_dir: str | Path,
                     limit: int | None = None) -> tuple[float, int]:
    """(Pass@1, items scored) of the reference answers in the ORData held-out file ``items`` cut at
    ``max_tokens`` tokens of the tokenizer in ``tokenizer_json``."""
    from tokenizers import Tokenizer

    from trex.evaluation.runner import run_eval

    bench: dict[str, object] = {"name": "ordata", "path": str(items)}
    if limit is not None:
        bench["limit"] = limit
    cfg = load_section(EvalConfig, {"model": {"kind": "reference"}, "benchmarks": [bench], "output": str(out_dir)})
    model = OracleModel(Tokenizer.from_file(str(tokenizer_json)), max_tokens)
    outcome = asyncio.run(run_eval(cfg, model, out_dir=out_dir))
    score = outcome.summary["benchmarks"]["ordata"]
    return float(score["pass@1"]), int(score.get("items", 0))
