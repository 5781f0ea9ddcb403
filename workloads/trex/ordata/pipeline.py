"""The ORData pipeline: generate -> solve -> verify -> render -> reconstruct -> execute -> gate -> dedup -> write.

Instance ``i`` is fully determined by (config, i): its family, size, domain, style and seeds derive from the
master seed, so shards (``i % num_shards``) are independent and a rerun reproduces them byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trex import prompt_contract as contract
from trex.ordata.config import ORDataConfig
from trex.ordata.generators import FAMILIES, GenerationError, derive_seed, sample_feasible
from trex.ordata.generators.base import MAX_ATTEMPTS
from trex.ordata.ir import Instance
from trex.ordata.reconstruct import reconstruction
from trex.ordata.render import fmt_num, render
from trex.ordata.shards import (
    MANIFEST,
    PROGRESS,
    SCHEMA,
    atomic_write_json,
    files_verified,
    manifest_complete,
    read_json,
    read_jsonl,
    remove_unlisted,
    shard_dir_name,
    shard_positions,
    write_part,
)
from trex.ordata.solve import SolveResult, solve
from trex.ordata.verify import cross_check, should_cross_check, verify_solution
from trex.prompt_contract import CONTRACT_VERSION, DEFAULT_SET, FORMULATION_HEADER

CPT_SPLIT = "\n\n" + FORMULATION_HEADER
"""Where a CPT document's problem text ends and its reference answer begins."""
PROMPT_RECORD = {"set": DEFAULT_SET, "version": CONTRACT_VERSION}
"""The prompt contract SFT records follow (recorded in every manifest)."""
STAGES = ("generate", "solve", "verify", "render", "reconstruct", "sandbox", "gates", "dedup", "write")


# --- planning (pure) ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """Everything that decides instance ``index`` before any work is done."""

    index: int
    family: str
    size: int
    seed: int
    style: str
    form: str
    library: str


def plan_instance(cfg: ORDataConfig, index: int) -> Plan:
    """Deterministic family (by weight), size, style, form and code library of instance ``index``."""
    rng = np.random.default_rng(derive_seed(cfg.seed, "__mix__", index))
    weights = np.array([f.weight for f in cfg.families], dtype=float)
    spec = cfg.families[int(rng.choice(len(cfg.families), p=weights / weights.sum()))]
    size = int(rng.integers(spec.size.min, spec.size.max + 1))
    style = cfg.render.styles[int(rng.integers(len(cfg.render.styles)))]
    form = cfg.render.forms[int(rng.integers(len(cfg.render.forms)))]
    lib = cfg.reconstruction.code_solver
    library = ("gurobipy", "highspy")[int(rng.integers(2))] if lib == "both" else lib
    return Plan(index, spec.name, size, derive_seed(cfg.seed, spec.name, index), style, form, library)


def config_hash(cfg: ORDataConfig) -> str:
    """sha256 of the settings that determine the samples (output folder and shard count excluded)."""
    data = {**cfg.model_dump(mode="json", exclude={"output", "shards"}), "prompt_contract": CONTRACT_VERSION}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


# --- per-instance processing ---------------------------------------------------------------------------
@dataclass
class Outcome:
    """Result of one instance: ``outcome`` is "accepted" or a rejection reason code."""

    plan: Plan
    outcome: str
    sample: dict[str, Any] | None = None
    detail: str = ""
    ir_hash: str = ""
    reached: tuple[str, ...] = ()
    attempts: int = 0


@dataclass
class StageTimer:
    """Accumulated seconds per stage (exported as trex_ordata_stage_seconds_total)."""

    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    exported: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - t0


def _solve_checked(cfg: ORDataConfig, timer: StageTimer, box: dict[str, SolveResult]) -> Callable[[Instance], str | None]:
    def accept(inst: Instance) -> str | None:
        with timer("solve"):
            res = solve(inst, cfg.solver, cfg.time_limit_s)
        box["result"] = res
        return None if res.optimal else f"solver status {res.status}"
    return accept


