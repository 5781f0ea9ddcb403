"""What `trex train` needs for mode opd: the prompts (data.train, as for mode grpo), the teacher pool and one
step's OPD pass.

The prompts are the records of data.train in ``opd.promptFormat``, rendered as mode grpo renders them (the
prompt set's messages in the training chat layout, ending with the generation prompt); step s takes the
slice :class:`~trex.trainer.rl.prompts.PromptOrder` gives it and samples with sample ids s * N + i under the
run's seed, so a resumed run draws exactly what an uninterrupted one drew.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trex.evaluation.benchmarks.base import Item
from trex.runtime.copy_engine import make_copy_engine
from trex.trainer.config import OPDConfig, TrainerConfig
from trex.trainer.distill.cache import HiddenStateCache
from trex.trainer.distill.opd import OPDStats, opd_step
from trex.trainer.distill.teacher import TeacherPool, resolve_teacher_dir
from trex.trainer.hf import args_from_hf_dir
from trex.trainer.rl.prompts import PromptCache, PromptOrder
from trex.trainer.rl.step import stop_tokens_of
from trex.trainer.rollout import SamplingParams


def opd_problems(cfg: OPDConfig) -> list[tuple[str, str]]:
    """What mode opd cannot start with: a teacher without a model folder (a TrainJob name outside a TrainJob,
    or a path that holds no export)."""
    out: list[tuple[str, str]] = []
    for i, t in enumerate(cfg.teachers):
        if t.path is None:
            out.append((f"opd.teachers.{i}.name", f"{t.name!r}: a TrainJob teacher gets its path from the operator; "
                        "outside a TrainJob give path (the teacher's model folder)"))
            continue
        try:
            resolve_teacher_dir(t.path)
        except FileNotFoundError as e:
            out.append((f"opd.teachers.{i}.path", str(e)))
    return out


def teachers_of(items: Sequence[Item], cfg: OPDConfig) -> list[list[str]]:
    """Per item, the labels of the teachers whose ``items`` pattern matches its id or category (configuration
    order); an item no teacher scores is a ValueError naming the field."""
    out = []
    for it in items:
        labels = [t.label for t in cfg.teachers
                  if t.items is None or any(fnmatch.fnmatchcase(v, t.items) for v in (it.id, it.category))]
        if not labels:
            raise ValueError(f"opd.teachers: prompt {it.id!r} matches no teacher's items pattern (every prompt "
                             "needs a teacher)")
        out.append(labels)
    return out


class OPDRun:
    """The prompts, teachers and sampling of one opd run."""

    def __init__(self, cfg: TrainerConfig, tokenizer: Any, items: Sequence[Item], device: torch.device,
                 dtype: torch.dtype, ckpt_dir: Path, vocab_size: int) -> None:
        o = cfg.opd
        self.cfg, self.items, self.seed = o, list(items), cfg.seed
        for i, t in enumerate(o.teachers):
            teacher_vocab = args_from_hf_dir(resolve_teacher_dir(str(t.path))).vocab_size
            if teacher_vocab != vocab_size:
                raise ValueError(f"opd.teachers.{i}.path: the teacher's vocabulary is {teacher_vocab}, the student's "
                                 f"{vocab_size} (distillation compares distributions over one tokenizer)")
        self.teachers = teachers_of(self.items, o)
        self.order = PromptOrder(len(self.items), cfg.data.seed)
        s = o.sampling
        stops = tuple(dict.fromkeys([*s.stop_tokens, *stop_tokens_of(tokenizer)]))
        self.params = SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                     max_new_tokens=s.max_new_tokens, stop_tokens=stops)
        cache_dir = Path(o.cache_dir) if o.cache_dir else ckpt_dir / "teacher-cache"
        self.pool = TeacherPool([(t.label, t.weight, str(t.path)) for t in o.teachers], device,
                                HiddenStateCache(o.cache_bytes, cache_dir), make_copy_engine(device.type),
                                vocab_size=vocab_size, dtype=dtype)
        self.prompt = PromptCache(tokenizer, self.items, o.prompt_format, o.prompt_set, cfg.data.reasoning_mode,
                                  cfg.data.think_max_prompt)
        """Prompt tokens of item i (encoded once)."""

    def batch_at(self, step: int) -> list[int]:
        """The item indices of optimizer step ``step``."""
        return self.order.at(step, self.cfg.prompts_per_step)

    def step(self, model: Any, step: int) -> OPDStats:
        """Rollouts, teacher pass and the student's backward for step ``step`` (gradients accumulate)."""
        batch = self.batch_at(step)
        return opd_step(model, [self.prompt(i) for i in batch], [self.teachers[i] for i in batch], self.pool,
                        self.params, samples_per_prompt=self.cfg.samples_per_prompt, seed=self.seed, step=step,
                        estimator=self.cfg.estimator, chunk_size=self.cfg.chunk_size)

    def close(self) -> None:
        """Remove the cache's spill files and stop the copy engine."""
        self.pool.close()
        self.pool.engine.close()
