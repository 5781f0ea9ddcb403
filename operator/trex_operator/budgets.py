"""Length budgets on the job graph: an ORDataJob's samples against the TrainJob and EvalJob that use them.

`trex validate` runs these checks over every object it was given (a job graph in one invocation), one
line per problem:

* a TrainJob (``mode: sft``) whose ``dataFrom`` ORDataJob's median SFT sample is longer than its
  ``seqLen`` or its model's ``maxSeqLen`` (most samples would be truncated or dropped);
* an EvalJob (``trex-checkpoint`` from such a TrainJob) whose ``maxTokens`` is below the 95th percentile
  of the ORData reference answers' lengths for its ``ordata`` benchmark (a correct answer cannot fit);
* a TrainJob (``mode: grpo``) whose ``grpo.maxNewTokens`` is below that percentile for its ``dataFrom``
  ORDataJob, under its ``modelFrom`` TrainJob's tokenizer when that job is in the graph (no response could
  earn the objective reward).

Lengths come from :func:`trex.ordata.budgets.estimate_lengths` under the TrainJob's tokenizer settings; a
tokenizer file that is not readable where `trex validate` runs (on a volume only the job mounts) leaves the
budget unchecked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trex_operator.validate import Checked, Problem


def _key(c: Checked) -> tuple[str, str, str]:
    assert c.model is not None
    return c.model.kind, c.model.metadata.namespace or "", c.model.metadata.name


def _obj(c: Checked) -> str:
    assert c.model is not None
    return f"{c.model.kind}/{c.model.metadata.name}"


def _lengths(ordata: Any, trainer: Any) -> Any:
    """The ORData config's estimated lengths under ``trainer``'s tokenizer; None when that tokenizer is a file not
    readable here (on a volume only the job mounts, e.g. a released model's tokenizer.json): not estimated."""
    from pathlib import Path

    from trex.ordata.budgets import estimate_lengths

    if trainer.data.tokenizer.path is not None and not Path(trainer.data.tokenizer.path).is_file():
        return None
    vocab = min(trainer.data.tokenizer.vocab_size, trainer.model.args.vocab_size)
    return estimate_lengths(ordata, vocab, trainer.data.tokenizer.path)


def budget_problems(checked: Sequence[Checked]) -> list[Problem]:
    """Problems of every TrainJob / EvalJob whose length budget cannot hold its ORData source's samples."""
    jobs = {_key(c): c for c in checked if c.model is not None}
    out: list[Problem] = []
    for c in jobs.values():
        spec: Any = c.model.spec if c.model is not None else None
        kind, ns, _ = _key(c)
        if kind == "TrainJob" and spec.data_from is not None and spec.trainer.mode == "sft":
            src = jobs.get(("ORDataJob", ns, spec.data_from.name))
            if src is None or "sft" not in src.model.spec.ordata.outputs:  # type: ignore[union-attr]
                continue
            lengths = _lengths(src.model.spec.ordata, spec.trainer)  # type: ignore[union-attr]
            if lengths is None:
                continue
            median = lengths.sample_median()
            positions = spec.trainer.model.args.max_seq_len
            where = f"ORDataJob/{spec.data_from.name}'s SFT samples have a median of {median} tokens (estimated)"
            if median > positions:
                out.append(Problem(c.file, _obj(c), "spec.trainer.model.overrides.maxSeqLen",
                                   f"{positions}: {where}; most cannot fit the model's positions"))
            elif median > spec.trainer.data.seq_len:
                out.append(Problem(c.file, _obj(c), "spec.trainer.data.seqLen",
                                   f"{spec.trainer.data.seq_len}: {where}; most would be truncated or dropped"))
        elif kind == "TrainJob" and spec.data_from is not None and spec.trainer.mode == "grpo":
            src = jobs.get(("ORDataJob", ns, spec.data_from.name))
            if src is None:
                continue
            base = jobs.get(("TrainJob", ns, spec.model_from.name)) if spec.model_from is not None else None
            tok_from: Any = base.model.spec if base is not None and base.model is not None else spec
            lengths = _lengths(src.model.spec.ordata, tok_from.trainer)  # type: ignore[union-attr]
            if lengths is None:
                continue
            p95 = lengths.answer_p95()
            budget = spec.trainer.grpo.max_new_tokens
            if budget < p95:
                who = f"TrainJob/{spec.model_from.name}'s" if base is not None else "its"
                out.append(Problem(c.file, _obj(c), "spec.trainer.grpo.maxNewTokens",
                                   f"{budget} is below {p95} tokens, the p95 length of ORDataJob/"
                                   f"{spec.data_from.name}'s reference answers (estimated with {who} tokenizer); "
                                   "a correct answer would be cut and never earn the objective reward"))
        elif kind == "EvalJob" and spec.model_from is not None and spec.evaluation.model.kind == "trex-checkpoint":
            train = jobs.get(("TrainJob", ns, spec.model_from.name))
            tspec: Any = train.model.spec if train is not None and train.model is not None else None
            src = jobs.get(("ORDataJob", ns, tspec.data_from.name)) if tspec is not None and tspec.data_from else None
            benches = [b for b in spec.evaluation.benchmarks if "ordata" in (b.format, b.name)]
            if src is None or not benches or src.model.spec.ordata.heldout_fraction <= 0:  # type: ignore[union-attr]
                continue
            lengths = _lengths(src.model.spec.ordata, tspec.trainer)  # type: ignore[union-attr]
            if lengths is None:
                continue
            p95 = lengths.answer_p95()
            budget = spec.evaluation.model.sampling.max_tokens
            if budget < p95:
                out.append(Problem(c.file, _obj(c), "spec.evaluation.model.sampling.maxTokens",
                                   f"{budget} is below {p95} tokens, the p95 length of ORDataJob/"
                                   f"{tspec.data_from.name}'s reference answers (estimated with TrainJob/"
                                   f"{spec.model_from.name}'s tokenizer); a correct answer would be cut"))
    return out
