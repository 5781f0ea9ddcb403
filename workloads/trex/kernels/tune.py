"""One KernelTuneJob run: for every (kernel, shape, dtype): MILP-ranked starts measured, verified tree
search from the fastest, skills recorded, baselines timed; then registry, results, report, metrics."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trex.fsio import atomic_write_bytes
from trex.kernels import registry as reg
from trex.kernels.backends import Backend, get_backend
from trex.kernels.backends.base import DeviceFacts
from trex.kernels.config import KernelTuneConfig
from trex.kernels.harness import KernelEvaluator, baselines, jsonable
from trex.kernels.roofline import achieved_bandwidth_fraction, classify, fraction_of_roofline
from trex.kernels.search import Budget, SearchConfig, best_node, run_search
from trex.kernels.skills import Context, Skill, SkillLibrary
from trex.kernels.suite import SUITE
from trex.kernels.suite.base import KernelSpec, shape_bucket, shape_key
from trex.kernels.tiling import plan, predicted_times
from trex.telemetry.summary import write_termination_summary

Log = Callable[[str], None]


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None with fewer than 3 points or no spread."""
    import numpy as np

    if len(xs) < 3:
        return None

    def ranks(v: list[float]) -> Any:
        a = np.asarray(v, dtype=float)
        order = a.argsort(kind="mergesort")
        r = np.empty(len(a))
        r[order] = np.arange(len(a), dtype=float)
        for val in np.unique(a):
            m = a == val
            r[m] = r[m].mean()
        return r

    rx, ry = ranks(xs), ranks(ys)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def jobs(cfg: KernelTuneConfig, backend: Backend) -> list[tuple[KernelSpec, dict[str, int], str]]:
    """(spec, shape, dtype) triples to tune, in suite order, the first shape of each shape class."""
    names = list(SUITE) if cfg.suite == "default" and not cfg.kernels else list(cfg.kernels)
    out: list[tuple[KernelSpec, dict[str, int], str]] = []
    for n in names:
        spec = SUITE[n]
        listed = [dict(s.dims) for s in cfg.shapes if s.kernel == n] or [dict(s) for s in spec.default_shapes]
        # one shape per class: the registry keeps one entry per (kernel, class, dtype), so a second is wasted trials
        firsts: dict[str, dict[str, int]] = {}
        for sh in listed:
            firsts.setdefault(shape_bucket(sh), sh)
        shapes = list(firsts.values())
        for dt in cfg.dtypes:
            if backend.supports(spec, dt):
                out.extend((spec, sh, dt) for sh in shapes)
    return out


def progress_fields(kernel: str, shape: Mapping[str, int], dtype: str) -> dict[str, str]:
    """What the progress line names while a problem is tuned: the kernel, its shape and dtype."""
    return {"kernel": kernel, "shape": shape_key(shape), "dtype": dtype}


def make_backend(cfg: KernelTuneConfig) -> Backend:
    """Backend for the config (cache dir and SoC passed through)."""
    if cfg.backend == "cpu-c":
        return get_backend("cpu-c", cache_dir=cfg.cache_dir)
    if cfg.backend == "npu-ascendc":
        return get_backend("npu-ascendc", soc=cfg.soc, cache_dir=cfg.cache_dir)
    return get_backend(cfg.backend)


