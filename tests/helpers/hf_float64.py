"""Run a transformers model in true float64: its internal casts to fp32 keep float64 tensors float64.

transformers' DeepSeek modules upcast to fp32 at fixed points (RMSNorm, RoPE, softmax, mHC); on a
float64 model those casts would round to fp32 and cap the reference at fp32 accuracy. Inside
``hf_float64()`` a float64 tensor's ``.float()``, ``.to(torch.float32)`` and ``.softmax(dtype=float32)``
(also ``.type`` and ``F.softmax(dtype=float32)``) stay float64; every other tensor behaves as usual.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def hf_float64() -> Iterator[None]:
    tensor = torch.Tensor
    orig_float, orig_to, orig_softmax, orig_type = tensor.float, tensor.to, tensor.softmax, tensor.type
    orig_f_softmax = torch.nn.functional.softmax

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

    def type_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.dtype == torch.float64:
            args = tuple(keep(a) for a in args)
        return orig_type(self, *args, **kwargs)

    def f_softmax(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.dtype == torch.float64 and "dtype" in kwargs:
            kwargs["dtype"] = keep(kwargs["dtype"])
        return orig_f_softmax(x, *args, **kwargs)

    tensor.float, tensor.to, tensor.softmax, tensor.type = float_, to, softmax, type_  # type: ignore[method-assign,assignment]
    torch.nn.functional.softmax = f_softmax
    try:
        yield
    finally:
        tensor.float, tensor.to, tensor.softmax, tensor.type = orig_float, orig_to, orig_softmax, orig_type  # type: ignore[method-assign]
        torch.nn.functional.softmax = orig_f_softmax


def from_pretrained_float64(cls: Any, path: Any) -> Any:
    """``cls.from_pretrained(path)`` in float64, including the modules transformers pins to fp32 (those
    would otherwise be rounded to fp32 on load): they are re-read from the checkpoint unrounded."""
    from safetensors.torch import load_file

    model = cls.from_pretrained(path, dtype=torch.float64).double()
    own = model.state_dict()
    stored = {}
    for f in sorted(path.glob("*.safetensors")):
        stored.update({k: v for k, v in load_file(f).items() if k in own and own[k].shape == v.shape})
    model.load_state_dict(stored, strict=False)
    return model
