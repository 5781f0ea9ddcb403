"""The floor under the kernel backends and the cost models: device facts, parameter spaces and their search
directions, and the source hash naming a rendered kernel.

`backends.base` (the backend interface), `roofline`, `tiling`, `profile` and `machine` all build on these,
so none of them has to import the backends package to describe a device or a parameter.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass, field

Params = dict[str, int]
ParamSpace = dict[str, tuple[int, ...]]

DIRECTION_OF: dict[str, str] = {
    "BLOCK": "tile", "MB": "tile", "NB": "tile", "KB": "tile", "VEC": "vectorise", "EXP_POLY": "vectorise",
    "UNROLL": "unroll", "CHUNK": "multi-row", "ROWS": "multi-row", "ORDER": "loop-order", "FUSED": "fusion",
    "ACC_DOUBLE": "accumulation", "THREADS": "threads", "WARPS": "threads", "STAGES": "tile",
    "TILE_LEN": "tile", "BUFFER_NUM": "tile", "BLOCK_DIM": "threads",
}
DIRECTIONS: tuple[str, ...] = (
    "tile", "vectorise", "unroll", "multi-row", "loop-order", "fusion", "accumulation", "threads",
)


@dataclass(frozen=True)
class DeviceFacts:
    """What the cost model and the ceiling check need: peaks, bandwidth per memory level, capacities."""

    name: str
    peak_flops: float
    """FLOP/s (fp32) of the whole device with all its cores."""
    bandwidth: float
    """Sustained DRAM/HBM bandwidth (B/s)."""
    caches: dict[str, int]
    """Capacity (bytes) per level, innermost first (L1/L2/L3, or UB for an AI core)."""
    level_bandwidth: dict[str, float] = field(default_factory=dict)
    """Measured bandwidth (B/s) when the working set fits in that level."""
    cores: int = 1
    source: str = "measured"
    level_bandwidth_1t: dict[str, float] = field(default_factory=dict)
    """Single-thread bandwidth (B/s) per level, with key DRAM for memory; empty when not measured."""

    def bandwidth_for(self, working_set: float, threads: int = 0) -> float:
        """Bandwidth of the innermost level that holds ``working_set`` bytes (DRAM when none does);
        ``threads`` == 1 selects the single-thread figures when measured."""
        table = self.level_bandwidth_1t if threads == 1 and self.level_bandwidth_1t else self.level_bandwidth
        for level, cap in self.caches.items():
            if working_set <= cap and level in table:
                return table[level]
        if threads == 1 and "DRAM" in self.level_bandwidth_1t:
            return self.level_bandwidth_1t["DRAM"]
        return self.bandwidth

    triad_curve: dict[int, float] = field(default_factory=dict)
    """Measured triad bandwidth (B/s) at all cores by working-set bytes, several sizes per level."""
    triad_curve_1t: dict[int, float] = field(default_factory=dict)
    """The same at one thread."""

    def level_of(self, working_set: float) -> str:
        """The innermost cache level holding ``working_set`` bytes, else 'DRAM'."""
        for level, cap in self.caches.items():
            if working_set <= cap:
                return level
        return "DRAM"

    def bandwidth_at(self, working_set: float, threads: int = 0) -> float:
        """Measured triad bandwidth for a ``working_set`` at ``threads`` (1 = single-thread curve): log-size
        interpolation between the measured sizes of the level holding it, clamped to that level's
        smallest and largest measured sizes (never borrowing a neighbouring level's speed); the per-level
        figure (``bandwidth_for``) when no curve was measured."""
        curve = self.triad_curve_1t if threads == 1 and self.triad_curve_1t else self.triad_curve
        level = self.level_of(working_set)
        pts = sorted((s, b) for s, b in curve.items() if self.level_of(s) == level)
        if not pts:
            return self.bandwidth_for(working_set, threads)
        if working_set <= pts[0][0]:
            return pts[0][1]
        for (s0, b0), (s1, b1) in itertools.pairwise(pts):
            if working_set <= s1:
                f = math.log(working_set / s0) / math.log(s1 / s0)
                return b0 + f * (b1 - b0)
        return pts[-1][1]


def source_hash(text: str) -> str:
    """Content hash naming a rendered kernel (and its compiled artefact)."""
    return hashlib.sha256(text.encode()).hexdigest()[:20]