def tune_one(spec: KernelSpec, shape: dict[str, int], dtype: str, cfg: KernelTuneConfig, backend: Backend,
             facts: DeviceFacts, lib: SkillLibrary, out: Path, trials: int, seconds: float,
             on_trial: Callable[[dict[str, Any]], None], log: Log) -> dict[str, Any]:
    """Tune one problem; returns its result record."""
    t0 = time.monotonic()
    fixed = {"THREADS": cfg.threads} if cfg.threads and "THREADS" in backend.param_space(spec, shape) else None
    space = dict(backend.param_space(spec, shape))
    if fixed:
        space["THREADS"] = (cfg.threads,) if cfg.threads in space["THREADS"] else space["THREADS"]
        fixed = {"THREADS": space["THREADS"][0]} if len(space["THREADS"]) == 1 else None
    if space.get("THREADS") == (1,) and "CHUNK" in space:
        space["CHUNK"] = (backend.default_params(spec, shape)["CHUNK"],)  # scheduling chunks mean nothing serially
        fixed = {**(fixed or {}), "CHUNK": space["CHUNK"][0]}
    roof = classify(spec, shape, dtype, facts)
    pl = plan(spec, shape, dtype, backend, facts, k=cfg.milp_starts, fixed=fixed)
    ev = KernelEvaluator(spec, shape, dtype, backend, facts, samples=cfg.budget.samples, seed=cfg.seed,
                         gate_seeds=cfg.gate_seeds, predictor=backend.predict)
    starts: list[dict[str, Any]] = []
    for cand in pl.ranked:
        r = ev.measure_root(cand.params)
        starts.append({"params": cand.params, "predicted_s": cand.predicted, "median_s": r.median_s,
                       "status": r.status, "reason": r.reason})
    good = [s for s in starts if s["status"] == "root"]
    root = min(good, key=lambda s: s["median_s"])["params"] if good else backend.default_params(spec, shape)
    ctx = Context(spec.name, spec.kclass, roof.regime, shape_bucket(shape), facts.name, backend.name)
    matches = lib.retrieve(ctx)
    extra = None
    if cfg.llm is not None:
        from trex.kernels.llm import LLMProposer

        extra = LLMProposer(cfg.llm.url, cfg.llm.model, cfg.llm.api_key_env, spec.name,
                            {"regime": roof.regime, "intensity": roof.intensity, "ridge": roof.ridge}, space, matches)
    scfg = SearchConfig(space=space, root=root, budget=Budget(trials, seconds), plan_order=pl.param_order,
                        skills=matches, extra_moves=extra,
                        meta={"kernel": spec.name, "shape": shape, "dtype": dtype, "backend": backend.name})

    def accepted(new: dict[str, Any], parent: dict[str, Any]) -> None:
        p, v = new["move"]
        lib.add([Skill(spec.name, spec.kclass, roof.regime, shape_bucket(shape), facts.name, backend.name,
                       new["direction"], p, int(parent["params"][p]), int(v), float(new["gain"]))])

    def trial_cb(t: dict[str, Any]) -> None:
        if extra is not None:
            extra.trials.append(t)
        on_trial(t)

    tag = f"{spec.name}-{dtype}-" + "-".join(f"{k}{v}" for k, v in sorted(shape.items()))
    state = run_search(out / "search" / f"{tag}.json", ev, scfg, on_trial=trial_cb, on_accept=accepted)
    best = best_node(state)
    log(f"{spec.name} {dtype} {shape_key(shape)}: {len(state['trials'])} trials, x{best['speedup']:.2f} over the "
        f"MILP start ({state['stop_reason']})")
    bl = baselines(ev, best["params"], samples=cfg.budget.samples, threads=cfg.threads,
                   with_compile=cfg.compare_compile)
    measured = [(s["predicted_s"], s["median_s"]) for s in starts if s["status"] == "root"]
    measured += [(t["predicted_s"], t["median_s"]) for t in state["trials"] if t["median_s"] > 0]
    rho = spearman([a for a, _ in measured], [b for _, b in measured])
    configs = [s["params"] for s in starts if s["status"] == "root"] + [t["params"] for t in state["trials"]
                                                                        if t["median_s"] > 0]
    modelled = [(m, b) for m, (_, b) in zip(predicted_times(pl.model, configs) if pl.model else [], measured,
                                            strict=False) if m is not None]
    rho_milp = spearman([a for a, _ in modelled], [b for _, b in modelled])
    outcomes: dict[str, int] = {}
    for t in state["trials"]:
        outcomes[t["status"]] = outcomes.get(t["status"], 0) + 1
    record: dict[str, Any] = jsonable({
        "kernel": spec.name, "kclass": spec.kclass, "shape": shape, "bucket": shape_bucket(shape), "dtype": dtype,
        "device": facts.name, "backend": backend.name, "regime": roof.regime, "intensity": roof.intensity,
        "ridge": roof.ridge, "params": best["params"], "source_hash": best["source_hash"],
        "search_speedup": best["speedup"], "tuned_s": bl.tuned_s, "eager_s": bl.eager_s,
        "compiled_s": bl.compiled_s, "compile_time_s": bl.compile_time_s, "speedup_eager": bl.eager_speedup,
        "speedup_eager_ci": bl.eager_ci, "speedup_compile": bl.compiled_speedup, "speedup_compile_ci": bl.compiled_ci,
        "roofline_fraction": fraction_of_roofline(spec, shape, dtype, facts, bl.tuned_s),
        "bandwidth_fraction": achieved_bandwidth_fraction(spec, shape, dtype, facts, bl.tuned_s,
                                                          int(best["params"].get("THREADS", 0))),
        "milp_starts": starts, "milp_directions": pl.directions, "spearman": rho, "spearman_milp": rho_milp,
        "n_measured": len(measured),
        "predicted_vs_measured": measured, "trials": len(state["trials"]), "outcomes": outcomes,
        "skills_used": len(matches), "stop_reason": state["stop_reason"], "seconds": time.monotonic() - t0,
    })
    return record


