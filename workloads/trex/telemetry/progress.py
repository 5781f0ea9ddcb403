"""Progress for long work: a rich progress bar on a TTY, periodic log lines otherwise."""

from __future__ import annotations

import sys
import time
from collections import deque
from types import TracebackType
from typing import Any, TextIO

RATE_WINDOW_S = 60.0
"""Log lines report the rate over (about) the last minute, so a slow start or a pause fades out."""
RATE_MIN_SPAN_S = 1.0
"""No rate is shown before this much time has passed: one unit after a few milliseconds is no rate."""


def window_rate(points: deque[tuple[float, int]], now: float, done: int,
                window_s: float = RATE_WINDOW_S, min_span_s: float = RATE_MIN_SPAN_S) -> float | None:
    """Units per second over the last ``window_s`` of ``points`` ((time, done) pairs, oldest first; trimmed in
    place, ``(now, done)`` appended); None while they span less than ``min_span_s``. Units counted before the
    first point (e.g. resumed work) never enter the rate."""
    points.append((now, done))
    while len(points) > 2 and now - points[1][0] >= window_s:
        points.popleft()
    t0, d0 = points[0]
    return (done - d0) / (now - t0) if now - t0 >= min_span_s else None


class Progress:
    """Context manager tracking ``done`` out of ``total`` units; ``update`` advances it."""

    def __init__(self, description: str, total: int, *, every_s: float = 10.0, stream: TextIO | None = None,
                 force_tty: bool | None = None) -> None:
        self.description = description
        self.total = max(int(total), 0)
        self.done = 0
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if force_tty is None else force_tty
        self._bar: Any = None
        self._task: Any = None
        self._last = 0.0
        self._start = time.monotonic()
        self._points: deque[tuple[float, int]] = deque()
        self.fields: dict[str, object] = {}

    def __enter__(self) -> Progress:
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"), console=Console(file=self.stream), transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.description, total=self.total, info="")
        return self

    def update(self, advance: int = 1, **fields: object) -> None:
        """Advance by ``advance`` units and remember ``fields`` (shown next to the bar or in the log line)."""
        if not self._points:  # the baseline: whatever was done before the first update (a resume) is no rate
            self._points.append((self._start, self.done))
        self.done += advance
        self.fields.update(fields)
        info = " ".join(f"{k}={_fmt(v)}" for k, v in self.fields.items())
        if self._bar is not None:
            self._bar.update(self._task, advance=advance, info=info)
            return
        now = time.monotonic()
        rate = window_rate(self._points, now, self.done)
        if now - self._last >= self.every_s or self.done >= self.total:
            self._last = now
            pct = 100.0 * self.done / self.total if self.total else 100.0
            shown = "" if rate is None else f" {rate:.2f}/s"
            print(f"[{self.description}] {self.done}/{self.total} ({pct:.1f}%){shown} {info}".rstrip(),
                  file=self.stream, flush=True)

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
