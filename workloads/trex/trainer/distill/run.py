"""What `trex train` needs for mode opd: the prompts (data.train, as for mode grpo), the teacher pool and one
step's OPD pass.

The prompts are the records of data.train in ``opd.promptFormat``, rendered as mode grpo renders them (the
prompt set's messages in the training chat layout, ending with the generation prompt); step s takes the
slice :class:`~trex.trainer.rl.prompts.PromptOrder` gives it and samples with sample ids s * N + i under the
run's seed, so a resumed run draws exactly what an uninterrupted one drew. Under a parallel layout each
data-parallel rank takes its contiguous share of the step's prompts (sample ids keep their place in the whole
step, so every layout draws the same samples), decodes them as trex.trainer.parallel.decode lays out, and the
step's statistics are summed over the data-parallel ranks.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trex.runtime.copy_engine import make_copy_engine
from trex.trainer.config import OPDConfig, TrainerConfig
from trex.trainer.distill.cache import HiddenStateCache
from trex.trainer.distill.folders import resolve_teacher_dir
from trex.trainer.distill.opd import OPDStats, VocabParallel, opd_step
from trex.trainer.distill.teacher import TeacherLayout, TeacherPool, teacher_layout_problem
from trex.trainer.hf import args_from_hf_dir
from trex.trainer.parallel.decode import DecodeReplica, decoding, shared_over
from trex.trainer.rl.prompts import PromptCache, PromptOrder
from trex.trainer.rl.step import stop_tokens_of
from trex.trainer.rollout import Rollout, SamplingParams, generate
from trex.trainer.rollout.steplog import WAL_DIR, StepLogs, log_name
from trex.verify.items import Item


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


@dataclass
class OPDRanks:
    """Where one rank of a parallel opd run stands (the defaults: one process)."""

    dp_rank: int = 0
    dp: int = 1
    sum_over_dp: Callable[[list[float]], list[float]] | None = None
    """Element-wise sum over the data-parallel ranks."""
    teachers: TeacherLayout | None = None
    """The layout the teachers are distributed by."""
    vocab: VocabParallel | None = None
    """The vocabulary-parallel KL over the data-parallel x tp ranks (more than one of them)."""
    replica: DecodeReplica | None = None
    """The whole model decoded on (tensor / expert parallelism)."""
    tp_group: Any = None
    """The tp ranks of this data-parallel rank: they split its samples' decoding."""


