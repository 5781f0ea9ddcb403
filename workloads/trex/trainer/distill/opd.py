"""One on-policy distillation step: the student samples responses, the teachers' trunks run once over them,
and the student minimises sum_i w_i KL(p_student || p_teacher_i) over the response tokens.

The student's trunk runs forward once; its pre-head hidden states are detached and each teacher's KL (with
the student's head) is computed and back-propagated on its own, so only one teacher head is in use at a
time and its tensors are freed before the next arrives; the accumulated hidden-state gradient then flows
through the student's trunk in one backward.

Under a parallel layout the token mean runs over every data-parallel rank's tokens (``tokens``), every rank runs
the forward and backward even with nothing to score (they hold collectives), and the KL is vocabulary-parallel over
the data-parallel x tp ranks (:class:`VocabParallel`): each rank scores its shard of the vocabulary for the tokens
of every data-parallel rank, so no rank holds a whole teacher head.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trex.trainer.distill.kl import Estimator, KLOutput, reverse_kl, token_coefficients
from trex.trainer.distill.teacher import Group, TeacherPool, teacher_groups
from trex.trainer.model.model import DeepSeekModel
from trex.trainer.rl.step import pack as rl_pack
from trex.trainer.rollout import Rollout, SamplingParams, generate


@dataclass
class OPDBatch:
    """Prompts + responses, right-padded: ``input_ids`` [B, L]; ``mask`` [B, L] marks the positions whose
    next token is a response token (prompt tokens and padding are masked); ``targets`` [B, L] the next
    tokens (the sampled ones, for the sampled-token estimator); ``teachers[b]`` the teachers of sample b."""

    input_ids: torch.Tensor
    mask: torch.Tensor
    targets: torch.Tensor
    teachers: list[list[str]]

    @property
    def tokens(self) -> int:
        """Scored (response) tokens."""
        return int(self.mask.sum())


def pack(rollouts: Sequence[Rollout], teachers: Sequence[Sequence[str]], pad_id: int = 0) -> OPDBatch:
    """The rollouts as one right-padded batch, laid out as GRPO's (:func:`trex.trainer.rl.step.pack`; the model is
    causal: padding after a sequence changes nothing before it). Stale tokens (sampled under an older policy version
    than their rollout's) are context but not scored, as GRPO's loss masks them."""
    b = rl_pack(rollouts, pad_id)
    return OPDBatch(b.input_ids, b.mask & ~b.stale, b.targets, [list(t) for t in teachers])


@dataclass(frozen=True)
class VocabParallel:
    """How the KL splits the vocabulary over the data-parallel x tp ranks: each rank of ``group`` scores its rows
    (from ``start``, about V / size of them: trex.trainer.distill.teacher.vocab_rows) of both heads for the tokens
    of every data-parallel rank (gathered: one tp rank of each data-parallel rank sends them), so no rank holds a
    whole teacher head."""

    group: Any
    shard: Callable[[torch.Tensor], torch.Tensor]
    """This rank's rows of the student's (gathered) head; its backward sums the head's gradient over tp (each rank's
    gradient covers its rows only, and FSDP2 sums it over the data-parallel ranks)."""
    start: int
    """This rank's first vocabulary row."""
    sends: bool
    """Whether this rank sends its data-parallel rank's tokens (tp rank 0 of it)."""
    owner: int
    """The rank in ``group`` that sends this rank's tokens (itself when ``sends``)."""


