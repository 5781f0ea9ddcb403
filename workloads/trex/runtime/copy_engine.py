"""Asynchronous host<->device copies behind one interface, so overlap logic (swap optimizer) is testable on CPU.

``ThreadCopyEngine`` runs copies on a worker thread (real overlap with compute on CPU);
``StreamCopyEngine`` issues non-blocking copies on side streams of the device module (cuda, npu; one
stream per direction, like a full-duplex host link) and records timing events per transfer;
``LatencyCopyEngine`` simulates a host link of a given bandwidth on CPU (one lane per direction, optional
random per-copy delays that reorder completions, so a missing dependency shows up as a wrong result).
A copy may name handles it must start after (``after``): the engine orders it behind them without
blocking the caller.
"""

from __future__ import annotations

import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class CopyHandle:
    """A pending copy; ``wait`` blocks until the destination holds the data, ``seconds`` is how long it took."""

    def __init__(self, future: Future[float] | None = None, events: tuple[Any, Any] | None = None,
                 keep: tuple[Any, ...] = ()) -> None:
        self._future = future
        self._events = events
        self._keep = keep  # tensors the copy reads or writes, alive until it is waited on

    def wait(self) -> None:
        """Block until the copy has finished (and re-raise an error the copy hit)."""
        if self._future is not None:
            self._future.result()
        if self._events is not None:
            self._events[1].synchronize()
        self._keep = ()

    def done(self) -> bool:
        """True when the copy has finished."""
        if self._future is not None:
            return self._future.done()
        if self._events is not None:
            return bool(self._events[1].query())
        return True

    def leaves(self) -> list[CopyHandle]:
        """The single copies this handle stands for (itself, or each copy of a ``copy_many``)."""
        return [self]

    def seconds(self) -> float:
        """Duration of the copy itself (waits for it): worker time on threads, event time on streams."""
        self.wait()
        if self._future is not None:
            return float(self._future.result())
        if self._events is not None and self._events[0] is not self._events[1]:
            return float(self._events[0].elapsed_time(self._events[1])) / 1e3
        return 0.0  # an engine without timing events


