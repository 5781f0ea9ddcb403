"""Asynchronous host<->device copies behind one interface, so overlap logic (swap optimizer) is testable on CPU.

``ThreadCopyEngine`` runs copies on a worker thread (real overlap with compute on CPU);
``StreamCopyEngine`` issues non-blocking copies on a side stream of the device module (cuda, npu)
and records an event per transfer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class CopyHandle:
    """A pending copy; ``wait`` blocks until the destination holds the data."""

    def __init__(self, future: Future[None] | None = None, event: Any = None) -> None:
        self._future = future
        self._event = event

    def wait(self) -> None:
        """Block until the copy has finished (and re-raise an error the copy hit)."""
        if self._future is not None:
            self._future.result()
        if self._event is not None:
            self._event.synchronize()

    def done(self) -> bool:
        """True when the copy has finished."""
        if self._future is not None:
            return self._future.done()
        if self._event is not None:
            return bool(self._event.query())
        return True


class CopyEngine(ABC):
    """Starts copies of ``src`` into ``dst`` (same shape) and returns handles to wait on."""

    @abstractmethod
    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> CopyHandle:
        """Start copying ``src`` into ``dst``; return a handle."""

    def copy_many(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> CopyHandle:
        """Start copying each (dst, src) pair as one transfer; return one handle for all."""
        handles = [self.copy(d, s) for d, s in pairs]
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


class ThreadCopyEngine(CopyEngine):
    """CPU implementation: copies run in order on one worker thread (torch releases the GIL while copying)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trex-copy")
        self._pending: list[Future[None]] = []

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> CopyHandle:
        if dst.shape != src.shape:
            raise ValueError(f"copy shape mismatch: dst {tuple(dst.shape)} vs src {tuple(src.shape)}")

        def run() -> None:
            dst.copy_(src)

        fut = self._pool.submit(run)
        self._pending = [f for f in self._pending if not f.done()] + [fut]
        return CopyHandle(future=fut)

    def synchronize(self) -> None:
        for f in self._pending:
            f.result()
        self._pending = []

    def close(self) -> None:
        self.synchronize()
        self._pool.shutdown(wait=True)


class StreamCopyEngine(CopyEngine):
    """Accelerator implementation: non-blocking copies on a side stream, one event per copy."""

    def __init__(self, kind: str) -> None:
        import torch

        self._mod = torch.get_device_module(kind)
        self._stream = self._mod.Stream()

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> CopyHandle:
        if dst.shape != src.shape:
            raise ValueError(f"copy shape mismatch: dst {tuple(dst.shape)} vs src {tuple(src.shape)}")
        # The side stream must see every write the compute stream made to src before copying it.
        self._stream.wait_stream(self._mod.current_stream())
        with self._mod.stream(self._stream):
            dst.copy_(src, non_blocking=True)
            event = self._mod.Event()
            event.record(self._stream)
        return CopyHandle(event=event)

    def synchronize(self) -> None:
        sync = getattr(self._stream, "synchronize", None)
        if sync is not None:
            sync()
        else:  # torch.cpu.Stream has no per-stream synchronize
            self._mod.synchronize()


def make_copy_engine(kind: str) -> CopyEngine:
    """The copy engine for a device kind: threads on CPU, side streams on cuda/npu."""
    return ThreadCopyEngine() if kind == "cpu" else StreamCopyEngine(kind)
