"""Backend interface: render a kernel's source for given parameters, compile it, run it, report device facts.

A backend owns a parameter space per kernel (name -> allowed values). Every parameter belongs to a
search *direction* (tile, vectorise, unroll, multi-row, loop-order, fusion, accumulation, threads),
which is what skills and the search talk about.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trex.kernels.suite.base import KernelSpec, torch_dtype

if TYPE_CHECKING:
    import torch

    from trex.kernels.tiling import TilingModel

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


class BackendUnavailable(RuntimeError):
    """The backend's toolchain or device is missing on this machine (raised at compile/run time)."""


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


class Compiled(ABC):
    """A compiled kernel variant bound to one (kernel, params, dtype)."""

    spec: KernelSpec
    params: Params
    dtype: str
    source_hash: str

    @abstractmethod
    def bind(self, inputs: Mapping[str, torch.Tensor], outputs: Mapping[str, torch.Tensor],
             shape: Mapping[str, int]) -> Callable[[], None]:
        """A zero-argument launcher writing ``outputs`` from ``inputs`` (arguments marshalled once)."""

    def __call__(self, inputs: Mapping[str, torch.Tensor], shape: Mapping[str, int]) -> dict[str, torch.Tensor]:
        """Run once into fresh NaN-filled outputs and return them."""
        outs = alloc_outputs(self.spec, shape, self.dtype, device=_device_of(inputs))
        self.bind(inputs, outs, shape)()
        return outs


def _device_of(inputs: Mapping[str, Any]) -> str:
    for t in inputs.values():
        return str(t.device)
    return "cpu"


def alloc_outputs(spec: KernelSpec, shape: Mapping[str, int], dtype: str, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Outputs pre-filled with NaN (integers with -1) so a kernel that skips an element is caught."""
    import torch

    outs: dict[str, torch.Tensor] = {}
    for b in spec.outputs:
        td = torch_dtype(b.role, dtype)
        fill = -1 if b.role == "i64" else float("nan")
        outs[b.name] = torch.full(b.shape(shape), fill, dtype=td, device=device)
    return outs


class Backend(ABC):
    """One code generator + toolchain + device."""

    name: str

    @abstractmethod
    def supports(self, spec: KernelSpec, dtype: str) -> bool:
        """Whether this backend has a template for ``spec`` in ``dtype``."""

    @abstractmethod
    def param_space(self, spec: KernelSpec, shape: Mapping[str, int]) -> ParamSpace:
        """Allowed values per tunable parameter."""

    @abstractmethod
    def default_params(self, spec: KernelSpec, shape: Mapping[str, int]) -> Params:
        """A plain, valid starting configuration (the search's root when no model is used)."""

    @abstractmethod
    def render(self, spec: KernelSpec, params: Mapping[str, int], dtype: str) -> str:
        """Full kernel source for these parameters."""

    @abstractmethod
    def compile(self, spec: KernelSpec, params: Mapping[str, int], dtype: str) -> Compiled:
        """Build (or fetch from the cache) the variant; BackendUnavailable when the toolchain is missing."""

    @abstractmethod
    def facts(self) -> DeviceFacts:
        """Peak FLOP/s, bandwidths and capacities of the device."""

    def predict(self, spec: KernelSpec, shape: Mapping[str, int], dtype: str, params: Mapping[str, int],
                facts: DeviceFacts) -> float:
        """Cost-model seconds of a configuration (default: the cpu-c roofline model)."""
        from trex.kernels.roofline import predict

        return predict(spec, shape, dtype, params, facts)

    def tiling_model(self, spec: KernelSpec, shape: Mapping[str, int], dtype: str, facts: DeviceFacts,
                     capacity: float | None = None) -> TilingModel:
        """The stage-1 MILP's data for one problem (default: the cpu-c model over L1/L2)."""
        from trex.kernels.tiling import cpu_model

        return cpu_model(spec, shape, dtype, self.param_space(spec, shape), facts,
                         capacity if capacity is not None else self.tile_capacity(facts))

    def tile_capacity(self, facts: DeviceFacts) -> float:
        """Bytes one tile's working set may occupy (default: the private L2)."""
        return float(facts.caches.get("L2", 1 << 20))

    def synchronize(self) -> None:
        """Wait for queued device work (no-op for synchronous backends)."""
        return None

    def device(self) -> str:
        """torch device string for this backend's tensors."""
        return "cpu"

    def validate(self, spec: KernelSpec, params: Mapping[str, int], shape: Mapping[str, int]) -> None:
        """Raise ValueError naming the parameter when ``params`` is outside the space."""
        space = self.param_space(spec, shape)
        for k, v in params.items():
            if k not in space:
                raise ValueError(f"params.{k}: not a parameter of {spec.name} on {self.name} (known: {sorted(space)})")
            if v not in space[k]:
                raise ValueError(f"params.{k}={v}: allowed values for {spec.name} are {list(space[k])}")
        missing = set(space) - set(params)
        if missing:
            raise ValueError(f"params lacks {sorted(missing)} for {spec.name}")
