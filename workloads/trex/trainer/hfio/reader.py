"""A safetensors folder read by boxes: the header says where each tensor's bytes lie, so a box
``[start, stop)`` per dim is read with one ``pread`` per contiguous run, never the whole file.

Plain reads (not the mmap that ``safe_open`` uses) keep the bytes read exact (:attr:`SafetensorsFolder.bytes_read`)
and a rank's resident memory to the boxes it asked for.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

INDEX_FILE = "model.safetensors.index.json"

_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
           "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
           "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu"}


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes lie: its file, absolute byte offset, shape and safetensors dtype name."""

    path: Path
    offset: int
    shape: tuple[int, ...]
    dtype: str


class SafetensorsFolder:
    """The tensors of a checkpoint folder (``model.safetensors.index.json`` + shards, or every ``*.safetensors``),
    from the files' headers only; :meth:`read` returns a box of one of them."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        root = Path(directory)
        if (root / INDEX_FILE).exists():
            index = json.loads((root / INDEX_FILE).read_text())
            files = [root / f for f in sorted(set(index["weight_map"].values()))]
        else:
            files = sorted(root.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no safetensors files in {root}")
        self.tensors: dict[str, StoredTensor] = {}
        for f in files:
            self.tensors.update(_header(f))
        self.bytes_read = 0
        self._fds: dict[Path, int] = {}

    def close(self) -> None:
        """Close the files opened by reads."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> SafetensorsFolder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def read(self, name: str, slices: tuple[slice, ...]) -> torch.Tensor:
        """The box ``slices`` (one ``slice(start, stop)`` per dim, step 1) of tensor ``name``, in its stored dtype."""
        import torch

        st = self.tensors[name]
        dt = getattr(torch, _DTYPES[st.dtype])
        if len(slices) != len(st.shape):
            raise ValueError(f"{name}: {len(slices)} slices for a {len(st.shape)}-d tensor")
        box = [(s.start or 0, n if s.stop is None else min(s.stop, n)) for s, n in zip(slices, st.shape, strict=True)]
        sizes = [max(b - a, 0) for a, b in box]
        esize = torch.empty((), dtype=dt).element_size()
        out = bytearray(math.prod(sizes) * esize)
        if out:
            fd = self._fds.get(st.path)
            if fd is None:
                fd = self._fds[st.path] = os.open(st.path, os.O_RDONLY)
            view = memoryview(out)
            for j, (start, run) in enumerate(_runs(box, st.shape, esize)):
                got = os.preadv(fd, [view[j * run:(j + 1) * run]], st.offset + start)
                if got != run:
                    raise OSError(f"{st.path.name}: short read of {name} ({got} of {run} bytes): the file is truncated")
            self.bytes_read += len(out)
        return torch.frombuffer(out, dtype=torch.uint8).view(dt).reshape(sizes) if out else torch.empty(sizes, dtype=dt)


def _runs(box: list[tuple[int, int]], shape: tuple[int, ...], esize: int) -> list[tuple[int, int]]:
    """(byte offset, bytes) of the contiguous runs of a non-empty box, in row-major order: the innermost dims the
    box covers whole, plus one partial dim, are one run."""
    if not box:
        return [(0, esize)]
    k = len(box) - 1
    while k > 0 and box[k] == (0, shape[k]):
        k -= 1
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    run = math.prod(b - a for a, b in box[k:]) * esize
    starts = [box[k][0] * strides[k]]
    for d in reversed(range(k)):
        starts = [i * strides[d] + s for i in range(box[d][0], box[d][1]) for s in starts]
    return [(s * esize, run) for s in starts]


def _header(path: Path) -> dict[str, StoredTensor]:
    """The tensors one safetensors file's header lists."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path.name}: not a safetensors file (shorter than its header length)")
        (n,) = struct.unpack("<Q", raw)
        header = json.loads(fh.read(n))
    base = 8 + n
    out: dict[str, StoredTensor] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in _DTYPES:
            raise ValueError(f"{path.name}: tensor {name} has the unsupported dtype {meta['dtype']}")
        out[name] = StoredTensor(path, base + int(meta["data_offsets"][0]), tuple(int(s) for s in meta["shape"]),
                                 meta["dtype"])
    return out
