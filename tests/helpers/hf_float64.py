"""Run a transformers model in true float64: its internal casts to fp32 keep float64 tensors float64.

transformers' DeepSeek modules upcast to fp32 at fixed points (RMSNorm, RoPE, softmax, mHC); on a
float64 model those casts would round to fp32 and cap the reference at fp32 accuracy. Inside
``hf_float64()`` a float64 tensor's ``.float()``, ``.to(torch.float32)`` and ``.softmax(dtype=float32)``
stay float64; every other tensor behaves as usual.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def hf_float64() -> Iterator[None]:
    tensor = torch.Tensor
    orig_float, orig_to, orig_softmax = tensor.float, tensor.to, tensor.softmax

    def keep(dtype: Any) -> Any:
        return torch.float64 if dtype is torch.float32 else dtype

    def float_(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self if self.dtype == torch.float64 else orig_float(self, *args, **kwargs)

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.dtype == torch.float64:
            args = tuple(keep(a) for a in args)
            if "dtype" in kwargs:
                kwargs["dtype"] = keep(kwargs["dtype"])
        return orig_to(self, *args, **kwargs)

    def softmax(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.dtype == torch.float64 and "dtype" in kwargs:
            kwargs["dtype"] = keep(kwargs["dtype"])
        return orig_softmax(self, *args, **kwargs)

    tensor.float, tensor.to, tensor.softmax = float_, to, softmax  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        tensor.float, tensor.to, tensor.softmax = orig_float, orig_to, orig_softmax  # type: ignore[method-assign]
