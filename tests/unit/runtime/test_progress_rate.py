"""Progress log lines report a rate over a recent window: never before a second has passed (one unit after
a few milliseconds is no rate), never counting work resumed from an earlier run, and fading out a pause."""

from __future__ import annotations

import io
from collections import deque

from trex.telemetry.progress import Progress, window_rate


def test_no_rate_before_the_minimum_span_and_resumed_units_do_not_count() -> None:
    points: deque[tuple[float, int]] = deque([(100.0, 900)])  # 900 units resumed from an earlier run
    assert window_rate(points, 100.01, 901) is None  # was 97134/s-style: 901 / 0.01 s
    assert window_rate(points, 110.0, 920) == (920 - 900) / 10.0


def test_the_rate_follows_the_last_window_not_the_whole_run() -> None:
    points: deque[tuple[float, int]] = deque([(0.0, 0)])
    for t in range(1, 61):  # a minute at 10 units/s ...
        window_rate(points, float(t), 10 * t, window_s=30.0)
    rate = None
    for t in range(61, 121):  # ... then a minute at 1 unit/s
        rate = window_rate(points, float(t), 600 + (t - 60), window_s=30.0)
    assert rate is not None and abs(rate - 1.0) < 0.05  # the whole-run average would be 5.5/s
    assert len(points) <= 32  # trimmed to the window


def test_the_first_log_line_of_a_resumed_run_shows_no_rate() -> None:
    out = io.StringIO()
    with Progress("eval", 1000, stream=out, force_tty=False) as p:
        p.done = 900
        p.update(0)
        p.update(1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "[eval] 900/1000 (90.0%)" and "/s" not in out.getvalue(), lines