def process(plan: Plan, cfg: ORDataConfig, timer: StageTimer) -> Outcome:
    """Run one instance through every stage up to (not including) dedup and writing."""
    from trex.ordata import gates

    fam = FAMILIES[plan.family]
    box: dict[str, SolveResult] = {}
    reached: list[str] = []
    t0, solve0 = time.perf_counter(), timer.seconds["solve"]
    try:
        inst, attempts = sample_feasible(fam, plan.seed, plan.size, accept=_solve_checked(cfg, timer, box))
    except GenerationError as exc:
        return Outcome(plan, "generate.failed", detail=str(exc), attempts=MAX_ATTEMPTS)
    finally:  # generation time excludes the solves made inside the sampling loop
        timer.seconds["generate"] += time.perf_counter() - t0 - (timer.seconds["solve"] - solve0)
    reached += ["generated", "solved"]
    res = box["result"]
    ir_hash = inst.content_hash()
    with timer("verify"):
        ver = verify_solution(inst, res.values, res.objective, cfg.tolerances)
        if not ver.ok:
            return Outcome(plan, f"verify.{ver.reason}", ir_hash=ir_hash, reached=tuple(reached), attempts=attempts)
        crossed = should_cross_check(plan.seed, cfg.cross_check_fraction)
        if crossed:
            agree, why = cross_check(inst, res, cfg.tolerances, cfg.time_limit_s)
            if not agree:
                return Outcome(plan, "verify.solver_disagreement", detail=why, ir_hash=ir_hash, reached=tuple(reached), attempts=attempts)
    reached.append("verified")
    with timer("render"):
        rendered = render(inst, plan.style, plan.form)  # type: ignore[arg-type]
    cleaner = gates.Cleaner()
    problem = cleaner.clean_text(rendered.text)
    with timer("reconstruct"):
        try:
            form_text, code = _reconstruct(cfg, inst, problem, plan.library)
        except _Rejected as exc:
            return Outcome(plan, exc.reason, detail=exc.detail, ir_hash=ir_hash, reached=tuple(reached),
                           attempts=attempts)
        code = cleaner.clean_code(code)
    with timer("gates"):
        g = gates.ast_gate(code, plan.library)
        if g.accepted:
            g = gates.review_gate(problem, form_text, rendered.numbers)
    if not g.accepted:
        return Outcome(plan, g.reason or "gate.rejected", detail=g.detail, ir_hash=ir_hash, reached=tuple(reached), attempts=attempts)
    with timer("sandbox"):
        sb = _execute(cfg, code)
    with timer("gates"):
        assert res.objective is not None
        g = gates.execution_gate(sb)
        if g.accepted:
            g = gates.structural_gate(sb.solve, gates.instance_model(inst))
        if g.accepted:
            g = gates.objective_gate(sb.objective, res.objective, cfg.tolerances.objective_rel)
    if not g.accepted:
        return Outcome(plan, g.reason or "gate.rejected", detail=g.detail, ir_hash=ir_hash, reached=tuple(reached), attempts=attempts)
    sample = _sample(cfg, plan, inst, ir_hash, res, problem, form_text, code, crossed, attempts, sb.objective)
    return Outcome(plan, "accepted", sample=sample, ir_hash=ir_hash, reached=tuple(reached), attempts=attempts)


def draft_sample(cfg: ORDataConfig, plan: Plan) -> dict[str, Any] | None:
    """Instance ``plan`` generated, solved, rendered and given its reference formulation and program, without
    verification, gates or execution: what its sample will look like (length budgets read it before a job
    runs). None when the family cannot draw a feasible instance."""
    from trex.ordata import gates

    box: dict[str, SolveResult] = {}
    try:
        inst, attempts = sample_feasible(FAMILIES[plan.family], plan.seed, plan.size,
                                         accept=_solve_checked(cfg, StageTimer(), box))
    except GenerationError:
        return None
    cleaner = gates.Cleaner()
    problem = cleaner.clean_text(render(inst, plan.style, plan.form).text)  # type: ignore[arg-type]
    form_text, code = reconstruction(inst, plan.library, cfg.reconstruction.layout)
    res = box["result"]
    return _sample(cfg, plan, inst, inst.content_hash(), res, problem, form_text, cleaner.clean_code(code), False,
                   attempts, res.objective)