class OPDRun:
    """The prompts, teachers and sampling of one opd run."""

    def __init__(self, cfg: TrainerConfig, tokenizer: Any, items: Sequence[Item], device: torch.device,
                 dtype: torch.dtype, ckpt_dir: Path, vocab_size: int, ranks: OPDRanks | None = None) -> None:
        o = cfg.opd
        self.ranks = ranks or OPDRanks()
        if o.prompts_per_step % self.ranks.dp:
            raise ValueError(f"opd.promptsPerStep: {o.prompts_per_step} is not a multiple of dp = {self.ranks.dp}")
        self.cfg, self.items, self.seed = o, list(items), cfg.seed
        for i, t in enumerate(o.teachers):
            args = args_from_hf_dir(resolve_teacher_dir(str(t.path)))
            if args.vocab_size != vocab_size:
                raise ValueError(f"opd.teachers.{i}.path: the teacher's vocabulary is {args.vocab_size}, the student's "
                                 f"{vocab_size} (distillation compares distributions over one tokenizer)")
            layout = self.ranks.teachers
            problem = teacher_layout_problem(args, layout.dims) if layout is not None else None
            if problem:
                raise ValueError(f"opd.teachers.{i}.path: the teacher is distributed like the student, but {problem}")
        self.teachers = teachers_of(self.items, o)
        self.order = PromptOrder(len(self.items), cfg.data.seed)
        s = o.sampling
        stops = tuple(dict.fromkeys([*s.stop_tokens, *stop_tokens_of(tokenizer)]))
        self.params = SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                     max_new_tokens=s.max_new_tokens, stop_tokens=stops)
        cache_dir = Path(o.cache_dir) if o.cache_dir else ckpt_dir / "teacher-cache"
        self.pool = TeacherPool([(t.label, t.weight, str(t.path)) for t in o.teachers], device,
                                HiddenStateCache(o.cache_bytes, cache_dir), make_copy_engine(device.type),
                                vocab_size=vocab_size, dtype=dtype, layout=self.ranks.teachers)
        self.prompt = PromptCache(tokenizer, self.items, o.prompt_format, o.prompt_set, cfg.data.reasoning_mode,
                                  cfg.data.think_max_prompt)
        """Prompt tokens of item i (encoded once)."""
        self.engine: Any = None
        """The external rollout engine (a VLLMRollouts, rollout.engine vllm; None: in process)."""
        self.logs = StepLogs(ckpt_dir / WAL_DIR, log_name(self.ranks.dp_rank, self.ranks.tp_group), o.wal_fsync_every)
        """This rank's per-step rollout logs (as mode grpo's: trex.trainer.rollout.steplog)."""

    def batch_at(self, step: int) -> list[int]:
        """The item indices of optimizer step ``step``."""
        return self.order.at(step, self.cfg.prompts_per_step)

    def my_prompts(self, step: int) -> tuple[int, list[int]]:
        """(place of this rank's first prompt in the step, its item indices) at ``step``."""
        every = self.batch_at(step)
        per = len(every) // self.ranks.dp
        start = self.ranks.dp_rank * per
        return start, every[start:start + per]

    def step(self, model: Any, step: int) -> OPDStats:
        """Rollouts, teacher pass and the student's backward for step ``step`` (gradients accumulate); the statistics
        cover every data-parallel rank. The rollouts are logged token by token to the step's log (logs of other steps
        are removed first): a rerun of the step (a restarted trainer) continues each sample from what the log holds."""
        start, batch = self.my_prompts(step)
        r = self.ranks

        def sample(prompts: list[list[int]], ids: list[int]) -> list[Rollout]:
            self.logs.prune(step)
            if self.engine is not None:
                return list(self.engine.engine.generate(prompts, self.params, self.seed, sample_ids=ids,
                                                        max_seq_len=self.engine.max_seq_len,
                                                        wal=self.logs.for_step(step)))
            with decoding(model, r.replica) as m:
                return shared_over(r.tp_group, list(zip(prompts, ids, strict=True)), lambda part: generate(
                    m, [p for p, _ in part], self.params, self.seed, sample_ids=[i for _, i in part],
                    policy_version=step, wal=self.logs.for_step(step)))

        stats = opd_step(model, [self.prompt(i) for i in batch], [self.teachers[i] for i in batch], self.pool,
                         self.params, samples_per_prompt=self.cfg.samples_per_prompt, seed=self.seed, step=step,
                         estimator=self.cfg.estimator, chunk_size=self.cfg.chunk_size, first_prompt=start,
                         step_prompts=self.cfg.prompts_per_step, sampler=sample, reduce=r.sum_over_dp,
                         vocab=r.vocab)
        return stats if r.sum_over_dp is None else over_ranks(stats, self.pool.labels, r.sum_over_dp)

    def close(self) -> None:
        """Remove the cache's spill files and stop the copy engine."""
        self.pool.close()
        self.pool.engine.close()


def over_ranks(stats: OPDStats, labels: Sequence[str], total: Callable[[list[float]], list[float]]) -> OPDStats:
    """One rank's step statistics made the whole step's: token-weighted KL per teacher and entropy, summed token
    counts, the mean response length (every rank holds as many samples). The loss stays this rank's share (the
    loop sums the loss parts over the ranks), as do the batch length, expert counts and seconds."""
    n_ent = float(sum(stats.kl_tokens.values()))
    values = [0.0, float(stats.tokens), stats.entropy * n_ent, n_ent, stats.response_length,
              float(stats.sequence_tokens), 1.0, float(stats.resumed)]
    for label in labels:
        k = float(stats.kl_tokens.get(label, 0))
        values += [stats.kl.get(label, 0.0) * k, k]
    s = total(values)
    kl, kl_tokens = {}, {}
    for i, label in enumerate(labels):
        weighted, k = s[8 + 2 * i], s[9 + 2 * i]
        if k > 0:
            kl[label], kl_tokens[label] = weighted / k, int(k)
    return OPDStats(loss=stats.loss, kl=kl, kl_tokens=kl_tokens, entropy=s[2] / s[3] if s[3] else 0.0, tokens=int(s[1]),
                    response_length=s[4] / s[6], seq_len=stats.seq_len, sequence_tokens=int(s[5]),
                    expert_counts=stats.expert_counts, seconds=stats.seconds, resumed=int(s[7]))
