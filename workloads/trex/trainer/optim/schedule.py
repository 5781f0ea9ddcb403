"""LR schedule (warmup, constant, cosine to a floor) and the global batch-size ramp, as pure functions."""

from __future__ import annotations

import math
from collections.abc import Sequence


def lr_factor(step: int, total_steps: int, warmup_steps: int, constant_steps: int, decay: str,
              min_lr_ratio: float) -> float:
    """Multiplier of the peak LR at optimizer step ``step`` (0-based).

    Warmup: (step + 1) / warmup for step < warmup; then 1.0 for ``constant_steps``; then cosine from 1.0
    (first decay step) down to ``min_lr_ratio`` (step total - 1); ``decay="none"`` stays at 1.0.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    start = warmup_steps + constant_steps
    if decay == "none" or step < start:
        return 1.0
    span = total_steps - 1 - start
    if span <= 0:
        return min_lr_ratio
    progress = min((step - start) / span, 1.0)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def global_batch_at(step: int, ramp: Sequence[tuple[int, int]], default: int) -> int:
    """Sequences per optimizer step at ``step``: the last ramp entry with entry.step <= step, else ``default``."""
    size = default
    for start, batch in sorted(ramp):
        if start <= step:
            size = batch
    return size


def micro_steps(global_batch: int, micro_batch: int, dp: int) -> int:
    """Gradient-accumulation micro-steps per optimizer step on each data-parallel rank."""
    per_step = micro_batch * dp
    if global_batch % per_step:
        raise ValueError(f"global batch {global_batch} is not a multiple of microBatchSize x dp = {per_step}")
    return global_batch // per_step


def seq_len_at(step: int, curriculum: Sequence[tuple[int, int]], default: int) -> int:
    """Packed sequence length at ``step`` from a (step, seq_len) curriculum, else ``default``."""
    return global_batch_at(step, curriculum, default)
