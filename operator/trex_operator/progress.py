"""Progress from rank 0's Prometheus metrics: parse the exposition text and map it onto status.progress."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from typing import Any

from trex.telemetry.metrics import spec

from trex_operator.api import Progress
from trex_operator.lifecycle import iso, parse_time

TRAIN_KEYS: dict[str, str] = {
    "step": "trex_train_step", "maxSteps": "trex_train_max_steps", "loss": "trex_train_loss",
    "mfu": "trex_train_mfu", "tokensPerSecond": "trex_train_tokens_per_second",
    "lastCheckpointStep": "trex_train_last_checkpoint_step",
}
EVAL_RATIO = "trex_eval_progress_ratio"
ORDATA_RATIO = "trex_ordata_progress_ratio"
for _name in (*TRAIN_KEYS.values(), EVAL_RATIO, ORDATA_RATIO):
    spec(_name)  # every scraped name is defined in trex.telemetry.metrics

UrlBuilder = Callable[[dict[str, Any], int], str | None]


def default_url(pod: dict[str, Any], port: int) -> str | None:
    """http://<podIP>:<port>/metrics, or None while the pod has no IP."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    host = f"[{ip}]" if ":" in str(ip) else str(ip)
    return f"http://{host}:{port}/metrics"


def parse_metrics(text: str) -> dict[str, float]:
    """Mean value per sample name (labels folded) of the trex_* samples in a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("trex_") and math.isfinite(sample.value):
                sums.setdefault(sample.name, []).append(float(sample.value))
    return {k: sum(v) / len(v) for k, v in sums.items()}


async def scrape(url: str, timeout_s: float = 3.0) -> dict[str, float] | None:
    """GET ``url`` and parse it; None when the endpoint is unreachable or answers garbage."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.get(url) as resp:
                if resp.status != 200:
                    return None
                text = await resp.text()
        return parse_metrics(text)
    except (aiohttp.ClientError, TimeoutError, ValueError, OSError):
        return None


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else round(float(value), 6)


def _progress(values: dict[str, Any]) -> Progress:
    return Progress.model_validate(values, by_alias=True, by_name=False)


def train_progress(metrics: dict[str, float], previous: Progress, now: dt.datetime) -> Progress:
    """status.progress of a TrainJob from scraped samples; stepChangedAt records when the step last advanced."""
    before = previous.model_dump(by_alias=True, exclude_unset=True)
    out = dict(before)
    for key, name in TRAIN_KEYS.items():
        if name in metrics:
            out[key] = _num(metrics[name])
    out["updatedAt"] = iso(now)
    if "step" in out and (before.get("step") != out["step"] or "stepChangedAt" not in before):
        out["stepChangedAt"] = iso(now)
    step, max_steps = out.get("step"), out.get("maxSteps")
    if isinstance(step, int | float) and isinstance(max_steps, int | float) and max_steps > 0:
        out["percent"] = f"{min(100.0, 100.0 * step / max_steps):.1f}%"
    return _progress(out)


def ratio_progress(metrics: dict[str, float], name: str, previous: Progress, now: dt.datetime) -> Progress:
    """status.progress from a 0..1 progress-ratio gauge."""
    if name not in metrics:
        return previous
    ratio = round(min(1.0, max(0.0, metrics[name])), 4)
    return previous.model_copy(update={"ratio": ratio, "percent": f"{100.0 * ratio:.1f}%", "updated_at": iso(now)})


def stalled(progress: Progress, stall_seconds: int, now: dt.datetime) -> bool:
    """True when the step has not advanced for ``stall_seconds``."""
    since = parse_time(progress.step_changed_at)
    return since is not None and (now - since).total_seconds() >= stall_seconds
