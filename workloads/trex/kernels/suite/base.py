"""KernelSpec: one suite kernel's contract (buffers, dims, references, cost) shared by every backend.

Buffers are listed in call order (inputs, then outputs). Each has a role that fixes its element type:
``act`` follows the tuning dtype (fp32 or bf16), ``f32``/``i64`` are fixed. Backends receive the dims in
``dim_names`` order and the scalars in ``scalar_names`` order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Role = Literal["act", "f32", "i64"]
EXP_FLOPS = 10.0
"""FLOPs charged per exp/log evaluation (a vectorised polynomial: range reduction plus ~7 FMAs), so that
transcendental-heavy kernels are not mistaken for memory-bound ones."""
Dims = Mapping[str, int]
Tensors = dict[str, "torch.Tensor"]


@dataclass(frozen=True)
class Buffer:
    """One kernel argument: name, element role and shape as a function of the dims."""

    name: str
    role: Role
    shape: Callable[[Dims], tuple[int, ...]]


@dataclass(frozen=True)
class KernelSpec:
    """Everything a backend, the correctness gate and the cost model need to know about one kernel."""

    name: str
    kclass: str
    """Kernel class for skill matching: norm, elementwise, rotary, routing, gemm, loss, mixing."""
    dim_names: tuple[str, ...]
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    scalars: dict[str, float]
    default_shapes: tuple[dict[str, int], ...]
    """Tuning shapes sized for a 2-core CPU (about 0.2-5 ms per call)."""
    tail_shapes: tuple[dict[str, int], ...]
    """Awkward sizes (odd, not multiples of the vector width) for the correctness gate."""
    dtypes: tuple[str, ...]
    make_inputs: Callable[[Dims, str, int], Tensors]
    eager: Callable[[Tensors, Dims, dict[str, float]], Tensors]
    """Eager PyTorch baseline in the inputs' dtype (what a user would write)."""
    reference: Callable[[Tensors, Dims, dict[str, float]], Tensors]
    """Float64 reference: receives float64 copies of the float inputs."""
    flops: Callable[[Dims], float]
    bytes_moved: Callable[[Dims, int], float]
    """Compulsory DRAM traffic (bytes) for an activation element size (4 fp32, 2 bf16)."""
    tile_dim: str
    """Dimension the backend's BLOCK tile splits (working set per tile scales with it)."""
    tile_bytes: Callable[[Dims, int, int], float]
    """Working-set bytes of one tile of BLOCK elements along tile_dim: (dims, block, elem_bytes)."""
    tol: dict[str, tuple[float, float]] = field(default_factory=lambda: {"fp32": (1e-4, 1e-5), "bf16": (2e-2, 2e-2)})
    """(rtol, atol) per dtype against the float64 reference."""
    compare: Callable[[Tensors, Tensors, Tensors, Dims], str | None] | None = None
    """Custom output check (inputs, outputs, float64 reference, dims) -> error or None."""
    dims_problem: Callable[[Dims], str | None] | None = None
    """Why a shape's dims are outside what the kernel computes (``"k: ..."``), or None; checked at validate time."""

    def dims(self, shape: Mapping[str, int]) -> tuple[int, ...]:
        """Dims in backend order; a missing name is an error naming the field."""
        missing = [d for d in self.dim_names if d not in shape]
        if missing:
            raise ValueError(f"shape for {self.name} lacks dims {missing} (expected {list(self.dim_names)})")
        return tuple(int(shape[d]) for d in self.dim_names)


def torch_dtype(role: Role, dtype: str) -> torch.dtype:
    """Element type of a buffer role for a tuning dtype."""
    import torch

    if role == "i64":
        return torch.int64
    if role == "f32":
        return torch.float32
    return torch.bfloat16 if dtype == "bf16" else torch.float32


def elem_bytes(dtype: str) -> int:
    """Bytes per activation element."""
    return 2 if dtype == "bf16" else 4


def shape_bucket(shape: Mapping[str, int]) -> str:
    """Coarse shape bucket (each dim rounded to a power of two) used by the registry and skills."""
    parts = []
    for k in sorted(shape):
        v = int(shape[k])
        parts.append(f"{k}{1 << max(0, (v - 1).bit_length())}")
    return "-".join(parts)


def shape_key(shape: Mapping[str, int]) -> str:
    """Exact, stable text of a shape."""
    return ",".join(f"{k}={int(shape[k])}" for k in sorted(shape))
