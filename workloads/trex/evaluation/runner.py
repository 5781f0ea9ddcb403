"""The evaluation loop: load -> prompt -> generate -> extract -> execute (sandbox) -> score -> record.

Outputs under the run directory:

* ``samples.jsonl``: one record per (benchmark, item, sample), appended and fsynced as each finishes;
* ``errors.jsonl``: model requests that failed after retries (those samples stay missing, a rerun
  tries them again);
* ``run.json``: config, model, protocols and dataset provenance (atomic write);
* ``summary.json`` + reports (see :mod:`trex.evaluation.report`).

A rerun with the same directory skips every sample whose key (benchmark, item id, sample index,
prompt hash, protocol) is already recorded, so a killed run resumes where it stopped; a torn last
line is discarded.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trex.evaluation.benchmarks import Dataset, load_benchmark
from trex.evaluation.config import BenchmarkSpec, EvalConfig
from trex.evaluation.models.base import Model
from trex.evaluation.prompts import PROMPT_VERSION, build_messages, prompt_hash, prompt_set_for
from trex.fsio import atomic_write_bytes
from trex.reasoning import answer_of, with_mode_prompt
from trex.verify.extract import EXTRACT_VERSION, extract_code
from trex.verify.formats.bench4opt import reference_truth
from trex.verify.items import Item
from trex.verify.orgeval import ORGEVAL_VERSION, equivalent_lp
from trex.verify.program import ANSWERS_PRINTED, ANSWERS_RECORDED, run_program
from trex.verify.protocols import Protocol, get_protocol
from trex.verify.scoring import CATEGORIES, Execution, aggregate, classify, syntax_check

log = logging.getLogger("trex.evaluation")

SAMPLES = "samples.jsonl"
ERRORS = "errors.jsonl"
RUN = "run.json"
SUMMARY = "summary.json"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a temp file in the same folder, fsync, rename over ``path``."""
    atomic_write_bytes(path, json.dumps(data, indent=2, sort_keys=True, default=str).encode())


def sample_key(rec: dict[str, Any]) -> tuple[str, str, int, str, str]:
    """Identity of a sample for resuming."""
    return (str(rec["benchmark"]), str(rec["item_id"]), int(rec["sample_index"]), str(rec["prompt_hash"]),
            str(rec["protocol"]))


def read_samples(path: Path, repair: bool = False) -> list[dict[str, Any]]:
    """Complete records of a samples file; with ``repair``, a torn last line is cut off the file."""
    if not path.exists():
        return []
    data = path.read_bytes()
    records: list[dict[str, Any]] = []
    good_end = 0
    pos = 0
    for line in data.splitlines(keepends=True):
        pos += len(line)
        if not line.endswith(b"\n"):
            break
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            break
        if isinstance(rec, dict):
            records.append(rec)
        good_end = pos
    if repair and good_end < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(good_end)
    return records


@dataclass
class Job:
    """One sample to produce."""

    dataset: Dataset
    item: Item
    sample_index: int
    protocol: Protocol
    messages: list[dict[str, str]]
    phash: str


@dataclass
class RunOutcome:
    """What a run did: summary, counts, wall time."""

    out_dir: Path
    summary: dict[str, Any]
    new_samples: int
    skipped: int
    failed_requests: int
    wall_s: float
    category_counts: dict[str, int] = field(default_factory=dict)


def load_datasets(cfg: EvalConfig) -> list[Dataset]:
    """Every configured benchmark, loaded (ValueError names the benchmark and file at fault)."""
    text = "wp_concise.txt" if cfg.bench4opt_text == "wp_concise" else "wp.txt"
    out = []
    names = [b.name for b in cfg.benchmarks]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"benchmarks: {', '.join(sorted(dup))} listed more than once")
    for b in cfg.benchmarks:
        out.append(load_benchmark(b.name, b.path, b.format, limit=b.limit, bench4opt_text=text))
    return out


def _truths_for_bench4opt(ds: Dataset) -> list[Item]:
    """Bench4Opt items with the objective ground truth from solving their reference model."""
    from dataclasses import replace

    return [replace(it, truth=reference_truth(it.reference_lp)) if it.reference_lp is not None else it
            for it in ds.items]


