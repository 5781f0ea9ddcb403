"""Double-buffered swap optimizer: Muon and AdamW states live in host memory and stream through a few
device bucket buffers during the optimizer step.

The states of every parameter are split into buckets of whole parameters (whole matrices and expert
stacks, so Newton-Schulz sees complete matrices; with FSDP2 each rank moves only its local shards). Muon's
buckets are made of whole Newton-Schulz batches (``trex.trainer.optim.muon.ns_batches``), so each matrix
is orthogonalised in the same batched call as without swap, whatever the bucket size. A
step walks the buckets in order with up to ``buffers`` of them on the device: while bucket i is updated,
bucket i + 1 (up to i + buffers - 1) is copied in and bucket i - 1 is written back, through a
:mod:`trex.runtime.copy_engine` engine. A copy-in into a buffer starts after the write-back of that
buffer's previous bucket; the update of a bucket waits for its copy-in. The first copy-ins of a step start
at the first gradient of the backward before it (``prefetch``: the states do not depend on the gradients),
so the step does not begin by waiting for its first bucket. The last write-backs of a step
run on behind the next forward and backward: the next step, ``all()`` and ``state_dict()`` (what
checkpoints read) first wait for them, so nothing reads a state before its write-back has landed. The
buffers are freed once their last write-back is done, before the next step.

The wrapper steps the existing optimizers on one bucket at a time (their param groups narrowed to the
bucket), so the arithmetic is theirs and swap on is bit-identical to swap off; between steps each state
tensor's storage is its host copy, so ``state_dict`` and DCP checkpoints see ordinary, current tensors.

A bf16 model sharded by FSDP2 has fp32 master shards (:mod:`trex.trainer.optim.masters`): they live in host
memory too and travel in their parameter's bucket like a state; after a bucket's update the bf16 copy FSDP2
gathers from is refreshed on the device, so the forward never reads a master. Between steps the device then
keeps, of the parameters and the optimizer, only the bf16 copies of the master shards and the fp32 gradient
shards; during a step also the bucket buffers. Whatever reads a parameter between steps reads its host
master, so a step with masters returns once its write-backs have landed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trex.runtime.copy_engine import CopyEngine, CopyHandle, make_copy_engine
from trex.trainer.config import SwapConfig
from trex.trainer.model.layers import local_tensor
from trex.trainer.optim.build import Optimizers
from trex.trainer.optim.masters import MasterShard, hold_masters, stored_on_device
from trex.trainer.optim.muon import ns_batches

_ALIGN = 64
"""Byte alignment of each state tensor inside a bucket buffer."""


@dataclass
class SwapStats:
    """One step's transfers: how long the copies took, how much of that the step waited for, and the bytes."""

    copy_seconds: float = 0.0
    """Duration of every copy-in and write-back of the step, summed."""
    exposed_seconds: float = 0.0
    """Time the step waited on copies (transfer time not hidden behind the updates)."""
    host_bytes: int = 0
    """Optimizer-state and fp32 master bytes held in host memory."""
    buffer_bytes: int = 0
    """Device bytes of the bucket buffers while the step runs (freed after it)."""
    compute_bytes: int = 0
    """Device bytes of the bf16 copies of the masters (what FSDP2 gathers from)."""
    buckets: int = 0
    """Buckets the states were moved in."""

    @property
    def overlap_ratio(self) -> float:
        """Hidden copy time / total copy time (1 when nothing was copied)."""
        if self.copy_seconds <= 0:
            return 1.0
        return min(1.0, max(0.0, 1.0 - self.exposed_seconds / self.copy_seconds))

    @property
    def bytes_saved(self) -> int:
        """Device bytes the states and masters would take minus the buffers and bf16 copies standing in for them."""
        return max(0, self.host_bytes - self.buffer_bytes - self.compute_bytes)


