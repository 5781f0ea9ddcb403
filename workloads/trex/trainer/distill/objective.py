"""Mode opd: rollouts of the step's prompts with the current weights, the teachers' pass and the backward of the
reverse KL (trex.trainer.distill.run)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import nn

from trex.runtime.device import torch_dtype
from trex.trainer.distill.opd import VocabParallel
from trex.trainer.distill.run import OPDRanks, OPDRun
from trex.trainer.distill.teacher import TeacherLayout, vocab_rows
from trex.trainer.objective import Outcome, RunContext, Series
from trex.trainer.parallel.decode import DecodeReplica
from trex.trainer.parallel.parallelize import shared_over_tp
from trex.trainer.rollout.vllm_engine import push_for_step, rollout_outcome, run_engine
from trex.verify.items import Item


@dataclass(frozen=True)
class OPDStepInfo:
    """What an opd step adds to the record: its OPDStats and the teacher pool's counters."""

    kl: dict[str, float]
    entropy: float
    response_length: float
    seconds: dict[str, float]
    cache_hit_bytes: int
    cache_spilled_bytes: int
    teacher_switches: int
    teacher_loads: int
    resumed_tokens: int = 0
    """Response tokens read back from the step's rollout log (a rerun of an interrupted step)."""

    def metrics(self) -> dict[str, float]:
        """The step's JSONL fields."""
        return {**{f"opd_kl_{t}": v for t, v in self.kl.items()}, "opd_entropy": self.entropy,
                "opd_response_length": self.response_length,
                **{f"opd_{k}_seconds": v for k, v in self.seconds.items()},
                "opd_cache_hit_bytes": self.cache_hit_bytes, "opd_cache_spilled_bytes": self.cache_spilled_bytes,
                "opd_teacher_switches": self.teacher_switches, "opd_teacher_loads": self.teacher_loads,
                "opd_resumed_tokens": self.resumed_tokens}

    def series(self) -> list[Series]:
        """The step's Prometheus samples."""
        return [*(Series("opd_kl", kl, {"teacher": t}) for t, kl in self.kl.items()),
                Series("opd_student_entropy", self.entropy),
                Series("opd_cache_hit_bytes_total", self.cache_hit_bytes, counter=True),
                Series("opd_cache_spilled_bytes_total", self.cache_spilled_bytes, counter=True),
                Series("opd_teacher_switches", self.teacher_switches)]


def vocab_parallel(ctx: RunContext) -> tuple[VocabParallel | None, tuple[int, int] | None]:
    """The vocabulary-parallel KL's layout over this stage's data-parallel x tp ranks (a collective: every rank
    builds the groups) and this rank's vocabulary rows (trex.trainer.distill.teacher.vocab_rows: inside the FSDP2
    shard of the heads it holds); one tp rank of each data-parallel rank (tp rank 0) sends its tokens."""
    import torch.distributed as dist

    assert ctx.meshes is not None
    dims, dense = ctx.dims, ctx.meshes.dense
    if dims.dp * dims.tp == 1:
        return None, None
    grid = dense.mesh  # [pp, dp_replicate, dp_shard, cp, tp] global ranks (opd runs at cp 1: rules.context_problems)
    coord = dense.get_coordinate()
    assert coord is not None
    stage, rep, shard, _cp, tp_rank = coord
    group = None
    for p in range(grid.shape[0]):  # every rank creates every stage's group, in order
        g = dist.new_group([int(r) for r in grid[p].flatten()])
        if p == stage:
            group = g
    owner = dist.get_process_group_ranks(group).index(int(grid[stage, rep, shard, 0, 0]))
    start, end = vocab_rows(ctx.cfg.model.args.vocab_size, dims, rep, shard, tp_rank)
    tp_mesh = dense["tp"]

    def shard_of(w: torch.Tensor) -> torch.Tensor:
        return (shared_over_tp(w, tp_mesh) if dims.tp > 1 else w)[start:end]

    return VocabParallel(group, shard_of, start, tp_rank == 0, owner), (start, end)


def opd_ranks(ctx: RunContext, replica: DecodeReplica | None, tp_group: Any) -> OPDRanks:
    """Where this rank of a parallel opd run stands: its data-parallel share, the layout the teachers are
    distributed by, the vocabulary-parallel KL over the data-parallel x tp ranks, and the decoding replica."""
    if ctx.meshes is None:
        return OPDRanks()
    vocab, rows = vocab_parallel(ctx)
    return OPDRanks(ctx.dp_rank, ctx.dims.dp, ctx.sum_over_ranks, TeacherLayout(ctx.dims, ctx.meshes, rows),
                    vocab, replica, tp_group)


class OPDObjective:
    """On-policy distillation from the configured teachers (reverse KL on the student's own samples)."""

    loss_key = "opd"
    watch_spikes = False
    """The KL's level moves with the teachers: no spike detection."""

    def __init__(self, ctx: RunContext, tokenizer: Tokenizer, items: Sequence[Item], vocab: int,
                 replica: DecodeReplica | None, tp_group: Any) -> None:
        """The prompts' teachers, the teacher pool and the sampling (ValueError naming the field)."""
        self.ctx, self.tokenizer, self.replica = ctx, tokenizer, replica
        self.run = OPDRun(ctx.cfg, tokenizer, items, ctx.device, torch_dtype(ctx.cfg.model.dtype), ctx.ckpt_dir,
                          vocab, opd_ranks(ctx, replica, tp_group))
        self.engine = run_engine(ctx)
        self.run.engine = self.engine

    def notes(self) -> list[str]:
        """Nothing to say before the run."""
        return []

    def prepare(self) -> None:
        """The teachers load lazily at their first step."""

    def backward(self, model: nn.Module, step: int) -> Outcome:
        """Rollouts, the teachers' pass and the reverse KL's backward of step ``step``."""
        run = self.run
        push = push_for_step(self.engine, self.ctx, step) if self.engine is not None else {}
        with self.ctx.autocast():
            stats = run.step(model, step)
        cache, teachers = run.pool.cache.take_stats(), run.pool.take_stats()
        info = OPDStepInfo(kl=stats.kl, entropy=stats.entropy, response_length=stats.response_length,
                           seconds=stats.seconds, cache_hit_bytes=cache.hit_bytes,
                           cache_spilled_bytes=cache.spilled_bytes, teacher_switches=teachers.switches,
                           teacher_loads=teachers.trunk_loads, resumed_tokens=stats.resumed)
        o = self.ctx.cfg.opd
        cut, cut_series = rollout_outcome(self.engine) if self.engine is not None else ({}, [])
        return Outcome({"opd": stats.loss, "total": stats.loss}, stats.expert_counts, float(stats.tokens),
                       stats.sequence_tokens, stats.seq_len, o.prompts_per_step * o.samples_per_prompt,
                       {**info.metrics(), **push, **cut},
                       info.series() + [Series(k, v) for k, v in push.items()] + cut_series, {}, info)

    def state_dict(self) -> dict[str, Any]:
        """Nothing: the step number alone places the prompts and their samples, and the rollout logs sit beside the
        checkpoints (a resumed step reads its log back, as mode grpo's does)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see state_dict)."""

    def summary(self) -> dict[str, Any]:
        """No entries beyond the loop's."""
        return {}

    def summary_line(self) -> str:
        """Nothing beyond loss and MFU."""
        return ""

    def close(self) -> None:
        """Remove the teacher cache's spill files and stop its copy engine; a server this run spawned stops."""
        self.run.close()
        if self.engine is not None:
            self.engine.close()