class CopyEngine(ABC):
    """Starts copies of ``src`` into ``dst`` (same shape) and returns handles to wait on."""

    @abstractmethod
    def copy(self, dst: torch.Tensor, src: torch.Tensor, *, after: Sequence[CopyHandle] = (),
             to_host: bool = False) -> CopyHandle:
        """Start copying ``src`` into ``dst`` once every handle in ``after`` has finished; return a handle.
        ``to_host``: the device-to-host direction (engines with a lane per direction use it)."""

    def copy_many(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], *, after: Sequence[CopyHandle] = (),
                  to_host: bool = False) -> CopyHandle:
        """Start copying each (dst, src) pair as one transfer; return one handle for all."""
        handles = [self.copy(d, s, after=after, to_host=to_host) for d, s in pairs]
        return _AllHandle(handles)

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for every copy started so far."""

    def close(self) -> None:
        """Release resources (threads, streams)."""
        self.synchronize()


class _AllHandle(CopyHandle):
    def __init__(self, handles: list[CopyHandle]) -> None:
        super().__init__()
        self._handles = handles

    def wait(self) -> None:
        for h in self._handles:
            h.wait()

    def done(self) -> bool:
        return all(h.done() for h in self._handles)

    def leaves(self) -> list[CopyHandle]:
        return [leaf for h in self._handles for leaf in h.leaves()]

    def seconds(self) -> float:
        return sum(h.seconds() for h in self._handles)


def _check_shapes(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"copy shape mismatch: dst {tuple(dst.shape)} vs src {tuple(src.shape)}")


class ThreadCopyEngine(CopyEngine):
    """CPU implementation: copies run on worker threads (torch releases the GIL while copying), in order
    within a lane; ``lanes`` 2 gives each direction its own worker."""

    def __init__(self, lanes: int = 1) -> None:
        if lanes not in (1, 2):
            raise ValueError(f"lanes must be 1 or 2, got {lanes}")
        self._pools = [ThreadPoolExecutor(max_workers=1, thread_name_prefix="trex-copy") for _ in range(lanes)]
        self._pending: list[Future[float]] = []
        self._lock = threading.Lock()

    def _delay(self, nbytes: int) -> float:
        """Seconds a copy of ``nbytes`` waits on its lane before moving the data (none here)."""
        return 0.0

    def copy(self, dst: torch.Tensor, src: torch.Tensor, *, after: Sequence[CopyHandle] = (),
             to_host: bool = False) -> CopyHandle:
        _check_shapes(dst, src)
        deps = list(after)
        delay = self._delay(src.numel() * src.element_size())

        def run() -> float:
            for h in deps:  # submitted earlier, so already running or done: no deadlock
                h.wait()
            t0 = time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            dst.copy_(src)
            return time.perf_counter() - t0

        pool = self._pools[1 if to_host and len(self._pools) > 1 else 0]
        fut = pool.submit(run)
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()] + [fut]
        return CopyHandle(future=fut)

    def synchronize(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        self.synchronize()
        for pool in self._pools:
            pool.shutdown(wait=True)


class LatencyCopyEngine(ThreadCopyEngine):
    """A simulated host link on CPU: each copy takes bytes / ``gbps`` (GB/s, 1e9 bytes) on its direction's
    lane (full duplex, like PCIe or HCCS) plus a random delay of up to ``jitter`` seconds; with jitter the two
    lanes finish copies in an order that only the ``after`` dependencies constrain."""

    def __init__(self, gbps: float, jitter: float = 0.0, seed: int = 0) -> None:
        if gbps <= 0 or jitter < 0:
            raise ValueError(f"LatencyCopyEngine needs gbps > 0 and jitter >= 0, got {gbps}, {jitter}")
        super().__init__(lanes=2)
        self.gbps = gbps
        self.jitter = jitter
        self._rng = random.Random(seed)

    def _delay(self, nbytes: int) -> float:
        return nbytes / (self.gbps * 1e9) + (self._rng.uniform(0, self.jitter) if self.jitter else 0.0)


class StreamCopyEngine(CopyEngine):
    """Accelerator implementation: non-blocking copies on two side streams (host-to-device, device-to-host),
    a pair of timing events per copy; ``after`` becomes a stream wait on the handles' end events."""

    def __init__(self, kind: str) -> None:
        import torch

        self._mod = torch.get_device_module(kind)
        self._streams = (self._mod.Stream(), self._mod.Stream())
        self._timing = kind != "cpu"  # torch.cpu.Event has no timing

    def copy(self, dst: torch.Tensor, src: torch.Tensor, *, after: Sequence[CopyHandle] = (),
             to_host: bool = False) -> CopyHandle:
        _check_shapes(dst, src)
        stream = self._streams[1 if to_host else 0]
        # The side stream must see every write the compute stream made to src before copying it.
        stream.wait_stream(self._mod.current_stream())
        for h in (leaf for dep in after for leaf in dep.leaves()):
            if h._events is not None:  # ordered on the device, the caller does not block
                stream.wait_event(h._events[1])
            else:
                h.wait()
        with self._mod.stream(stream):
            start = self._mod.Event(enable_timing=True) if self._timing else self._mod.Event()
            end = self._mod.Event(enable_timing=True) if self._timing else self._mod.Event()
            start.record(stream)
            dst.copy_(src, non_blocking=True)
            end.record(stream)
        for t in (dst, src):  # the caching allocator must not hand these out before the side stream is done
            if t.device.type != "cpu":
                t.record_stream(stream)
        return CopyHandle(events=(start, end) if self._timing else (end, end), keep=(dst, src))

    def synchronize(self) -> None:
        for stream in self._streams:
            sync = getattr(stream, "synchronize", None)
            if sync is not None:
                sync()
            else:  # torch.cpu.Stream has no per-stream synchronize
                self._mod.synchronize()


def make_copy_engine(kind: str) -> CopyEngine:
    """The copy engine for a device kind: threads on CPU (one lane per direction), side streams on cuda/npu."""
    return ThreadCopyEngine(lanes=2) if kind == "cpu" else StreamCopyEngine(kind)