class _GatherRows(torch.autograd.Function):
    """The rows every rank of a group sends, concatenated in group order; the backward hands this rank the gradient
    of the block its tokens came in (whole already: the vocabulary-parallel KL sums it over the group)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: bool, counts: list[int], group: Any,
                take: tuple[int, int]) -> torch.Tensor:
        import torch.distributed as dist

        width = max(counts)
        buf = x.new_zeros((width, *x.shape[1:]))
        if send:
            buf[:x.shape[0]] = x
        parts = [torch.empty_like(buf) for _ in counts]
        dist.all_gather(parts, buf, group=group)
        ctx.take = take
        return torch.cat([p[:c] for p, c in zip(parts, counts, strict=True)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a, b = ctx.take
        return grad[a:b], None, None, None, None


def vocab_parallel_kl(hs: torch.Tensor, head: torch.Tensor, ht: torch.Tensor, wt: torch.Tensor, coef: torch.Tensor,
                      tokens: torch.Tensor, vocab: VocabParallel, *, estimator: Estimator,
                      chunk_size: int) -> tuple[KLOutput, slice] | None:
    """:func:`reverse_kl` over the tokens of every data-parallel rank, this rank scoring its vocabulary rows
    (``head`` and ``wt`` are those rows of the student's and the teacher's head). Returns the result over the gathered
    tokens (its loss the whole group's; gradients reach ``hs`` for this rank's own tokens) and the slice of them that
    are this rank's, or None when no rank has a token (a collective: every rank of the group calls it)."""
    import torch.distributed as dist

    n = hs.shape[0]
    mine = torch.tensor([n if vocab.sends else 0], dtype=torch.long, device=hs.device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size(vocab.group))]
    dist.all_gather(every, mine, group=vocab.group)
    counts = [int(c) for c in every]
    if sum(counts) == 0:
        return None
    start = sum(counts[:vocab.owner])
    take = (start, start + n)

    def gather(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _GatherRows.apply(x, vocab.sends, counts, vocab.group, take)  # type: ignore[no-untyped-call]
        return out

    with torch.no_grad():
        ht_all, coef_all, tokens_all = gather(ht.detach()), gather(coef.detach()), gather(tokens)
    res = reverse_kl(gather(hs), head, ht_all, wt, coef_all, estimator=estimator, tokens=tokens_all,
                     chunk_size=chunk_size, group=vocab.group, vocab_start=vocab.start)
    return res, slice(*take)


@dataclass
class OPDStats:
    """What one step measured (floats, detached)."""

    loss: float
    kl: dict[str, float]
    """Mean KL per teacher over its tokens (full-vocab: exact; sampled-token: the mean log-ratio)."""
    kl_tokens: dict[str, int]
    """Tokens each teacher scored (the weights of the KL means across ranks)."""
    entropy: float
    """The student's mean entropy over the scored tokens."""
    tokens: int
    """Scored (response) tokens."""
    response_length: float
    """Mean response tokens per sample."""
    seq_len: int
    """Length of the packed batch (longest prompt + response)."""
    sequence_tokens: int = 0
    """Prompt + response tokens of every sample (what the student's forward reads, padding aside)."""
    resumed: int = 0
    """Response tokens read back from the step's rollout log (a rerun of an interrupted step) instead of sampled."""
    expert_counts: torch.Tensor | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    """rollout, teacher and student wall seconds."""


def opd_backward(student: DeepSeekModel, batch: OPDBatch, pool: TeacherPool, *, estimator: Estimator,
                 chunk_size: int, tokens: float | None = None, vocab: VocabParallel | None = None,
                 collective: bool = False) -> OPDStats:
    """Teacher pass, student forward, per-teacher KL and backward (gradients accumulate into the student's
    .grad). ``tokens``: the scored tokens of the whole step (default this batch's), the token mean's denominator;
    ``collective``: one rank of several (forward and backward run even when this batch scores nothing). Returns
    this batch's statistics (timings of the teacher and student parts; tokens 0 when no response has a token)."""
    device = pool.device
    weights = {label: t.weight for label, t in pool.teachers.items()}
    groups = teacher_groups(pool.labels, batch.teachers, batch.mask, weights)
    if not groups and not collective:  # every response empty (the prompts filled the context): no backward
        return OPDStats(loss=0.0, kl={}, kl_tokens={}, entropy=0.0, tokens=0, response_length=0.0,
                        seq_len=batch.input_ids.shape[1])
    t0 = time.perf_counter()
    pool.teacher_pass(batch.input_ids, groups)
    t1 = time.perf_counter()
    out = student(batch.input_ids.to(device), logits=False)
    assert out.hidden is not None and out.head_weight is not None
    flat = out.hidden.reshape(-1, out.hidden.shape[-1])
    hs = flat.detach().requires_grad_()
    targets = batch.targets.reshape(-1).to(device)
    n = float(batch.tokens) if tokens is None else tokens
    head = out.head_weight if vocab is None else vocab.shard(out.head_weight)
    loss, kl, kl_n, ent, ent_n = 0.0, {}, {}, 0.0, 0
    if vocab is not None:  # every teacher on every rank, in configuration order: the KL is a collective
        mine = {g.label: g for g in groups}
        groups = [mine.get(label) or Group(label, weights[label], torch.zeros(0, dtype=torch.long))
                  for label in pool.labels]
    for g, ht, wt in pool.stream(groups):
        pos = g.positions.to(device)
        coef = (token_coefficients(torch.ones(pos.shape[0], device=device), g.weight, denominator=n) if n > 0
                else torch.zeros(0, dtype=torch.float64, device=device))
        if vocab is None:
            res = reverse_kl(hs[pos], head, ht, wt, coef, estimator=estimator, tokens=targets[pos],
                             chunk_size=chunk_size)
            own = slice(0, pos.shape[0])
        else:
            part = vocab_parallel_kl(hs[pos], head, ht, wt, coef, targets[pos], vocab, estimator=estimator,
                                     chunk_size=chunk_size)
            if part is None:
                continue
            res, own = part
        torch.autograd.backward(res.loss)
        if pos.shape[0]:
            loss += float((res.kl[own] * coef.to(res.kl.dtype)).sum())
            kl[g.label] = float(res.kl[own].mean())
            kl_n[g.label] = pos.shape[0]
            ent += float(res.entropy[own].sum())
            ent_n += pos.shape[0]
        del ht, wt, res
    # Nothing scored on this rank: a zero gradient still runs the trunk's backward (its reductions are collective).
    torch.autograd.backward(flat, hs.grad if hs.grad is not None else torch.zeros_like(flat))
    t2 = time.perf_counter()
    lengths = batch.mask.sum(1).double()
    return OPDStats(loss=loss, kl=kl, kl_tokens=kl_n, entropy=ent / max(ent_n, 1), tokens=batch.tokens,
                    response_length=float(lengths.mean()), seq_len=batch.input_ids.shape[1], expert_counts=out.expert_counts.detach(),
                    seconds={"teacher": t1 - t0, "student": t2 - t1})


Sampler = Callable[[list[list[int]], list[int]], list[Rollout]]
"""(prompts, sample ids) -> one rollout per prompt (how and on which model a layout decodes)."""


def opd_step(student: DeepSeekModel, prompts: Sequence[Sequence[int]], teachers: Sequence[Sequence[str]],
             pool: TeacherPool, params: SamplingParams, *, samples_per_prompt: int, seed: int, step: int,
             estimator: Estimator, chunk_size: int, first_prompt: int = 0, step_prompts: int | None = None,
             sampler: Sampler | None = None, reduce: Callable[[list[float]], list[float]] | None = None,
             vocab: VocabParallel | None = None) -> OPDStats:
    """Sample ``samples_per_prompt`` responses per prompt with the student as it is (policy version = step), then
    :func:`opd_backward`. ``teachers[i]``: the teachers of prompt i. One rank of several holds the step's prompts
    ``first_prompt`` onwards (of ``step_prompts``): sample ids depend on a prompt's place in the whole step, so
    every layout draws the same samples; ``sampler`` decodes (default: ``student`` here) and ``reduce`` sums over
    the data-parallel ranks (the token mean's denominator)."""
    g = samples_per_prompt
    expanded = [list(p) for p in prompts for _ in range(g)]
    per_step = (len(prompts) if step_prompts is None else step_prompts) * g
    ids = [step * per_step + first_prompt * g + i for i in range(len(expanded))]
    t0 = time.perf_counter()
    if sampler is None:
        rollouts = generate(student, expanded, params, seed, sample_ids=ids, policy_version=step)
    else:
        rollouts = sampler(expanded, ids)
    t1 = time.perf_counter()
    batch = pack(rollouts, [list(t) for t in teachers for _ in range(g)])
    total = float(batch.tokens) if reduce is None else reduce([float(batch.tokens)])[0]
    stats = opd_backward(student, batch, pool, estimator=estimator, chunk_size=chunk_size, tokens=total,
                         vocab=vocab, collective=reduce is not None)
    stats.seconds["rollout"] = t1 - t0
    stats.sequence_tokens = sum(len(r.prompt) + len(r.tokens) for r in rollouts)
    stats.resumed = sum(r.resumed for r in rollouts)
    return stats
