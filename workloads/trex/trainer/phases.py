"""What each phase of a run used on this rank, for the termination summary's ``phases`` (the lifecycle plan's
measured counterpart, trex.trainer.plan.plan_lifecycle): peak host memory, bytes read and written, seconds.

At each phase's start the peak resident set (VmHWM) is reset to the current RSS by writing 5 to
/proc/self/clear_refs, and /proc/self/io is read; at its end VmHWM and /proc/self/io again: two small /proc reads
and one write per boundary. Bytes are ``rchar`` / ``wchar`` (what the process passed to read and write system
calls, page-cache hits included), not ``read_bytes`` / ``write_bytes`` (what reached the block device): a
checkpoint or export just written is read back from the page cache, which read_bytes counts as nothing, and
writes reach the device later, after the phase. On CPU gloo runs rchar / wchar also count the collectives' socket
traffic. Where /proc is not there (not Linux) nothing is measured. On an accelerator (cuda, npu) each phase also
gets ``deviceTransientBytes``: the device allocator's peak during the phase above what was allocated at its start
(torch's reset_peak_memory_stats / max_memory_allocated: counters, no synchronisation).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FIELDS = ("hostPeakBytes", "bytesRead", "bytesWritten", "seconds")
DEVICE_FIELD = "deviceTransientBytes"
PHASES = ("load", "resume", "step", "checkpoint", "export")
"""The phases a run measures, in the order they run."""
_PROC = Path("/proc/self")


def _io() -> tuple[int, int] | None:
    """(rchar, wchar) of this process, None without /proc."""
    try:
        text = (_PROC / "io").read_text()
    except OSError:
        return None
    vals = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    return int(vals["rchar"]), int(vals["wchar"])


def _peak_rss() -> int:
    """VmHWM of this process in bytes."""
    for line in (_PROC / "status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS; False where the kernel does not allow it."""
    try:
        (_PROC / "clear_refs").write_text("5")
    except OSError:
        return False
    return True


class PhaseMeter:
    """Per phase name: the largest host (and device) peak and the summed bytes and seconds of every time it ran.
    ``accelerator``: the torch device module (torch.cuda, torch.npu) whose allocator peaks are measured, or None."""

    def __init__(self, accelerator: Any = None) -> None:
        self.phases: dict[str, dict[str, float]] = {}
        self.accelerator = accelerator
        self.fields = (*FIELDS, DEVICE_FIELD) if accelerator is not None else FIELDS

    @contextmanager
    def measure(self, name: str) -> Iterator[None]:
        """Measure the block as (one more run of) phase ``name`` (one of PHASES); a block that raises is not
        recorded."""
        io0 = _io()
        reset = io0 is not None and _reset_peak()
        acc = self.accelerator
        if acc is not None:
            acc.reset_peak_memory_stats()
            allocated = acc.memory_allocated()
        t0 = time.perf_counter()
        yield
        seconds = time.perf_counter() - t0
        io1 = _io()
        if io0 is None or io1 is None:
            return
        row = self.phases.setdefault(name, dict.fromkeys(self.fields, 0.0))
        row["hostPeakBytes"] = max(row["hostPeakBytes"], _peak_rss() if reset else 0)
        if acc is not None:
            row[DEVICE_FIELD] = max(row[DEVICE_FIELD], acc.max_memory_allocated() - allocated)
        row["bytesRead"] += io1[0] - io0[0]
        row["bytesWritten"] += io1[1] - io0[1]
        row["seconds"] += seconds

    def summary(self, group: Any = None) -> dict[str, dict[str, float | int]]:
        """``{phase: {hostPeakBytes, bytesRead, bytesWritten, seconds[, deviceTransientBytes]}}`` of the phases that
        ran on some rank, each figure the maximum over the ranks of ``group`` (one all-reduce of a host tensor, a
        collective every rank calls, like the trainer's loss sums; None: this process)."""
        fields = self.fields
        flat = [self.phases.get(n, {}).get(f, 0.0) for n in PHASES for f in fields]
        if group is not None:
            import torch
            import torch.distributed as dist

            vals = torch.tensor(flat, dtype=torch.float64)
            dist.all_reduce(vals, op=dist.ReduceOp.MAX, group=group)
            flat = [float(v) for v in vals.tolist()]
        out: dict[str, dict[str, float | int]] = {}
        for i, n in enumerate(PHASES):
            row = dict(zip(fields, flat[i * len(fields):(i + 1) * len(fields)], strict=True))
            if n in self.phases or any(row.values()):
                out[n] = {f: (round(v, 3) if f == "seconds" else int(v)) for f, v in row.items()}
        return out