class Recorder:
    """Appends sample records (one fsynced JSON line each) and keeps metrics and progress current."""

    def __init__(self, out_dir: Path, totals: dict[str, int], done: dict[str, int], exporter: Any | None,
                 on_progress: Callable[[int, int], None] | None) -> None:
        self.fh = open(out_dir / SAMPLES, "a", encoding="utf-8")
        self.err = open(out_dir / ERRORS, "a", encoding="utf-8")
        self.totals, self.done_by = totals, dict(done)
        self.total, self.done = sum(totals.values()), sum(done.values())
        self.exporter = exporter
        self.on_progress = on_progress
        self.counts: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.failed = 0

    def write(self, rec: dict[str, Any]) -> None:
        """Append one finished sample."""
        self.fh.write(json.dumps(rec, default=str, ensure_ascii=False) + "\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.done += 1
        b = rec["benchmark"]
        self.done_by[b] = self.done_by.get(b, 0) + 1
        self.counts[rec["category"]] = self.counts.get(rec["category"], 0) + 1
        if self.exporter is not None:
            self.exporter.metric("trex_eval_progress_ratio", benchmark=b).set(
                self.done_by[b] / max(1, self.totals.get(b, 1)))
            self.exporter.metric("trex_eval_samples_total", benchmark=b, category=rec["category"]).inc()
            u = rec.get("usage") or {}
            self.exporter.metric("trex_eval_tokens_total", benchmark=b, direction="prompt").inc(
                u.get("prompt_tokens", 0))
            self.exporter.metric("trex_eval_tokens_total", benchmark=b, direction="completion").inc(
                u.get("completion_tokens", 0))
        if self.on_progress is not None:
            self.on_progress(self.done, self.total)

    def error(self, rec: dict[str, Any]) -> None:
        """Record a failed model request; the first one's cause is also logged (a wrong URL or key shows at once)."""
        self.failed += 1
        if self.failed == 1:
            log.warning("%s", first_error_line(rec, self.err.name))
        if self.exporter is not None:
            self.exporter.metric("trex_eval_failed_requests_total", benchmark=rec["benchmark"]).inc()
        self.err.write(json.dumps({"time": time.time(), **rec}, default=str) + "\n")
        self.err.flush()

    def close(self) -> None:
        """Close the files."""
        self.fh.close()
        self.err.close()


def first_error_line(rec: dict[str, Any], errors_path: str) -> str:
    """The console line for the first failed request: which sample, the cause, where the rest go."""
    status = f" (HTTP {rec['status']})" if rec.get("status") is not None else ""
    return (f"model request failed for {rec['benchmark']}/{rec['item_id']} sample {rec['sample_index']}{status}: "
            f"{rec['error']}; every failed request goes to {errors_path} and a rerun retries them")


async def execute(code: str, item: Item, cfg: EvalConfig, want_lp: bool) -> tuple[Execution, dict[str, Any], str | None]:
    """Run ``code`` in the sandbox under the run's limits: (verdict inputs, record of the run, collected LP text)."""
    return await run_program(code, item, timeout_s=cfg.timeouts.execution_s, memory_mb=cfg.execution.memory_mb,
                             max_output_kb=cfg.execution.max_output_kb, printed=cfg.accept_printed_answers,
                             want_lp=want_lp)


async def run_job(job: Job, model: Model, cfg: EvalConfig, exec_sem: asyncio.Semaphore,
                  recorder: Recorder) -> None:
    """Produce, execute, score and record one sample (request failures go to errors.jsonl)."""
    from trex.llm.client import ChatError

    try:
        chat = await model.generate(job.messages, item=job.item, sample_index=job.sample_index)
    except ChatError as e:
        recorder.error({"benchmark": job.dataset.name, "item_id": job.item.id, "sample_index": job.sample_index,
                        "error": str(e), "status": e.status})
        return
    answer = answer_of(chat.text, cfg.reasoning_mode, getattr(model, "splits_reasoning", False))
    code, rule = extract_code(answer)
    syn = syntax_check(code) if code is not None else None
    is_b4o = job.item.reference_lp is not None
    exec_rec: dict[str, Any] | None = None
    execution: Execution | None = None
    lp_text: str | None = None
    if code is not None and syn is None:
        async with exec_sem:
            execution, exec_rec, lp_text = await execute(code, job.item, cfg, want_lp=is_b4o and cfg.orgeval)
    verdict, pred = classify(code, syn, execution, job.protocol, job.item)
    structural: bool | None = None
    structural_reason = ""
    if is_b4o and cfg.orgeval:
        if lp_text is None:
            structural, structural_reason = False, "no model.lp written"
        else:
            assert job.item.reference_lp is not None
            eq = await asyncio.to_thread(equivalent_lp, lp_text, job.item.reference_lp)
            structural, structural_reason = eq.equivalent, eq.reason
    truth = job.item.truth
    recorder.write({
        "benchmark": job.dataset.name, "dataset_version": job.dataset.version, "item_id": job.item.id,
        "item_category": job.item.category, "sample_index": job.sample_index, "protocol": job.protocol.tag,
        "prompt_hash": job.phash, "model": model.name, "prompt": job.messages[-1]["content"], "response": chat.text, "finish_reason": chat.finish_reason,
        "extraction": rule, "code": code, "syntax_error": syn, "execution": exec_rec,
        "category": verdict.category, "reason": verdict.reason,
        "prediction": None if pred is None else {"status": pred.status, "objective": pred.objective,
                                                 "values": pred.values},
        "truth": truth.as_dict() if truth is not None else {k: t.as_dict() for k, t in job.item.named.items()},
        "truth_status": truth.status if truth is not None else "optimal",
        "structural": structural, "structural_reason": structural_reason,
        "usage": chat.usage.as_dict(), "latency_s": round(chat.latency_s, 4), "time": time.time(),
    })


def plan_jobs(datasets: list[Dataset], cfg: EvalConfig, done: set[tuple[str, str, int, str, str]]) -> tuple[list[Job], int]:
    """Jobs still to run (and how many are already recorded)."""
    n = max(cfg.k)
    jobs: list[Job] = []
    skipped = 0
    specs: dict[str, BenchmarkSpec] = {b.name: b for b in cfg.benchmarks}
    for ds in datasets:
        proto = get_protocol(specs[ds.name].protocol or cfg.protocol)
        for item in ds.items:
            msgs = with_mode_prompt(build_messages(item, proto.name, ds.format), cfg.reasoning_mode,
                                    cfg.think_max_prompt)
            ph = prompt_hash(msgs, cfg.reasoning_mode)
            for s in range(n):
                if (ds.name, item.id, s, ph, proto.tag) in done:
                    skipped += 1
                    continue
                jobs.append(Job(ds, item, s, proto, msgs, ph))
    return jobs, skipped


def _protocol_meta(proto: Protocol) -> dict[str, str]:
    return {"tag": proto.tag, "rule": proto.rule, "prompt_set": prompt_set_for(proto.name)}


def endpoint(cfg: EvalConfig) -> str:
    """Where the answers come from: the server URL, the model directory, or the built-in reference."""
    m = cfg.model
    return (m.url or "(the job's model server)") if m.kind == "openai" else (m.path or m.kind)


def run_metadata(cfg: EvalConfig, datasets: list[Dataset], model_name: str) -> dict[str, Any]:
    """What run.json records: config, model, versions of every rule, dataset provenance."""
    specs: dict[str, BenchmarkSpec] = {b.name: b for b in cfg.benchmarks}
    return {
        "model": model_name,
        "endpoint": endpoint(cfg),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "config": cfg.model_dump(mode="json", by_alias=True),
        "versions": {"prompt": PROMPT_VERSION, "extract": EXTRACT_VERSION, "orgeval": ORGEVAL_VERSION},
        "protocols": {ds.name: _protocol_meta(get_protocol(specs[ds.name].protocol or cfg.protocol)) for ds in datasets},
        "datasets": [ds.provenance() for ds in datasets],
        "k": sorted(set(cfg.k)),
        "answers": ANSWERS_PRINTED if cfg.accept_printed_answers else ANSWERS_RECORDED,
    }


def current_keys(datasets: list[Dataset], cfg: EvalConfig) -> set[tuple[str, str, int, str, str]]:
    """Keys of every sample this configuration asks for (to score only those)."""
    jobs, _ = plan_jobs(datasets, cfg, set())
    return {(j.dataset.name, j.item.id, j.sample_index, j.phash, j.protocol.tag) for j in jobs}


async def run_eval(cfg: EvalConfig, model: Model, *, out_dir: str | Path | None = None, exporter: Any | None = None,
                   on_progress: Callable[[int, int], None] | None = None) -> RunOutcome:
    """Run (or resume) an evaluation and write samples, run.json and summary.json."""
    from trex.sandbox import require_isolation

    t0 = time.perf_counter()
    isolation = require_isolation(cfg.sandbox.min_isolation)
    if exporter is not None:
        exporter.metric("trex_eval_sandbox_isolation", mode=isolation).set(1)
    out = Path(out_dir or cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    datasets = load_datasets(cfg)
    datasets = [Dataset(ds.name, ds.format, ds.version, ds.path,
                        _truths_for_bench4opt(ds) if ds.format == "bench4opt" else ds.items, ds.content_hash)
                for ds in datasets]
    meta = {**run_metadata(cfg, datasets, model.name), "isolation": isolation}
    prev_path = out / RUN
    if prev_path.exists():
        prev = json.loads(prev_path.read_text(encoding="utf-8"))
        if prev.get("model") != model.name:
            raise ValueError(f"output {str(out)!r} holds a run of model {prev.get('model')!r}, not {model.name!r}; "
                             "use another output directory")
    write_json_atomic(prev_path, meta)
    existing = read_samples(out / SAMPLES, repair=True)
    done = {sample_key(r) for r in existing}
    jobs, skipped = plan_jobs(datasets, cfg, done)
    totals = {ds.name: ds.count * max(cfg.k) for ds in datasets}
    todo: dict[str, int] = {}
    for j in jobs:
        todo[j.dataset.name] = todo.get(j.dataset.name, 0) + 1
    done_by = {name: n - todo.get(name, 0) for name, n in totals.items()}
    if exporter is not None:
        for name, n in totals.items():
            exporter.metric("trex_eval_progress_ratio", benchmark=name).set(done_by[name] / max(1, n))
    recorder = Recorder(out, totals, done_by, exporter, on_progress)
    if on_progress is not None:
        on_progress(recorder.done, recorder.total)  # the progress clock starts now, with the resumed samples
    exec_sem = asyncio.Semaphore(cfg.execution.workers)
    queue: asyncio.Queue[Job] = asyncio.Queue()
    for j in jobs:
        queue.put_nowait(j)
    n_workers = max(1, min(len(jobs), cfg.model.concurrency + cfg.execution.workers))

    async def worker() -> None:
        while True:
            try:
                job = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await run_job(job, model, cfg, exec_sem, recorder)

    try:
        await asyncio.gather(*(worker() for _ in range(n_workers)))
    finally:
        recorder.close()
        await model.aclose()
    wanted = current_keys(datasets, cfg)
    records = [r for r in read_samples(out / SAMPLES) if sample_key(r) in wanted]
    summary = build_summary(meta, records, cfg)
    summary["run"] = {"new_samples": len(jobs) - recorder.failed, "skipped": skipped,
                      "failed_requests": recorder.failed, "wall_s": round(time.perf_counter() - t0, 3)}
    write_json_atomic(out / SUMMARY, summary)
    if exporter is not None:
        publish_metrics(exporter, summary)
    return RunOutcome(out, summary, len(jobs) - recorder.failed, skipped, recorder.failed,
                      time.perf_counter() - t0, recorder.counts)


def build_summary(meta: dict[str, Any], records: list[dict[str, Any]], cfg: EvalConfig | None = None) -> dict[str, Any]:
    """Scores per benchmark plus the run's provenance."""
    ks = meta.get("k") or [1]
    scores = aggregate(records, ks)
    expected = {d["name"]: d["items"] * max(ks) for d in meta.get("datasets", [])}
    for name, s in scores.items():
        s["expected_samples"] = expected.get(name)
        s["protocol"] = meta.get("protocols", {}).get(name, {})
    return {"model": meta.get("model"), "endpoint": meta.get("endpoint"), "started": meta.get("started"),
            "k": ks, "datasets": meta.get("datasets", []),
            "versions": meta.get("versions", {}), "benchmarks": scores, "answers": meta.get("answers"),
            "isolation": meta.get("isolation"),
            "complete": all(scores.get(n, {}).get("samples", 0) >= e for n, e in expected.items())}


def publish_metrics(exporter: Any, summary: dict[str, Any]) -> None:
    """Set the trex_eval_* gauges from a summary."""
    for name, s in summary["benchmarks"].items():
        proto = str(s.get("protocol", {}).get("tag", ""))
        for k in summary["k"]:
            v = s.get(f"pass@{k}")
            if v is not None:
                exporter.metric("trex_eval_pass_at_k", benchmark=name, k=str(k), protocol=proto).set(v)
        if s.get("structural_accuracy") is not None:
            exporter.metric("trex_eval_structural_accuracy", benchmark=name).set(s["structural_accuracy"])
        exp = s.get("expected_samples") or 0
        exporter.metric("trex_eval_progress_ratio", benchmark=name).set(min(1.0, s["samples"] / exp) if exp else 1.0)


def termination_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """Compact result for the pod's termination message."""
    benchmarks: dict[str, dict[str, Any]] = {}
    for n, s in summary["benchmarks"].items():
        entry: dict[str, Any] = {"passAt1": round(s["pass@1"], 4) if s.get("pass@1") is not None else None,
                                 "samples": s.get("samples")}
        if s.get("structural_accuracy") is not None:
            entry["structuralAccuracy"] = round(s["structural_accuracy"], 4)
        benchmarks[n] = entry
    return {
        "kind": "EvalJob", "model": summary.get("model"), "complete": summary.get("complete"),
        "benchmarks": benchmarks, "failedRequests": summary.get("run", {}).get("failed_requests", 0),
    }
