"""The `kubectl get`-style table of trex jobs that `trex demo` refreshes: rows are pure functions of the
job objects; rendering is a rich Table on a TTY or aligned plain text otherwise."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import Any

HEADER = ("KIND", "NAME", "PHASE", "PROGRESS", "MFU", "PASS@1", "RESULT", "AGE")
TERMINAL = ("Succeeded", "Failed")


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)):
        return None
    return float(value)


def _pct(value: Any) -> str:
    v = _num(value)
    return f"{100.0 * v:.1f}%" if v is not None else ""


def age(created: Any, now: dt.datetime) -> str:
    """Kubernetes-style age: 45s, 3m12s, 2h5m."""
    if not isinstance(created, str):
        return ""
    try:
        t = dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return ""
    s = max(0, int((now - t).total_seconds()))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s"
    return f"{s // 3600}h{(s % 3600) // 60}m"


def result_text(kind: str, status: Mapping[str, Any]) -> str:
    """The key result of a job in a few words (from status.results / status.progress)."""
    results = status.get("results") or {}
    progress = status.get("progress") or {}
    if kind == "ORDataJob":
        if "accepted" in results:
            return f"accepted {results.get('accepted')}/{results.get('generated', '?')}"
        if "shards" in progress:
            return f"shards {progress.get('shardsDone', 0)}/{progress.get('shards')}"
    if kind == "TrainJob":
        step = results.get("step", progress.get("step"))
        loss = _num(results.get("loss", progress.get("loss")))
        if step is not None:
            return f"step {step}/{results.get('maxSteps', progress.get('maxSteps', '?'))}" + (f" loss {loss:.3f}" if loss is not None else "")
    if kind == "KernelTuneJob":
        g, gc = _num(results.get("geomeanSpeedup")), _num(results.get("geomeanSpeedupCompile"))
        if g is not None:
            return f"geomean {g:.2f}x eager" + (f", {gc:.2f}x compile" if gc is not None else "")
    if kind == "EvalJob":
        bench = results.get("benchmarks") or {}
        if isinstance(bench, dict) and bench:
            return ", ".join(f"{k}: {_pct(v.get('passAt1'))}" for k, v in bench.items() if isinstance(v, dict))
    if status.get("phase") == "Failed":
        return str(status.get("reason") or "")[:40]
    return ""


def job_row(obj: Mapping[str, Any], now: dt.datetime) -> tuple[str, ...]:
    """One table row of a trex job object."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    kind = str(obj.get("kind", ""))
    progress = status.get("progress") or {}
    results = status.get("results") or {}
    mfu = _pct(results.get("mfu", progress.get("mfu"))) if kind == "TrainJob" else ""
    pass1 = _pct(results.get("passAt1")) if kind == "EvalJob" else ""
    return (kind, str(meta.get("name", "")), str(status.get("phase") or "Pending"), str(progress.get("percent") or ""),
            mfu, pass1, result_text(kind, status), age(meta.get("creationTimestamp"), now))


def plain_table(rows: Sequence[Sequence[str]]) -> str:
    """Aligned columns, header first (as `kubectl get` prints)."""
    table = [HEADER, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table)


def rich_table(rows: Sequence[Sequence[str]], title: str = "") -> Any:
    """A rich Table of the rows (phase coloured)."""
    from rich.table import Table

    colours = {"Succeeded": "green", "Failed": "red", "Running": "cyan", "Starting": "yellow"}
    table = Table(title=title or None, expand=False)
    for h in HEADER:
        table.add_column(h, no_wrap=True)
    for r in rows:
        cells = list(r)
        colour = colours.get(cells[2])
        if colour:
            cells[2] = f"[{colour}]{cells[2]}[/{colour}]"
        table.add_row(*cells)
    return table


def all_terminal(objs: Sequence[Mapping[str, Any]]) -> bool:
    """True when every job has finished (Succeeded or Failed)."""
    return bool(objs) and all((o.get("status") or {}).get("phase") in TERMINAL for o in objs)
