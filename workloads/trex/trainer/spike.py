"""Training stability: a robust loss-spike detector and anticipatory routing driven by it.

The detector keeps a window of recent (non-spike) losses; a loss whose robust z-score
(loss - median) / (1.4826 MAD) exceeds the threshold is a spike, once warm-up has passed and no
spike fired within the cooldown. When one fires, the loop routes with router (gate) weights from
Δt steps earlier for a number of steps while the backbone keeps its current parameters.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

MAD_TO_SIGMA = 1.4826
"""MAD of a normal distribution times this is its standard deviation."""


def robust_z(value: float, window: list[float]) -> float:
    """(value - median) / (1.4826 MAD) over ``window``; the scale is floored so a flat window is not degenerate."""
    med = statistics.median(window)
    mad = statistics.median(abs(x - med) for x in window)
    scale = max(MAD_TO_SIGMA * mad, 1e-3 * abs(med), 1e-8)
    return (value - med) / scale


@dataclass
class SpikeDetector:
    """Robust median + MAD z-score over a window of past losses, with warm-up and cooldown."""

    window: int = 50
    z_threshold: float = 4.0
    warmup_steps: int = 50
    cooldown_steps: int = 20
    history: deque[float] = field(default_factory=deque)
    seen: int = 0
    last_fire: int | None = None
    fired_total: int = 0

    def observe(self, step: int, loss: float) -> bool:
        """Record ``loss`` at ``step``; True when it is a spike. Spikes do not enter the trend window."""
        fire = False
        if self.seen >= self.warmup_steps and len(self.history) >= 2 and math.isfinite(loss):
            cooled = self.last_fire is None or step - self.last_fire > self.cooldown_steps
            fire = cooled and robust_z(loss, list(self.history)) > self.z_threshold
        self.seen += 1
        if fire:
            self.last_fire = step
            self.fired_total += 1
        elif math.isfinite(loss):
            self.history.append(loss)
            while len(self.history) > self.window:
                self.history.popleft()
        return fire

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically after a resume."""
        return {"history": list(self.history), "seen": self.seen, "last_fire": self.last_fire,
                "fired_total": self.fired_total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.history = deque(float(x) for x in state["history"])
        self.seen = int(state["seen"])
        self.last_fire = None if state["last_fire"] is None else int(state["last_fire"])
        self.fired_total = int(state["fired_total"])


class AnticipatoryRouting:
    """Ring buffer of gate-weight snapshots; while active, routes with the snapshot from Δt steps earlier.

    ``snapshot`` is called at the start of every step (before ``prepare``), so the buffer holds the router
    weights of the current and the Δt previous steps, ready to use the moment a spike fires. A sharded router
    weight is kept as this rank's shard only (no collective per step, 1/N of the memory); the Δt-old shards are
    gathered into whole weights only for the steps that route with them (every rank of the router's mesh calls
    ``prepare`` at the same steps, so the gathers line up).
    """

    def __init__(self, gates: Callable[[], list[tuple[str, Any]]],
                 apply: Callable[[dict[str, torch.Tensor] | None], None], delta: int, window: int) -> None:
        self._gates = gates
        self._apply = apply
        self.delta = delta
        self.window = window
        self.snapshots: deque[dict[str, torch.Tensor]] = deque(maxlen=delta + 1)
        self.active_from = 0
        self.active_until = -1

    def snapshot(self) -> None:
        """Cache the current gate weights (detached copies of this rank's shards)."""
        self.snapshots.append({name: _local(g.weight).detach().clone() for name, g in self._gates()})

    def trigger(self, step: int) -> None:
        """A spike fired at ``step``: route with old weights for steps step+1 .. step+window."""
        self.active_from = step + 1
        self.active_until = step + self.window

    def is_active(self, step: int) -> bool:
        """Whether anticipatory routing applies at ``step``."""
        return self.active_from <= step <= self.active_until

    def prepare(self, step: int) -> bool:
        """Install the Δt-old router weights for ``step`` (or clear them); returns whether they are in use."""
        if self.is_active(step) and self.snapshots:
            old = self.snapshots[0]
            self._apply({name: _whole(old[name], g.weight) for name, g in self._gates()})
            return True
        self._apply(None)
        return False

    def state_dict(self) -> dict[str, Any]:
        """Snapshots (this rank's shards, with the layout they were taken under) and the active window, for a
        bit-identical resume."""
        return {"active_from": self.active_from, "active_until": self.active_until,
                "snapshots": [dict(s) for s in self.snapshots], "layout": self._layout()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`. Shards taken under another layout (a resume at another world size) are not
        this rank's: they are dropped, and the buffer refills over the next Δt steps."""
        self.active_from = int(state["active_from"])
        self.active_until = int(state["active_until"])
        shapes = {name: tuple(_local(g.weight).shape) for name, g in self._gates()}
        same = state.get("layout", self._layout()) == self._layout() and all(
            {k: tuple(v.shape) for k, v in snap.items()} == shapes for snap in state["snapshots"])
        self.snapshots = deque((dict(s) for s in state["snapshots"] if same), maxlen=self.delta + 1)

    def _layout(self) -> dict[str, str]:
        """Per gate: the global and local shape and the placement of this rank's shard."""
        out = {}
        for name, g in self._gates():
            w = g.weight
            where = (f"{tuple(w.placements)}@{w.device_mesh.get_coordinate()}" if hasattr(w, "placements")
                     else "whole")
            out[name] = f"{tuple(w.shape)}/{tuple(_local(w).shape)}/{where}"
        return out


def finite(*values: float) -> bool:
    """True when every value is finite (the NaN/Inf guard's decision)."""
    return all(math.isfinite(v) for v in values)


def _local(t: Any) -> Any:
    """This rank's shard of a (possibly sharded) parameter: the tensor itself when it is not a DTensor."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _whole(shard: torch.Tensor, like: Any) -> torch.Tensor:
    """The whole router weight from this rank's ``shard`` of it, sharded as the parameter ``like`` is: a collective
    on every rank of its mesh, run only for the steps that route with an old weight (the gate's forward needs the
    whole [E, D] weight to score every expert; planned as MemoryPlan.router_gather). A shard stored in host memory (a master under optimizer.swap) is
    gathered from a device copy: the device backend cannot gather host tensors."""
    if not hasattr(like, "placements"):
        return shard
    from torch.distributed.tensor import DTensor

    mesh = like.device_mesh
    return DTensor.from_local(shard.to(mesh.device_type), mesh, like.placements, run_check=False, shape=like.shape,
                              stride=like.stride()).full_tensor()