@dataclass(frozen=True)
class Bucket:
    """Whole parameters of one optimizer (for Muon, whole Newton-Schulz batches)."""

    optimizer: str
    """"muon" or "adamw"."""
    params: tuple[torch.Tensor, ...]


def plan_buckets(sizes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Indices of consecutive items grouped greedily up to ``bucket_bytes`` (an item larger than that is a
    bucket of its own). Pure, from global sizes, so every rank forms the same buckets."""
    out: list[list[int]] = []
    used = 0
    for i, n in enumerate(sizes):
        if out and used + n <= bucket_bytes:
            out[-1].append(i)
            used += n
        else:
            out.append([i])
            used = n
    return out


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass
class _Slot:
    """One device bucket buffer and the write-back of the bucket that used it last."""

    buffer: torch.Tensor | None = None
    released: CopyHandle | None = None


@dataclass
class _Entry:
    """One state tensor of a bucket: the tensor the optimizer holds (rank-local) and its host copy."""

    state: torch.Tensor
    host: torch.Tensor


@dataclass
class _Flight:
    """A bucket on the device: its entries, their device views and the copy-in filling them."""

    entries: list[_Entry] = field(default_factory=list)
    views: list[torch.Tensor] = field(default_factory=list)
    copy_in: CopyHandle | None = None


@dataclass
class _Pass:
    """One walk over the buckets: their entries, the slots, the buckets in flight and every copy started."""

    entries: list[list[_Entry]]
    slot_bytes: int
    slots: list[_Slot]
    device: torch.device
    after: list[CopyHandle]
    """What the first copy-ins wait for (the last step's outstanding write-backs, when started early)."""
    flights: dict[int, _Flight] = field(default_factory=dict)
    handles: list[CopyHandle] = field(default_factory=list)
    buffer_bytes: int = 0


class SwapOptimizers(Optimizers):
    """:class:`Optimizers` whose states live in host memory and are streamed per bucket in ``step``."""

    def __init__(self, inner: Optimizers, *, buffers: int, bucket_bytes: int, engine: CopyEngine,
                 device_kind: str, prefetch: bool = True, masters: Sequence[MasterShard] = ()) -> None:
        super().__init__(inner.muon, inner.adamw)
        if buffers < 2:
            raise ValueError(f"optimizer.swap.buffers must be >= 2, got {buffers}")
        self.buffers = buffers
        self.bucket_bytes = bucket_bytes
        self.engine = engine
        self.device_kind = device_kind
        self.pin = device_kind != "cpu"
        self.masters = {id(m.param): m for m in masters}
        """The fp32 master shards in host memory, by parameter (none unless FSDP2 shards a bf16 model)."""
        self.buckets = self._plan()
        self.last: SwapStats | None = None
        """The last step's transfers."""
        self._host: dict[tuple[int, str], torch.Tensor] = {}
        self._pending: list[CopyHandle] = []
        """Write-backs of the last step that had not landed when it returned."""
        self.prefetching = prefetch
        """Start each step's first copy-ins at the first gradient of the backward (see ``prefetch``)."""
        self._armed = prefetch
        self._stream = torch.get_device_module(device_kind).current_stream() if self.pin else None
        """The stream the steps run on (accelerators)."""
        self._next: _Pass | None = None
        """The next step's pass, its first copy-ins already started by ``prefetch``."""
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad)  # type: ignore[no-untyped-call]
                       for b in self.buckets for p in b.params] if prefetch else []

    def _plan(self) -> list[Bucket]:
        """AdamW: consecutive whole parameters up to the bucket size. Muon: consecutive whole Newton-Schulz
        batches (``ns_batches`` per param group), so a bucket's step batches exactly as the step over all
        parameters does and gives the same bits for any bucket size. A master counts once more."""
        out: list[Bucket] = []
        for name, opt, factor in (("muon", self.muon, 1), ("adamw", self.adamw, 2)):
            if opt is None:
                continue
            atoms: list[list[torch.Tensor]] = []
            for g in opt.param_groups:
                params = list(g["params"])  # global shapes: equal on every rank
                atoms += ([[params[i] for i in b] for b in ns_batches([p.shape for p in params])] if name == "muon"
                          else [[p] for p in params])
            sizes = [sum(p.numel() * p.element_size() * (factor + (id(p) in self.masters)) for p in a) for a in atoms]
            out.extend(Bucket(name, tuple(p for i in idx for p in atoms[i]))
                       for idx in plan_buckets(sizes, self.bucket_bytes))
        return out

    # --- host copies ------------------------------------------------------------------------------
    def _entries(self, bucket: Bucket) -> list[_Entry]:
        """The bucket's masters and state tensors (those shaped like their parameter's local part) with host
        copies. A state that is not stored in its host copy (created by the optimizer's first step, or
        replaced by a checkpoint load) gets one: pinned on accelerators, filled from the state."""
        opt = self.muon if bucket.optimizer == "muon" else self.adamw
        assert opt is not None
        out: list[_Entry] = []
        for p in bucket.params:
            master = self.masters.get(id(p))
            if master is not None:
                out.append(_Entry(master.local, master.host_view))
            shape = local_tensor(p).shape
            for key, value in opt.state.get(p, {}).items():
                if not isinstance(value, torch.Tensor):
                    continue
                state = local_tensor(value)
                if state.shape != shape:  # scalars (AdamW's step) stay where they are
                    continue
                host = self._host.get((id(p), key))
                if host is None or host.shape != state.shape or host.dtype != state.dtype:
                    host = torch.empty(state.shape, dtype=state.dtype, pin_memory=self.pin)
                    self._host[(id(p), key)] = host
                out.append(_Entry(state, host))
        return out

    def offload(self) -> None:
        """Move every state that is not stored in its host copy there now (after a checkpoint load)."""
        with torch.no_grad():
            moved = False
            for bucket in self.buckets:
                for e in self._entries(bucket):
                    if e.state.data_ptr() != e.host.data_ptr():
                        e.host.copy_(e.state)
                        e.state.data = e.host
                        moved = True
            if moved:  # copy-ins started from the old states: start again
                self._drop_next()

    @property
    def last_stats(self) -> SwapStats | None:
        """The last step's transfers."""
        return self.last

    def restored(self) -> None:
        """After a checkpoint load: states and masters into their host copies, and the bf16 copies FSDP2
        gathers from cast from the loaded masters."""
        self.offload()
        with torch.no_grad():
            for m in self.masters.values():
                m.refresh()

    def _drop_next(self) -> None:
        """Forget the prefetched pass once its copies have landed."""
        if self._next is not None:
            for h in self._next.handles:
                h.wait()
            self._next = None

    def host_bytes(self) -> int:
        """Bytes of optimizer state and fp32 masters held in host memory."""
        states = sum(t.numel() * t.element_size() for t in self._host.values())
        return states + sum(m.nbytes()[0] for m in self.masters.values())

    def compute_bytes(self) -> int:
        """Device bytes of the bf16 copies of the masters."""
        return sum(m.nbytes()[1] for m in self.masters.values())

    def settle(self) -> tuple[float, float]:
        """Wait for the last step's outstanding write-backs: (seconds waited, their copy seconds)."""
        t0 = time.perf_counter()
        for h in self._pending:
            h.wait()
        waited = time.perf_counter() - t0
        copied = sum(h.seconds() for h in self._pending)
        self._pending = []
        return waited, copied

    def close(self) -> None:
        """Wait for every copy and remove the gradient hooks (the parameters outlive this wrapper). Masters stay
        in host memory, so the model keeps training only through this wrapper's steps (which refresh the bf16
        copies FSDP2 gathers)."""
        self.settle()
        self._drop_next()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    @contextlib.contextmanager
    def masters_on_device(self) -> Iterator[None]:
        """The master shards stored on the device for the duration, once every write-back has landed (see
        :func:`stored_on_device`)."""
        self.settle()
        with stored_on_device(self.masters.values()):
            yield

    def all(self) -> list[torch.optim.Optimizer]:
        """Both optimizers, their states current in host memory (outstanding write-backs waited for)."""
        self.settle()
        return super().all()

    def state_dict(self) -> dict[str, Any]:
        """Both optimizer states, once every write-back has landed."""
        self.settle()
        return super().state_dict()

    # --- the step ---------------------------------------------------------------------------------
    def _on_grad(self, _param: torch.Tensor) -> None:
        """Post-accumulate-grad hook: the first gradient of a backward starts the step's first copy-ins."""
        if self._armed:
            self._armed = False
            self.prefetch()

    def prefetch(self) -> None:
        """Start the copy-ins of the first ``buffers - 1`` buckets now (the states do not depend on the
        gradients), so the next ``step`` finds them on the device. Each copy-in is ordered behind the last
        step's outstanding write-backs; a second call before ``step`` does nothing."""
        if self._next is not None:
            return
        # FSDP2 runs these hooks on its reduce stream: allocate and order on the stream the step runs on
        on = torch.get_device_module(self.device_kind).stream(self._stream) if self._stream is not None else None
        with torch.no_grad(), on or contextlib.nullcontext():
            self.offload()
            self._next = self._begin(after=list(self._pending))

    def step(self) -> None:
        """Update every bucket, streaming its states through the device buffers. The wait for the previous
        step's last write-backs counts as this step's exposed time."""
        with torch.no_grad():
            waited, copied = self.settle()
            self.offload()
            stats = self._step()
            stats.exposed_seconds += waited
            stats.copy_seconds += copied
            if self.masters:  # whatever reads a parameter between steps reads its host master: let it land
                waited, copied = self.settle()
                stats.exposed_seconds += waited
                stats.copy_seconds += copied
            self.last = stats
        self._armed = self.prefetching

    def _begin(self, after: list[CopyHandle]) -> _Pass:
        """A pass over the buckets with the copy-ins of the first ``buffers - 1`` started."""
        entries = [self._entries(b) for b in self.buckets]
        slot_bytes = max((sum(_aligned(e.host.numel() * e.host.element_size()) for e in es) for es in entries),
                         default=0)
        run = _Pass(entries, slot_bytes, [_Slot() for _ in range(self.buffers)], self._device(), after)
        for j in range(min(self.buffers - 1, len(self.buckets))):
            self._copy_in(run, j)
        return run

    def _copy_in(self, run: _Pass, j: int) -> None:
        """Start copying bucket j's states into its slot's buffer, after that slot's previous write-back."""
        flight = run.flights[j] = _Flight(run.entries[j])
        if not flight.entries:
            return
        slot = run.slots[j % self.buffers]
        if slot.buffer is None:
            slot.buffer = torch.empty(run.slot_bytes, dtype=torch.uint8, device=run.device)
            run.buffer_bytes += run.slot_bytes
        offset = 0
        for e in flight.entries:
            n = e.host.numel() * e.host.element_size()
            flight.views.append(slot.buffer[offset:offset + n].view(e.host.dtype).view(e.host.shape))
            offset += _aligned(n)
        after = [slot.released] if slot.released is not None else run.after
        flight.copy_in = self.engine.copy_many([(v, e.host) for v, e in zip(flight.views, flight.entries,
                                                                            strict=True)], after=after)
        run.handles.append(flight.copy_in)

    def _step(self) -> SwapStats:
        run, self._next = self._next, None
        if run is None:
            run = self._begin(after=[])
        stats = SwapStats(buckets=len(self.buckets))
        for i, bucket in enumerate(self.buckets):
            if i + self.buffers - 1 < len(self.buckets):
                self._copy_in(run, i + self.buffers - 1)
            flight = run.flights.pop(i)
            if flight.copy_in is not None:
                self._sync_compute()
                t0 = time.perf_counter()
                self._await_copy_in(flight.copy_in)
                stats.exposed_seconds += time.perf_counter() - t0
            for e, v in zip(flight.entries, flight.views, strict=True):
                e.state.data = v
            self._step_bucket(bucket)
            for p in bucket.params:
                if id(p) in self.masters:
                    self.masters[id(p)].refresh()  # on the device, queued before the write-back
            written = self._entries(bucket)  # includes states the first step just created
            back = self.engine.copy_many([(e.host, e.state.data) for e in written], to_host=True)
            for e in written:
                e.state.data = e.host
            run.slots[i % self.buffers].released = back
            run.handles.append(back)
        # Copy-ins have all been waited for; write-backs still in flight finish behind the next forward.
        landed = [h.done() for h in run.handles]
        self._pending = [h for h, d in zip(run.handles, landed, strict=True) if not d]
        stats.copy_seconds = sum(h.seconds() for h, d in zip(run.handles, landed, strict=True) if d)
        stats.host_bytes = self.host_bytes()
        stats.buffer_bytes = run.buffer_bytes
        stats.compute_bytes = self.compute_bytes()
        return stats

    def _await_copy_in(self, handle: CopyHandle) -> None:
        """The update of a bucket reads its states only after their copy-in has landed."""
        handle.wait()

    def _sync_compute(self) -> None:
        """Let the device finish the queued updates first, so a wait measures only transfer time."""
        if self.device_kind != "cpu":
            torch.get_device_module(self.device_kind).current_stream().synchronize()

    def _device(self) -> torch.device:
        for b in self.buckets:
            for p in b.params:
                return local_tensor(p).device
        return torch.device("cpu")

    def _step_bucket(self, bucket: Bucket) -> None:
        """Step one optimizer on the bucket's parameters only (its param groups narrowed, then restored)."""
        opt = self.muon if bucket.optimizer == "muon" else self.adamw
        assert opt is not None
        keep = {id(p) for p in bucket.params}
        saved = [g["params"] for g in opt.param_groups]
        try:
            for g in opt.param_groups:
                g["params"] = [p for p in g["params"] if id(p) in keep]
            opt.step()
        finally:
            for g, params in zip(opt.param_groups, saved, strict=True):
                g["params"] = params


