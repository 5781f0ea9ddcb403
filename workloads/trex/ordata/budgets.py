"""Length budgets of an ORData job, known before it runs: token lengths of its reference answers and SFT samples.

`trex validate` compares them with what the jobs downstream allow (a TrainJob's seqLen and model positions,
an EvalJob's maxTokens), so a budget that cannot hold a correct answer is rejected, not discovered as 0 %.
The lengths come from the first instances of the job (generated, solved, rendered, given their reference
answer exactly as the pipeline does) under the model's tokenizer: ``data.tokenizer.path`` when set, else a
BPE trained on those samples the way the trainer trains one on the whole corpus.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from trex.ordata.config import ORDataConfig

SAMPLED = 24
"""Instances drafted per estimate."""


@dataclass(frozen=True)
class Lengths:
    """Token lengths of drafted samples: the reference answers and the whole SFT samples (prompt + answer)."""

    answers: tuple[int, ...]
    samples: tuple[int, ...]

    def answer_p95(self) -> int:
        """95th percentile of the reference answers' lengths."""
        return int(np.ceil(np.percentile(self.answers, 95)))

    def sample_median(self) -> int:
        """Median SFT sample length (above a window, most samples do not fit it)."""
        return int(np.ceil(np.median(self.samples)))


def estimate_lengths(cfg: ORDataConfig, vocab_size: int, tokenizer_path: str | None = None,
                     sampled: int = SAMPLED) -> Lengths:
    """Lengths of the first ``sampled`` instances of ``cfg`` under the tokenizer the trainer would use."""
    return _estimate(json.dumps(cfg.model_dump(mode="json"), sort_keys=True), vocab_size, tokenizer_path, sampled)


@lru_cache(maxsize=32)
def _estimate(cfg_json: str, vocab_size: int, tokenizer_path: str | None, sampled: int) -> Lengths:
    from tokenizers import Tokenizer

    from trex.ordata.pipeline import draft_sample, plan_instance, reference_answer, sft_record
    from trex.text.chat import encode_chat
    from trex.text.tokenizer import train_bpe

    cfg = ORDataConfig.model_validate_json(cfg_json)
    drafts = [d for i in range(min(sampled, cfg.count)) if (d := draft_sample(cfg, plan_instance(cfg, i))) is not None]
    if not drafts:
        raise ValueError("no instance of this ORData configuration could be drafted")
    records = [sft_record(d) for d in drafts]
    if tokenizer_path is not None:
        tok = Tokenizer.from_file(tokenizer_path)
    else:
        tok = train_bpe(["\n".join(m["content"] for m in r["messages"]) for r in records], vocab_size)
    answers = tuple(len(tok.encode(reference_answer(d), add_special_tokens=False).ids) for d in drafts)
    samples = tuple(len(encode_chat(tok, r["messages"]).ids) for r in records)
    return Lengths(answers, samples)
