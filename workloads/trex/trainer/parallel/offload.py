"""Activation offload (trainer.activationOffload): under full recompute every transformer block keeps only its
input for the backward; this moves those inputs to host memory after they are saved and streams them back for
the backward, applied from outside the model as recompute is.

Non-reentrant checkpointing saves a block's inputs before its own saved-tensor hooks take over, so hooks
installed around the checkpointed call see exactly those inputs; the block's hidden-state input is packed into
a host buffer (the shared token ids and the attention context stay where they are) and unpacked into a fresh
device tensor when the backward recomputes the block. Host copies are exact, so training is bit-identical.

On accelerators the host buffers are pinned and every copy runs on a side stream of the device's stream module
(``torch.get_device_module(kind)``, as the swap optimizer gets it): the device-to-host copy starts as soon as
the input is saved (it overlaps the block's forward; the input's memory is held for the side stream with
``record_stream`` until the copy is done), and when the backward unpacks a block it also starts the
host-to-device copy of the block saved just before it, whose backward is next; the compute stream waits for a
copy's event only when it needs the tensor. On a CPU the same path runs with plain host tensors and no streams
(the copy is synchronous); the streams, pinned buffers and their overlap have not been run here (no
accelerator).
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trex.trainer.model.model import DeepSeekModel, blocks

_Key = tuple[torch.Size, torch.dtype]


class _Saved:
    """One block input in host memory: its host buffer, the device tensor once fetched (with the event of its
    copy on accelerators) and the input saved just before it (its backward comes next)."""

    __slots__ = ("__weakref__", "device", "event", "fetched", "host", "prev")

    def __init__(self, host: torch.Tensor, device: torch.device, prev: weakref.ref[_Saved] | None) -> None:
        self.host = host
        self.device = device
        self.fetched: torch.Tensor | None = None
        self.event: Any = None
        self.prev = prev


class BlockInputOffload:
    """Offloads the inputs of the checkpointed blocks it wraps (see the module docstring); ``live`` counts the
    host copies held now (one per block whose backward has not run yet)."""

    def __init__(self) -> None:
        self.live = 0
        self._pool: dict[_Key, list[torch.Tensor]] = defaultdict(list)
        """Host buffers free for reuse (returned when autograd frees the input's saved entry)."""
        self._streams: dict[torch.device, Any] = {}
        self._last: weakref.ref[_Saved] | None = None

    def hooks(self, x: torch.Tensor) -> torch.autograd.graph.saved_tensors_hooks:
        """Saved-tensor hooks that move ``x`` (and nothing else) to host memory when autograd saves it. Only a
        plain tensor moves (the hidden states of every layout the trainer runs are); a tensor subclass such as a
        DTensor stays on the device."""
        def pack(t: torch.Tensor) -> Any:
            return self._offload(t) if t is x and type(t) is torch.Tensor else t

        def unpack(s: Any) -> torch.Tensor:
            return self._fetch(s) if isinstance(s, _Saved) else s

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def _side(self, device: torch.device) -> tuple[Any, Any]:
        """The device's stream module and the side stream the copies run on (None, None on a CPU)."""
        if device.type == "cpu":
            return None, None
        mod = torch.get_device_module(device.type)
        if device not in self._streams:
            self._streams[device] = mod.Stream(device=device)
        return mod, self._streams[device]

    def _offload(self, t: torch.Tensor) -> _Saved:
        """Copy ``t`` into a host buffer (on the side stream, non-blocking, on accelerators)."""
        mod, side = self._side(t.device)
        key = (t.shape, t.dtype)
        free = self._pool[key]
        host = free.pop() if free else torch.empty(t.shape, dtype=t.dtype, pin_memory=side is not None)
        with torch.no_grad():
            if side is None:
                host.copy_(t)
            else:
                side.wait_stream(mod.current_stream(t.device))
                with mod.stream(side):
                    host.copy_(t, non_blocking=True)
                t.record_stream(side)  # the input's memory stays reserved until the copy has read it
        saved = _Saved(host, t.device, self._last)
        self._last = weakref.ref(saved)
        self.live += 1
        weakref.finalize(saved, self._release, key, host)
        return saved

    def _release(self, key: _Key, host: torch.Tensor) -> None:
        """Autograd freed an entry: its host buffer is free (later copies into it queue behind earlier ones on the
        same side stream)."""
        self.live -= 1
        self._pool[key].append(host)

    def _start_fetch(self, saved: _Saved) -> None:
        """Start the host-to-device copy of ``saved`` (on the side stream, recording its event, on accelerators)."""
        mod, side = self._side(saved.device)
        out = torch.empty(saved.host.shape, dtype=saved.host.dtype, device=saved.device)
        with torch.no_grad():
            if side is None:
                out.copy_(saved.host)
            else:
                side.wait_stream(mod.current_stream(saved.device))  # ``out``'s memory is free on the compute stream
                with mod.stream(side):
                    out.copy_(saved.host, non_blocking=True)
                    saved.event = mod.Event()
                    saved.event.record(side)
                out.record_stream(side)
        saved.fetched = out

    def _fetch(self, saved: _Saved) -> torch.Tensor:
        """The device tensor of ``saved`` (waiting for its copy), after starting the prefetch of the one before."""
        if saved.fetched is None:
            self._start_fetch(saved)
        out, event = saved.fetched, saved.event
        assert out is not None
        saved.fetched, saved.event = None, None  # autograd holds it from here; a second unpack copies again
        if event is not None:
            mod, _ = self._side(saved.device)
            mod.current_stream(saved.device).wait_event(event)
        prev = saved.prev() if saved.prev is not None else None
        if prev is not None and prev.fetched is None:
            self._start_fetch(prev)
        return out


def offloaded(module: nn.Module, offload: BlockInputOffload) -> None:
    """Run ``module``'s (checkpointed) forward with its first argument offloaded by ``offload`` from now on."""
    inner: Callable[..., Any] = module.forward

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        with offload.hooks(x):
            return inner(x, *args, **kwargs)

    module.forward = forward


def apply_activation_offload(model: DeepSeekModel, recompute: str) -> BlockInputOffload:
    """Offload the input of every transformer block (trunk and MTP) of ``model``, whose blocks trainer.recompute
    ``full`` has wrapped (only then is a block's input all it keeps; apply after recompute)."""
    if recompute != "full":
        raise ValueError(f"trainer.activationOffload needs trainer.recompute full (got {recompute!r}): it offloads "
                         "the block inputs that full recompute keeps")
    offload = BlockInputOffload()
    for block in blocks(model):
        offloaded(block, offload)
    return offload
