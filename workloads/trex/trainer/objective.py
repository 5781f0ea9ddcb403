"""What the training loop steps, whatever the mode: an :class:`Objective` runs one optimizer step's forward and
backward (gradients accumulate in the model) and says what happened in an :class:`Outcome` whose metrics are
plain numbers. The loop does the rest (clipping, optimizer step, expert-bias update, checkpoints, telemetry).

The modes (lm, grpo, opd) implement it beside their own code (trex.trainer.data.objective,
trex.trainer.rl.objective, trex.trainer.distill.objective); trex.trainer.modes picks one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from trex.trainer.config import TrainerConfig

if TYPE_CHECKING:
    from trex.trainer.parallel.mesh import Meshes, ParallelDims


@dataclass(frozen=True)
class Series:
    """One Prometheus sample of a step: ``trex_train_<name>`` with extra labels, set (gauge) or added (counter)."""

    name: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)
    counter: bool = False


@dataclass
class Outcome:
    """One step's forward and backward, as the loop needs it."""

    parts: dict[str, float]
    """This rank's share of the loss parts (the loop sums them over ranks under a parallel layout)."""
    counts: torch.Tensor | None
    """Summed expert token counts (MoE layers x routed experts), None when no micro-batch ran."""
    valid_tokens: float
    """Tokens the loss averaged over, on every rank (0: the step has no loss and is skipped)."""
    tokens: int
    """Tokens through the model on every rank (tokens per second, MFU)."""
    seq_len: int
    global_batch: int
    metrics: dict[str, float] = field(default_factory=dict)
    """The mode's own JSONL fields (named as they are logged)."""
    series: list[Series] = field(default_factory=list)
    """The mode's own Prometheus samples."""
    tallies: dict[str, dict[str, int]] = field(default_factory=dict)
    """Named counts by category, logged as JSONL objects (e.g. verifier outcomes)."""
    stats: Any = None
    """The mode's typed statistics of the step (GRPOStats, OPDStepInfo; None for lm)."""


class Objective(Protocol):
    """One training mode's side of a step."""

    loss_key: str
    """The loss part that is the step's loss (its finiteness guards the step)."""
    watch_spikes: bool
    """Whether the loss is a language-model loss whose spikes the stability detector watches."""
    tokenizer: Any
    """The run's tokenizer (the Hugging Face export writes it)."""

    def notes(self) -> list[str]:
        """Lines worth logging once before the run (what the data looks like)."""
        ...

    def prepare(self) -> None:
        """Build what the objective needs once the model exists (before any resume)."""
        ...

    def backward(self, model: nn.Module, step: int) -> Outcome:
        """Forward and backward of optimizer step ``step``."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a bit-identical resume needs of the objective (the data position)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        ...

    def summary(self) -> dict[str, Any]:
        """The run's entries of the termination summary (camelCase keys)."""
        ...

    def summary_line(self) -> str:
        """What the run's last log line adds (", reward a -> b"; empty for none)."""
        ...

    def close(self) -> None:
        """Release what the objective holds beyond the run (files, copy engines)."""
        ...


@dataclass
class RunContext:
    """Where one rank of a run stands: its config, device and layout, and the reductions every objective uses."""

    cfg: TrainerConfig
    device: torch.device
    dims: ParallelDims
    meshes: Meshes | None
    """None: one process."""
    dp_rank: int
    dp_group: Any
    """The data-parallel ranks (None in one process)."""
    ckpt_dir: Path
    rank: int = 0
    cp_rank: int = 0
    """Which chunks of each sequence this rank holds under context parallelism (trex.trainer.parallel.context)."""
    export: Callable[[Path], Path] | None = None
    """Write the model's Hugging Face export into a folder (collective; set by the loop once the model exists):
    how an external rollout engine gets the weights."""
    weights: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    """Open the model's weights as a weight-transfer push reads them (every rank; set by the loop with ``export``):
    trex.trainer.rollout.weight_transfer.TrainerWeights, for rollout.weightPush transfer."""

    def sum_over_ranks(self, values: list[float]) -> list[float]:
        """Element-wise sum over the data-parallel (and context-parallel) ranks (identity in a single process)."""
        if self.dp_group is None:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.dp_group)
        return [float(v) for v in t.tolist()]

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast around forward and loss when model.autocast asks for it, else nothing."""
        return autocast(self.cfg, self.device)


def autocast(cfg: TrainerConfig, dev: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast around forward and loss when model.autocast asks for it, else nothing."""
    if cfg.model.autocast == "bf16":
        return torch.autocast(dev.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def load_cv(counts: torch.Tensor) -> float:
    """Mean over MoE layers of std/mean of per-expert token counts (0 = perfectly balanced); layers that routed
    nothing (MTP modules a GRPO forward skips) do not count."""
    c = counts.double()
    c = c[c.sum(-1) > 0] if c.dim() == 2 else c
    if c.numel() == 0:
        return 0.0
    mean = c.mean(-1).clamp(min=1e-12)
    return float((c.std(-1, unbiased=False) / mean).mean())