def run(cfg: KernelTuneConfig, log: Log | None = None) -> dict[str, Any]:
    """Tune everything the config selects; writes registry.json, results.json, report.md, metrics.prom."""
    from trex.kernels.report import write_report
    from trex.telemetry.exporter import Exporter
    from trex.telemetry.progress import Progress

    say: Log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    backend = make_backend(cfg)
    facts = backend.facts()
    work = jobs(cfg, backend)
    if not work:
        raise ValueError(f"nothing to tune: no selected kernel supports backend {cfg.backend} with dtypes {cfg.dtypes}")
    lib = SkillLibrary(cfg.skills_path or out / "skills.jsonl")
    exporter = Exporter()
    if os.environ.get("TREX_METRICS_PORT"):
        exporter.serve()
    results_path = out / "results.json"
    previous = {(r["kernel"], shape_key(r["shape"]), r["dtype"]): r
                for r in (json.loads(results_path.read_text())["results"] if results_path.exists() else [])}
    registry = reg.load(out / "registry.json") if (out / "registry.json").exists() else reg.empty(backend.name, facts.name)
    results: list[dict[str, Any]] = []
    t_start = time.monotonic()
    trials_left = cfg.budget.trials
    current: dict[str, str] = {}
    with Progress(f"kernels ({backend.name})", total=cfg.budget.trials) as prog:
        def on_trial(t: dict[str, Any]) -> None:
            prog.update(1, **current, status=t["status"])

        for i, (spec, shape, dtype) in enumerate(work):
            key = (spec.name, shape_key(shape), dtype)
            current.update(progress_fields(spec.name, shape, dtype))
            remaining = len(work) - i
            per_trials = max(1, trials_left // remaining)
            per_seconds = max(1.0, (cfg.budget.seconds - (time.monotonic() - t_start)) / remaining)
            if key in previous and previous[key].get("complete"):
                results.append(previous[key])
                trials_left -= int(previous[key]["trials"])
                continue
            r = tune_one(spec, shape, dtype, cfg, backend, facts, lib, out, per_trials, per_seconds, on_trial, say)
            r["complete"] = True
            trials_left -= int(r["trials"])
            results.append(r)
            reg.put(registry, spec.name, shape, dtype, {"params": r["params"], "source_hash": r["source_hash"],
                                                       "median_s": r["tuned_s"], "speedup_eager": r["speedup_eager"],
                                                       "speedup_compile": r["speedup_compile"]})
            reg.save(registry, out / "registry.json")
            _save_results(results_path, facts, results)
            labels = {"kernel": spec.name, "shape": shape_key(shape), "dtype": dtype, "device": facts.name}
            exporter.metric("trex_kernel_speedup", baseline="eager", **labels).set(r["speedup_eager"])
            if r["speedup_compile"] is not None:
                exporter.metric("trex_kernel_speedup", baseline="torch.compile", **labels).set(r["speedup_compile"])
            exporter.metric("trex_kernel_roofline_fraction", **labels).set(r["roofline_fraction"])
            exporter.metric("trex_kernel_best_seconds", **labels).set(r["tuned_s"])
            exporter.metric("trex_kernel_bandwidth_fraction", **labels).set(r["bandwidth_fraction"])
            if r["spearman"] is not None:
                exporter.metric("trex_kernel_model_spearman", **labels).set(r["spearman"])
            for outcome, n in r["outcomes"].items():
                exporter.metric("trex_kernel_trials_total", kernel=spec.name, outcome=outcome).inc(n)
    _save_results(results_path, facts, results)
    (out / "metrics.prom").write_text(exporter.render(), encoding="utf-8")
    write_report(out)
    summary = termination_summary(results, backend.name, facts)
    write_termination_summary(summary)
    return summary


def _save_results(path: Path, facts: DeviceFacts, results: list[dict[str, Any]]) -> None:
    from trex.kernels.machine import facts_to_json

    atomic_write_bytes(path, json.dumps({"facts": facts_to_json(facts), "results": results}, indent=1).encode())


def termination_summary(results: Sequence[Mapping[str, Any]], backend: str, facts: DeviceFacts) -> dict[str, Any]:
    """Compact outcome for the pod's termination message."""
    import math

    def entry(r: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"speedup": round(float(r["speedup_eager"]), 3), "params": dict(r["params"])}
        if r.get("speedup_compile"):
            out["speedupCompile"] = round(float(r["speedup_compile"]), 3)
        return out
    kernels = {f"{r['kernel']}/{r['dtype']}/{r['bucket']}": entry(r) for r in results}

    def geo(key: str) -> float | None:  # over the published per-class figures, so the two always agree
        sp = [float(v[key]) for v in kernels.values() if v.get(key)]
        return round(math.exp(sum(math.log(s) for s in sp) / len(sp)), 4) if sp else None
    # Keys follow the operator's contract: geomeanSpeedup (over eager), geomeanSpeedupCompile (over torch.compile)
    # and kernels.<kernel/dtype/shape class>.speedup / .speedupCompile become status.results; the params
    # become the registry a TrainJob's kernelsFrom mounts.
    return {"kind": "KernelTuneJob", "backend": backend, "device": facts.name, "tuned": len(results),
            "geomeanSpeedup": geo("speedup"), "geomeanSpeedupCompile": geo("speedupCompile"),
            "trials": sum(int(r["trials"]) for r in results), "kernels": kernels}
