"""Backend interface: render a kernel's source for given parameters, compile it, run it, report device facts.

A backend owns a parameter space per kernel (name -> allowed values). Every parameter belongs to a
search *direction* (tile, vectorise, unroll, multi-row, loop-order, fusion, accumulation, threads),
which is what skills and the search talk about (that vocabulary and DeviceFacts live in trex.kernels.facts).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from trex.kernels.facts import DIRECTION_OF, DIRECTIONS, DeviceFacts, Params, ParamSpace, source_hash
from trex.kernels.roofline import predict as roofline_predict
from trex.kernels.suite.base import KernelSpec, torch_dtype
from trex.kernels.tiling import cpu_model

if TYPE_CHECKING:
    import torch

    from trex.kernels.tiling import TilingModel

__all__ = [
    "DIRECTIONS", "DIRECTION_OF", "Backend", "BackendUnavailable", "Compiled", "DeviceFacts", "ParamSpace", "Params",
    "alloc_outputs", "source_hash",
]


class BackendUnavailable(RuntimeError):
    """The backend's toolchain or device is missing on this machine (raised at compile/run time)."""


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
        return roofline_predict(spec, shape, dtype, params, facts)

    def tiling_model(self, spec: KernelSpec, shape: Mapping[str, int], dtype: str, facts: DeviceFacts,
                     capacity: float | None = None) -> TilingModel:
        """The stage-1 MILP's data for one problem (default: the cpu-c model over L1/L2)."""
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