def with_swap(opts: Optimizers, cfg: SwapConfig, device_kind: str, engine: CopyEngine | None = None,
              bucket_bytes: int | None = None, model: torch.nn.Module | None = None) -> Optimizers:
    """``opts`` itself when optimizer.swap is off, else a :class:`SwapOptimizers` around it (the device's copy
    engine and bucketMb unless ``engine`` or ``bucket_bytes`` are given) holding ``model``'s fp32 master
    shards in host memory too (those of a bf16 model FSDP2 shards; see :func:`hold_masters`)."""
    if not cfg.enabled:
        return opts
    masters = hold_masters(model, pin=device_kind != "cpu") if model is not None else []
    return SwapOptimizers(opts, buffers=cfg.buffers, bucket_bytes=bucket_bytes or cfg.bucket_mb * 2**20,
                          engine=engine or make_copy_engine(device_kind), device_kind=device_kind, masters=masters)


def summary(steps: Sequence[SwapStats]) -> dict[str, float | int]:
    """The run's transfers for the termination summary: exposed seconds per step (mean), the overlap ratio
    over all steps (hidden / total copy time), device bytes saved and bucket count (last step)."""
    if not steps:
        return {}
    copy = sum(s.copy_seconds for s in steps)
    exposed = sum(s.exposed_seconds for s in steps)
    total = SwapStats(copy_seconds=copy, exposed_seconds=exposed)
    return {"exposedSecondsPerStep": exposed / len(steps), "overlapRatio": total.overlap_ratio,
            "deviceBytesSaved": steps[-1].bytes_saved, "buckets": steps[-1].buckets}