def _reconstruct(cfg: ORDataConfig, inst: Instance, problem: str, library: str) -> tuple[str, str]:
    if cfg.reconstruction.mode == "reference":
        return reconstruction(inst, library, cfg.reconstruction.layout)
    from trex.ordata import llm_reconstruct

    assert cfg.reconstruction.endpoint is not None
    try:
        rec = llm_reconstruct.reconstruct(problem, cfg.reconstruction.endpoint, seed=inst.seed)
    except llm_reconstruct.ReconstructionError as exc:
        raise _Rejected(exc.reason, str(exc)[:300]) from exc
    return rec.formulation, rec.code


class _Rejected(Exception):
    """A stage rejected the instance with a reason code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _execute(cfg: ORDataConfig, code: str) -> Any:
    from trex.sandbox import Limits, run_python

    lim = cfg.sandbox
    return run_python(code, limits=Limits(timeout_s=lim.timeout_s, cpu_s=lim.cpu_s, memory_mb=lim.memory_mb))


def _sample(cfg: ORDataConfig, plan: Plan, inst: Instance, ir_hash: str, res: SolveResult, problem: str,
            form_text: str, code: str, crossed: bool, attempts: int, exec_objective: float | None) -> dict[str, Any]:
    fam = FAMILIES[plan.family]
    provenance = {
        "index": plan.index, "family": plan.family, "kind": fam.kind, "domain": inst.domain, "seed": plan.seed,
        "master_seed": cfg.seed, "size": plan.size, "style": plan.style, "form": plan.form,
        "generator_version": fam.version, "solver": res.solver, "solver_version": res.solver_version,
        "objective": res.objective, "objective_sense": inst.objective.sense, "executed_objective": exec_objective,
        "code_library": plan.library, "reconstruction": cfg.reconstruction.mode,
        "layout": cfg.reconstruction.layout, "cross_checked": crossed,
        "sampling_attempts": attempts, "tolerances": cfg.tolerances.model_dump(mode="json"), "ir_hash": ir_hash,
    }
    return {"id": f"ordata-{cfg.seed}-{plan.index:08d}", "problem": problem, "formulation": form_text, "code": code,
            "provenance": provenance}


def reference_answer(sample: dict[str, Any]) -> str:
    """The sample's reference answer in the prompt contract's layout (formulation, program, objective)."""
    return contract.answer_text(sample["formulation"], sample["code"], fmt_num(sample["provenance"]["objective"]))


def cpt_record(sample: dict[str, Any]) -> dict[str, Any]:
    """CPT text document: the problem, then its reference answer."""
    text = f"{sample['problem']}\n\n{reference_answer(sample)}\n"
    return {"schema": SCHEMA, "id": sample["id"], "text": text, "provenance": sample["provenance"]}


def sft_record(sample: dict[str, Any]) -> dict[str, Any]:
    """SFT chat sample: the evaluation prompt of the problem (prompt set ``trex``), the reference answer."""
    messages = contract.training_messages(sample["problem"], reference_answer(sample))
    return {"schema": SCHEMA, "id": sample["id"], "messages": messages, "provenance": sample["provenance"]}


def problem_of(record: dict[str, Any]) -> str:
    """The problem text of a CPT or SFT record."""
    if "messages" in record:
        user = str(next(m["content"] for m in record["messages"] if m["role"] == "user"))
        return contract.question_of(user)
    return str(record["text"]).split(CPT_SPLIT, 1)[0]


def answer_of(record: dict[str, Any]) -> str:
    """The reference answer of a CPT or SFT record."""
    if "messages" in record:
        return str(next(m["content"] for m in record["messages"] if m["role"] == "assistant"))
    return FORMULATION_HEADER + str(record["text"]).split(CPT_SPLIT, 1)[1].rstrip("\n")


# --- shards ------------------------------------------------------------------------------------------
def _new_counts() -> dict[str, Any]:
    return {"planned": 0, "generated": 0, "solved": 0, "verified": 0, "accepted": 0, "duplicates": 0,
            "rejected": {}, "by_family": {}}


def _count(counts: dict[str, Any], out: Outcome) -> None:
    counts["planned"] += 1
    for k in ("generated", "solved", "verified"):
        if k in out.reached:
            counts[k] += 1
    fam = counts["by_family"].setdefault(out.plan.family, {"accepted": 0, "rejected": 0})
    if out.outcome == "accepted":
        counts["accepted"] += 1
        fam["accepted"] += 1
    else:
        if out.outcome.startswith("dedup."):
            counts["duplicates"] += 1
        counts["rejected"][out.outcome] = counts["rejected"].get(out.outcome, 0) + 1
        fam["rejected"] += 1


def _new_deduper(cfg: ORDataConfig) -> Any:
    from trex.ordata.dedup import Deduper

    return Deduper(cfg.dedup)


@dataclass
class ShardReport:
    """What :func:`run_shard` did."""

    folder: Path
    manifest: dict[str, Any]
    skipped: bool
    resumed_from: int
    stage_seconds: dict[str, float]


def run_shard(cfg: ORDataConfig, shard_index: int, num_shards: int, out_dir: str | Path,
              exporter: Any = None, show_progress: bool = True) -> ShardReport:
    """Generate one shard (skip when its verified manifest exists, resume from its progress file otherwise)."""
    from trex.sandbox import require_isolation
    from trex.telemetry.progress import Progress

    isolation = require_isolation(cfg.sandbox.min_isolation)
    if exporter is not None:
        exporter.metric("trex_ordata_sandbox_isolation", mode=isolation).set(1)
    folder = Path(out_dir) / shard_dir_name(shard_index, num_shards)
    chash = config_hash(cfg)
    done = manifest_complete(folder, chash)
    if done is not None:
        return ShardReport(folder, done, True, 0, {})
    positions = list(shard_positions(cfg.count, shard_index, num_shards))
    per_file = cfg.shards.samples_per_file
    deduper = _new_deduper(cfg)
    state: dict[str, Any] | None = _load_progress(folder, chash)
    if state is None:
        remove_unlisted(folder, set())
        state = {"next": 0, "parts": [], "counts": _new_counts()}
    else:
        remove_unlisted(folder, {e["name"] for p in state["parts"] for e in p})
        for part in state["parts"]:
            rec_file = folder / part[0]["name"]
            for rec in read_jsonl(rec_file):
                deduper.check_and_add(rec["id"], rec["provenance"]["ir_hash"], problem_of(rec))
    resumed_from = int(state["next"])
    counts: dict[str, Any] = state["counts"]
    timer = StageTimer()
    buffer: list[dict[str, Any]] = []
    folder.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    with Progress(f"ordata shard {shard_index}/{num_shards}", len(positions), stream=None,
                  force_tty=None if show_progress else False) as bar:
        bar.update(resumed_from)
        for pos in range(resumed_from, len(positions)):
            out = process(plan_instance(cfg, positions[pos]), cfg, timer)
            sample = out.sample
            if sample is not None:
                with timer("dedup"):
                    dup = deduper.check_and_add(sample["id"], out.ir_hash, sample["problem"])
                if dup is not None:
                    kind, other = dup
                    out = Outcome(out.plan, _dedup_reason(kind), detail=f"duplicate of {other}", ir_hash=out.ir_hash,
                                  reached=out.reached)
                else:
                    buffer.append(sample)
            _count(counts, out)
            _export(exporter, out, timer, (pos + 1) / max(len(positions), 1))
            if exporter is not None:
                rate = (counts["accepted"]) / max(time.perf_counter() - t_start, 1e-9)
                exporter.metric("trex_ordata_accepted_per_second").set(rate)
            bar.update(1, accepted=counts["accepted"])
            if len(buffer) >= per_file:
                with timer("write"):
                    state["parts"].append(_write_parts(cfg, folder, len(state["parts"]), buffer))
                    buffer = []
                    state.update(next=pos + 1, counts=counts)
                    atomic_write_json(folder / PROGRESS, {"schema": SCHEMA, "config_hash": chash, **state})
        with timer("write"):
            if buffer:
                state["parts"].append(_write_parts(cfg, folder, len(state["parts"]), buffer))
            manifest = {
                "schema": SCHEMA, "complete": True, "config_hash": chash, "shard_index": shard_index,
                "num_shards": num_shards, "count": cfg.count, "seed": cfg.seed, "samples_per_file": per_file,
                "outputs": list(cfg.outputs), "prompt_contract": PROMPT_RECORD, "counts": counts,
                "files": [e for p in state["parts"] for e in p],
                "config": cfg.model_dump(mode="json", by_alias=True),
            }
            atomic_write_json(folder / MANIFEST, manifest)
            (folder / PROGRESS).unlink(missing_ok=True)
    seconds = dict(timer.seconds)
    seconds["total"] = time.perf_counter() - t_start
    if exporter is not None:
        exporter.metric("trex_ordata_shards_done").inc()
    return ShardReport(folder, manifest, False, resumed_from, seconds)


def _dedup_reason(kind: str) -> str:
    return kind if "." in kind else f"dedup.{kind}"


def _write_parts(cfg: ORDataConfig, folder: Path, part: int, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    entries = []
    if "sft" in cfg.outputs:
        entries.append({**write_part(folder / f"sft-{part:05d}.jsonl", [sft_record(s) for s in samples]),
                        "rendering": "sft"})
    if "cpt" in cfg.outputs:
        entries.append({**write_part(folder / f"cpt-{part:05d}.jsonl", [cpt_record(s) for s in samples]),
                        "rendering": "cpt"})
    return entries


def _load_progress(folder: Path, chash: str) -> dict[str, Any] | None:
    st = read_json(folder / PROGRESS)
    if st is None or st.get("schema") != SCHEMA or st.get("config_hash") != chash:
        return None
    if not files_verified(folder, [e for p in st.get("parts", []) for e in p]):
        return None
    return {"next": int(st["next"]), "parts": st["parts"], "counts": st["counts"]}


def _export(exporter: Any, out: Outcome, timer: StageTimer, ratio: float) -> None:
    if exporter is None:
        return
    exporter.metric("trex_ordata_samples_total", family=out.plan.family, outcome=out.outcome).inc()
    if out.attempts:
        exporter.metric("trex_ordata_sampling_attempts_total", family=out.plan.family).inc(out.attempts)
    exporter.metric("trex_ordata_progress_ratio").set(ratio)
    for stage, secs in list(timer.seconds.items()):
        done = timer.exported.get(stage, 0.0)
        if secs > done:
            exporter.metric("trex_ordata_stage_seconds_total", stage=stage).inc(secs - done)
            timer.exported[stage] = secs


# --- merge ------------------------------------------------------------------------------------------
def merge(out_dir: str | Path, exporter: Any = None) -> dict[str, Any]:
    """Verify every shard, dedup across shards (exact + near) in instance order, write ``merged/``."""
    from trex.ordata.config import DedupConfig
    from trex.ordata.dedup import Deduper

    root = Path(out_dir)
    shard_dirs = sorted(p for p in root.glob("shard-*-of-*") if p.is_dir())
    if not shard_dirs:
        raise ValueError(f"{root}: no shard folders (shard-*-of-*)")
    manifests = []
    for d in shard_dirs:
        m = manifest_complete(d)
        if m is None:
            raise ValueError(f"{d.name}: shard is not finished or its files do not match the manifest")
        manifests.append((d, m))
    nums = {m["num_shards"] for _, m in manifests}
    hashes = {m["config_hash"] for _, m in manifests}
    if len(nums) != 1 or len(hashes) != 1:
        raise ValueError("shards come from different runs (num_shards or config differ)")
    num = nums.pop()
    have = sorted(m["shard_index"] for _, m in manifests)
    if have != list(range(num)):
        missing = sorted(set(range(num)) - set(have))
        raise ValueError(f"missing shards: {missing}")
    cfg_json = manifests[0][1]["config"]
    dcfg = DedupConfig.model_validate(cfg_json.get("dedup", {}), by_alias=True, by_name=False)
    renderings = [r for r in ("sft", "cpt") if r in manifests[0][1]["outputs"]]
    records: dict[str, dict[str, dict[str, Any]]] = {r: {} for r in renderings}
    for d, m in manifests:
        for e in m["files"]:
            for rec in read_jsonl(d / e["name"]):
                records[e["rendering"]][rec["id"]] = rec
    primary = records[renderings[0]]
    order = sorted(primary, key=lambda i: primary[i]["provenance"]["index"])
    deduper = Deduper(dcfg)
    kept: list[str] = []
    cross_dups: Counter[str] = Counter()
    for sid in order:
        rec = primary[sid]
        dup = deduper.check_and_add(sid, rec["provenance"]["ir_hash"], problem_of(rec))
        if dup is None:
            kept.append(sid)
        else:
            cross_dups[_dedup_reason(dup[0])] += 1
    per_file = int(manifests[0][1]["samples_per_file"])
    out = root / "merged"
    remove_unlisted(out, set())
    files = []
    heldout = [sid for sid in kept if in_heldout(sid, float(cfg_json.get("heldoutFraction", 0.0)))]
    if heldout:
        held = set(heldout)
        kept = [sid for sid in kept if sid not in held]
        # Outside merged/ so that training on merged/ can never read it.
        entry = write_part(root / HELDOUT_DIR / HELDOUT_FILE, [heldout_record(primary[i]) for i in heldout])
        files.append({**entry, "name": f"../{HELDOUT_DIR}/{HELDOUT_FILE}", "rendering": "heldout"})
    for part, start in enumerate(range(0, len(kept), per_file)):
        ids = kept[start:start + per_file]
        for r in renderings:
            files.append({**write_part(out / f"{r}-{part:05d}.jsonl", [records[r][i] for i in ids]), "rendering": r})
        # GRPO's prompts: question and solver-verified truth per training sample (the held-out file's layout),
        # beside merged/ so that a folder of training records holds one rendering.
        entry = write_part(root / PROMPTS / f"{PROMPTS}-{part:05d}.jsonl", [heldout_record(primary[i]) for i in ids])
        files.append({**entry, "name": f"../{PROMPTS}/{PROMPTS}-{part:05d}.jsonl", "rendering": PROMPTS})
    totals = _new_counts()
    for _, m in manifests:
        c = m["counts"]
        for k in ("planned", "generated", "solved", "verified", "accepted", "duplicates"):
            totals[k] += c[k]
        for k, v in c["rejected"].items():
            totals["rejected"][k] = totals["rejected"].get(k, 0) + v
        for fam, fv in c["by_family"].items():
            tf = totals["by_family"].setdefault(fam, {"accepted": 0, "rejected": 0})
            tf["accepted"] += fv["accepted"]
            tf["rejected"] += fv["rejected"]
    manifest = {
        "schema": SCHEMA, "complete": True, "config_hash": hashes.pop(), "num_shards": num,
        "samples": len(kept), "heldout": len(heldout), "prompt_contract": PROMPT_RECORD,
        "cross_shard_duplicates": dict(cross_dups), "counts": totals,
        "files": files,
        "shards": [{"name": d.name, "manifest_sha256": _sha(d / MANIFEST)} for d, _ in manifests],
    }
    atomic_write_json(out / MANIFEST, manifest)
    return manifest


HELDOUT_DIR = "heldout"
HELDOUT_FILE = "heldout.jsonl"
PROMPTS = "prompts"
"""Folder and rendering a GRPO TrainJob reads: {id, question, answer, family, reference} per training sample."""


def in_heldout(sample_id: str, fraction: float) -> bool:
    """Stable held-out membership: the id's sha256 read as a number in [0, 1) falls below ``fraction``."""
    if fraction <= 0:
        return False
    h = int.from_bytes(hashlib.sha256(sample_id.encode()).digest()[:8], "big")
    return h / 2**64 < fraction


def heldout_record(record: dict[str, Any]) -> dict[str, Any]:
    """A sample in the evaluation harness's `ordata` format: id, question, answer (optimal objective), family and
    the reference answer (what a correct model writes; the oracle check and length budgets read it)."""
    prov = record["provenance"]
    return {"id": record["id"], "question": problem_of(record), "answer": prov["objective"], "family": prov["family"],
            "reference": answer_of(record)}


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()
