"""Progress scraping: the workloads' real exporter on a local port, parsed into status.progress."""

from __future__ import annotations

import datetime as dt

from trex.telemetry.exporter import Exporter
from trex_operator.api import Progress
from trex_operator.progress import default_url, parse_metrics, ratio_progress, scrape, stalled, train_progress

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _exporter() -> Exporter:
    e = Exporter()
    e.metric("trex_train_step", job_name="tj").set(250)
    e.metric("trex_train_max_steps", job_name="tj").set(1000)
    e.metric("trex_train_loss", job_name="tj").set(2.75)
    e.metric("trex_train_mfu", job_name="tj", device="cpu", flops_convention="6N").set(0.41)
    e.metric("trex_train_tokens_per_second", job_name="tj").set(12345.5)
    e.metric("trex_train_last_checkpoint_step", job_name="tj").set(200)
    return e


async def test_scrape_real_exporter_into_train_progress() -> None:
    e = _exporter()
    port = e.serve(0, addr="127.0.0.1")
    url = default_url({"status": {"podIP": "127.0.0.1"}}, port)
    assert url == f"http://127.0.0.1:{port}/metrics"
    metrics = await scrape(url)
    assert metrics is not None
    progress = train_progress(metrics, Progress(), NOW)
    assert progress.model_dump(by_alias=True, exclude_unset=True) == {"step": 250, "maxSteps": 1000, "loss": 2.75, "mfu": 0.41, "tokensPerSecond": 12345.5,
                        "lastCheckpointStep": 200, "updatedAt": "2026-01-01T00:00:00Z",
                        "stepChangedAt": "2026-01-01T00:00:00Z", "percent": "25.0%"}


async def test_unreachable_endpoint_is_none() -> None:
    assert await scrape("http://127.0.0.1:9/metrics", timeout_s=0.5) is None
    assert default_url({"status": {}}, 9400) is None


def test_stall_detection_uses_step_change_time() -> None:
    later = NOW + dt.timedelta(seconds=100)
    p1 = train_progress({"trex_train_step": 5.0}, Progress(), NOW)
    p2 = train_progress({"trex_train_step": 5.0}, p1, later)
    assert p2.step_changed_at == p1.step_changed_at
    assert stalled(p2, 100, later) and not stalled(p2, 101, later)
    p3 = train_progress({"trex_train_step": 6.0}, p2, later)
    assert not stalled(p3, 1, later)


def test_eval_ratio_is_averaged_over_benchmarks() -> None:
    e = Exporter()
    e.metric("trex_eval_progress_ratio", benchmark="nl4opt").set(0.5)
    e.metric("trex_eval_progress_ratio", benchmark="mamo_easy").set(1.0)
    from prometheus_client import generate_latest

    metrics = parse_metrics(generate_latest(e.registry).decode())
    assert ratio_progress(metrics, "trex_eval_progress_ratio", Progress(), NOW).percent == "75.0%"


def test_status_progress_and_results_are_typed_and_round_trip() -> None:
    from trex_operator.lifecycle import dump_status, load_status

    raw = {"progress": {"step": 250, "maxSteps": 1000, "loss": 2.75, "mfu": 0.41, "tokensPerSecond": 12345.5,
                        "percent": "25.0%", "stepChangedAt": "2026-01-01T00:00:00Z"},
           "results": {"passAt1": 0.625, "model": "m", "failedRequests": 0,
                       "benchmarks": {"nl4opt": {"passAt1": 0.5, "samples": 4, "n": 100},
                                      "mamo": {"passAt1": None, "samples": 0}}}}
    st = load_status(raw)
    assert (st.progress.step, st.progress.max_steps, st.progress.tokens_per_second) == (250, 1000, 12345.5)
    assert st.results.pass_at1 == 0.625 and st.results.benchmarks is not None
    assert st.results.benchmarks["nl4opt"].pass_at1 == 0.5 and st.results.benchmarks["mamo"].pass_at1 is None
    out = dump_status(st)
    assert out["progress"] == raw["progress"] and out["results"] == raw["results"]  # only what the job reached


def test_a_mistyped_progress_field_is_refused_by_name() -> None:
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="step"):
        Progress.model_validate({"step": "many"}, by_alias=True, by_name=False)
    with pytest.raises(ValidationError, match="unknownKey"):
        Progress.model_validate({"unknownKey": 1}, by_alias=True, by_name=False)
