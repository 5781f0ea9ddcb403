"""The per-step rollout logs of one rank, beside the checkpoints (modes grpo and opd, either engine).

A step's rollouts are logged to ``<checkpoint.dir>/rollouts/step-<step>-<name>.wal`` (:class:`RolloutLog`), ``name``
being the rank's (``rank-<dp rank>``, plus ``-tp-<tp rank>`` under tensor parallelism, where each tp rank logs its
share of its data-parallel rank's samples). A trainer restarted from its checkpoint reruns the step after it and
finds that step's log: every sample continues from the tokens logged, never from scratch. Opening a step's log removes
this rank's logs of other steps first: a step that is rerun from a checkpoint before them regenerates what they held,
draw for draw, and the log of the step after the newest checkpoint is the only one a restart can need.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trex.trainer.rollout.wal import RolloutLog

WAL_DIR = "rollouts"
"""Folder under the checkpoint root holding the current step's rollout logs."""


def log_name(dp_rank: int, tp_group: Any = None) -> str:
    """This rank's log name: its data-parallel rank, and its tp rank when a tp group splits its samples."""
    name = f"rank-{dp_rank:05d}"
    if tp_group is not None:
        import torch.distributed as dist

        name += f"-tp-{dist.get_rank(tp_group):03d}"
    return name


@dataclass(frozen=True)
class StepLogs:
    """The rollout logs of one rank in ``folder`` (fsynced every ``fsync_every`` tokens; 0: at close only)."""

    folder: Path
    name: str = "rank-00000"
    fsync_every: int = 64

    def path(self, step: int) -> Path:
        """This rank's log of ``step``."""
        return self.folder / f"step-{step:08d}-{self.name}.wal"

    def prune(self, step: int) -> None:
        """Remove this rank's logs of every step but ``step``."""
        keep = self.path(step)
        if self.folder.is_dir():
            for old in self.folder.glob(f"step-*-{self.name}.wal"):
                if old != keep:
                    old.unlink()

    def for_step(self, step: int) -> RolloutLog:
        """The log of ``step`` (what it holds is read back when a rollout opens it), other steps' logs removed."""
        self.prune(step)
        return RolloutLog(self.path(step), self.fsync_every)
