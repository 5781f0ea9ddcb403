"""Layout-free initial values: each tensor's start is a pure function of (seed, tensor name, element index).

Random tensors draw Normal(0, std) in blocks of whole rows, each block from its own generator seeded by
(seed, name, block), on the host. Any part of a tensor (a shard of any layout, on any device) can so be
produced on its own and equals the same part of the whole tensor: a model initialised on the meta device and
materialised shard by shard starts exactly where a single-process model starts.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

BLOCK_ELEMENTS = 1 << 22
"""Elements per random block (whole rows; at least one row): bounds the host memory one block needs."""


@dataclass(frozen=True)
class Init:
    """How one tensor starts: Normal(0, ``std``), the constant ``value``, or ``full()`` (small tensors only)."""

    std: float | None = None
    value: float | None = None
    full: Callable[[], torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.std, self.value, self.full)) != 1:
            raise ValueError("Init takes exactly one of std, value, full")


def normal(std: float) -> Init:
    """Normal(0, std) from per-block generators."""
    return Init(std=std)


def constant(value: float) -> Init:
    """Every element ``value``."""
    return Init(value=value)


def explicit(full: Callable[[], torch.Tensor]) -> Init:
    """The whole tensor from ``full()`` (computed on the host; for small tensors and fixed tables)."""
    return Init(full=full)


def block_rows(shape: Sequence[int]) -> int:
    """Rows per random block of a tensor of ``shape`` (depends on the shape only, never on a layout)."""
    row = math.prod(shape[1:]) if len(shape) > 1 else 1
    return max(1, BLOCK_ELEMENTS // max(row, 1))


def block_seed(seed: int, name: str, block: int) -> int:
    """The generator seed of one block: a hash of (seed, tensor name, block index)."""
    digest = hashlib.blake2b(f"{seed}/{name}/{block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def values(init: Init, name: str, seed: int, shape: Sequence[int], dtype: torch.dtype,
           index: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
    """The part of tensor ``name``'s initial value selected by ``index`` (per dim, the global indices kept;
    None = all), on the host in ``dtype``."""
    shape = tuple(shape)
    idx = list(index) if index is not None else [None] * len(shape)
    if len(idx) != len(shape):
        raise ValueError(f"{name}: index has {len(idx)} dims, the tensor {len(shape)}")
    local = tuple(len(i) if i is not None else n for i, n in zip(idx, shape, strict=True))
    if init.value is not None:
        return torch.full(local, init.value, dtype=dtype)
    if init.full is not None:
        out = init.full().to(dtype)
        if tuple(out.shape) != shape:
            raise ValueError(f"{name}: initial value has shape {tuple(out.shape)}, the tensor {shape}")
        return _select(out, idx)
    assert init.std is not None
    gen_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    if not shape:
        gen = torch.Generator().manual_seed(block_seed(seed, name, 0))
        return torch.empty((), dtype=gen_dtype).normal_(0.0, init.std, generator=gen).to(dtype)
    rows = block_rows(shape)
    wanted = idx[0] if idx[0] is not None else torch.arange(shape[0])
    if wanted.numel() == 0:
        return torch.empty(local, dtype=dtype)
    rest = [None, *idx[1:]]
    parts = []
    for block in torch.unique(wanted // rows).tolist():
        start = block * rows
        gen = torch.Generator().manual_seed(block_seed(seed, name, block))
        chunk = torch.empty((min(rows, shape[0] - start), *shape[1:]), dtype=gen_dtype)
        chunk.normal_(0.0, init.std, generator=gen)
        in_block = wanted[(wanted >= start) & (wanted < start + rows)]
        parts.append((in_block, _select(chunk, [in_block - start, *rest[1:]])))
    order = torch.cat([p[0] for p in parts])  # the global row of each stacked row (grouped by block)
    stacked = torch.cat([p[1] for p in parts])
    by_row = torch.argsort(order)
    out = stacked[by_row[torch.searchsorted(order[by_row], wanted)]]  # back into the asked-for order
    return out.to(dtype)


def _select(t: torch.Tensor, idx: Sequence[torch.Tensor | None]) -> torch.Tensor:
    for d, i in enumerate(idx):
        if i is not None:
            t = t.index_select(d, i)
    return t


@torch.no_grad()
def fill(t: torch.Tensor, init: Init, name: str, seed: int) -> None:
    """Write the whole initial value of ``name`` into the plain tensor ``t``."""
    t.copy_(values(init, name, seed, t.shape, t.dtype).to(t.device))
