"""`trex demo`: the quickstart end to end, on a local stand-in cluster or on a real one.

Stage 1: validate every example manifest offline and show that every invalid one is rejected.
Stage 2: start the local API server on loopback (`trex_operator.local.apiserver`), write a kubeconfig
for it, install the trex chart into it with helm, run the operator in-process against it, a local
kubelet that runs the pods as processes and a local Prometheus; apply examples/quickstart/ (ORDataJob
-> TrainJob -> EvalJob, and a KernelTuneJob), watch a `kubectl get`-style table until every job has
finished and query every Grafana dashboard panel. Only with ``--cluster`` is the quickstart applied to
the kubeconfig's current context instead (named, with its server, before anything is applied); a
KUBECONFIG in the environment is otherwise never used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from trex.vllm_cpu import NATIVE_ROPE

from trex_operator.api import API_VERSION, GROUP, KIND_INFO, VERSION
from trex_operator.local.table import all_terminal, job_row, plain_table, rich_table

APPLY_ORDER = ("ORDataJob", "KernelTuneJob", "TrainJob", "EvalJob")
MARKER = ".trex-demo"
INSTALL_HINT = "install the demo extra: pip install -e '.[demo]' (or: pip install kmock)"


def _examples_root() -> Path:
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "examples").is_dir() and (parent / "pyproject.toml").exists():
            return parent / "examples"
    return Path.cwd() / "examples"


def run_manifest_stage(examples: Path) -> bool:
    """Validate examples/ (must pass) and examples/invalid/ (must all fail); print `kubectl get` tables."""
    from trex_operator.validate import format_tables, get_rows, iter_documents

    valid_files = sorted([*examples.glob("*.yaml"), *examples.glob("quickstart/*.yaml")])
    invalid_files = sorted(examples.glob("invalid/*.yaml"))
    good = list(iter_documents([str(p) for p in valid_files]))
    bad = list(iter_documents([str(p) for p in invalid_files]))
    print(f"== trex demo: validated {len(good)} example manifests offline")
    from trex_operator.budgets import budget_problems

    problems = [p for c in good for p in c.problems] + budget_problems(good)
    for p in problems:
        print("  unexpected problem:", p.line())
    print(format_tables(get_rows(good)))
    print(f"\n== {len(bad)} manifests in examples/invalid/ are rejected, one line per problem:")
    accepted = [c.file for c in bad if not c.problems]
    for c in bad:
        for p in c.problems:
            print("  " + p.line())
    for f in accepted:
        print(f"  NOT rejected: {f}")
    return not problems and not accepted


# ---- the quickstart manifests ------------------------------------------------------------------


def quick_overrides(doc: dict[str, Any]) -> dict[str, Any]:
    """A smaller copy of a quickstart job for CI (``--quick``): fewer samples, steps, items and trials (the
    length budgets stay, so the oracle check still holds)."""
    out = copy.deepcopy(doc)
    spec = out.get("spec") or {}
    kind = out.get("kind")
    if kind == "ORDataJob":
        spec["ordata"]["count"] = min(int(spec["ordata"].get("count", 32)), 32)
    elif kind == "TrainJob":
        t = spec["trainer"]
        t["maxSteps"] = min(int(t.get("maxSteps", 8)), 8)
        t.setdefault("checkpoint", {})["intervalSteps"] = 4
        t.setdefault("optimizer", {}).setdefault("schedule", {})["warmupSteps"] = 2
    elif kind == "EvalJob":
        ev = spec["evaluation"]
        for b in ev.get("benchmarks") or []:  # fewer items, same budget: a correct answer still fits
            b["limit"] = min(int(b.get("limit", 1)), 1)
    elif kind == "KernelTuneJob":
        k = spec["kernels"]
        k["budget"] = {"trials": 12, "seconds": 40}
    return out


ROLLOUT_ENGINES = ("inprocess", "vllm")
"""Where the quickstart's GRPO and OPD sample and its EvalJob generates (``trex demo --rollouts``)."""
VLLM_CPU_IMAGE = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0"
"""vLLM's CPU release image (entrypoint ``vllm serve``); the local kubelet runs it from the project's .venv-vllm
(vllm-cpu 0.32.0, scripts/vllm-venv.sh)."""
VLLM_CPU_ARGS = ["--enforce-eager", "--max-model-len", "2048", "--kv-cache-memory-bytes", str(256 << 20)]
"""A CPU server of the quickstart's model: no graph capture (its start is what counts here), contexts of the
model's 2048 positions, a 256 MiB KV cache (MLA's 576-value latent per token and layer: 2048 x 2 layers x 2.3 kB
is 9.4 MB a sequence) instead of vLLM's default share of host memory."""
VLLM_MODEL = {"kvLoraRank": 512, "qkRopeHeadDim": 64, "swigluLimit": 0}
"""The quickstart model's overrides under ``--rollouts vllm``: vLLM's CPU MLA kernel serves only kvLoraRank +
qkRopeHeadDim = 576, and DeepseekV3's layout has no SwiGLU clamp (vLLM skips the MTP block, which still trains).
Every quickstart TrainJob takes them, since GRPO and OPD start from the SFT export; the in-process demo keeps the
smaller latent (32 + 8), which trains faster."""
VLLM_SERVER_CPU = "500m"
"""CPU a quickstart server reserves on the local node: it is busy only while a rollout or an evaluation runs,
and on a 2-core machine a whole core each would leave the trainer that feeds it no core to start on."""


def rollout_overrides(doc: dict[str, Any], engine: str) -> dict[str, Any]:
    """A copy of a quickstart job that samples on ``engine``. ``vllm``: GRPO and OPD TrainJobs get
    ``spec.rollout.server`` (a CPU vLLM Deployment the operator renders, fed a weight push every step) and the
    EvalJob serves quickstart-train's export with a vLLM ``server`` and evaluates through it (model kind
    ``openai``, same sampling); every TrainJob's model takes the shape vLLM's CPU build serves (VLLM_MODEL).
    ``inprocess``: the manifest as written."""
    if engine not in ROLLOUT_ENGINES:
        raise ValueError(f"--rollouts {engine!r}: expected one of {', '.join(ROLLOUT_ENGINES)}")
    out = copy.deepcopy(doc)
    if engine == "inprocess":
        return out
    spec = out.get("spec") or {}
    kind = out.get("kind")
    resources = {"requests": {"cpu": VLLM_SERVER_CPU}}
    if kind == "TrainJob":
        model = spec["trainer"]["model"]
        model["overrides"] = {**(model.get("overrides") or {}), **VLLM_MODEL}
    if kind == "TrainJob" and (spec.get("trainer") or {}).get("mode") in ("grpo", "opd"):
        spec["rollout"] = {"server": {"image": VLLM_CPU_IMAGE, "args": list(VLLM_CPU_ARGS), "resources": resources}}
    elif kind == "EvalJob" and spec.get("modelFrom"):
        name = str(spec["modelFrom"]["name"])
        model = spec["evaluation"]["model"]
        spec["evaluation"]["model"] = {"kind": "openai", "name": name,
                                       **({"sampling": model["sampling"]} if "sampling" in model else {})}
        # the served name the eval requests use; RoPE in PyTorch (vllm-cpu 0.32's kernel misrotates MLA's query,
        # trex.vllm_cpu.NATIVE_ROPE); the operator appends the export's folder, here the value of --model (vllm serve
        # takes the model first or as --model, never as a trailing positional)
        spec["server"] = {"image": VLLM_CPU_IMAGE, "port": 8000, "resources": resources, "args": [
            "--served-model-name", name, "--host", "0.0.0.0", "--port", "8000", "--dtype", "float32",
            *VLLM_CPU_ARGS, "--compilation-config", NATIVE_ROPE, "--model"]}
    return out


def load_quickstart(examples: Path, quick: bool, rollouts: str = "inprocess") -> list[dict[str, Any]]:
    """The quickstart jobs in apply order, each validated (ValueError naming every problem)."""
    from trex_operator.validate import check_document, load_documents

    docs: list[dict[str, Any]] = []
    problems: list[str] = []
    for f in sorted((examples / "quickstart").glob("*.yaml")):
        for i, doc in enumerate(load_documents(f.read_text(encoding="utf-8"))):
            doc = rollout_overrides(quick_overrides(doc) if quick else doc, rollouts)
            checked = check_document(str(f), i, doc)
            problems += [p.line() for p in checked.problems]
            docs.append(doc)
    if problems:
        raise ValueError("invalid quickstart manifests:\n  " + "\n  ".join(problems))
    if not docs:
        raise ValueError(f"no manifests in {examples / 'quickstart'}")
    rank = {k: i for i, k in enumerate(APPLY_ORDER)}
    return sorted(docs, key=lambda d: rank.get(str(d.get("kind")), len(rank)))


def prepare_work_dir(work_dir: Path) -> None:
    """Start from an empty work dir (old checkpoints or reports would be resumed); only a previous demo's
    folder (with its marker file) or an empty one is cleared."""
    if work_dir.exists() and any(work_dir.iterdir()):
        if not (work_dir / MARKER).exists():
            raise ValueError(f"--work-dir {work_dir} is not empty and not a previous demo's folder; choose another")
        shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / MARKER).write_text("trex demo work dir (cleared by the next run)\n", encoding="utf-8")


def job_key(doc: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name) of a job manifest."""
    return str(doc["kind"]), str(doc["metadata"]["name"])


OUTPUT_FIELDS = {"ORDataJob": ("ordata", ("output",), "output"), "TrainJob": ("trainer", ("checkpoint", "dir"), "checkpoints"),
                 "EvalJob": ("evaluation", ("output",), "output"), "KernelTuneJob": ("kernels", ("output",), "output")}


def local_output(doc: Mapping[str, Any], work_dir: Path) -> Path | None:
    """Where the local kubelet put a job's main output (corpus, checkpoints, report): its output path,
    under its volume's mount, mapped to the hostPath folder; None when that is not on a hostPath."""
    from trex_operator.children import DEFAULT_MOUNTS
    from trex_operator.local.kubelet import host_path_dir

    kind = str(doc.get("kind"))
    if kind not in OUTPUT_FIELDS:
        return None
    section, keys, volume = OUTPUT_FIELDS[kind]
    spec = doc.get("spec") or {}
    value: Any = spec.get(section) or {}
    for k in keys:
        value = value.get(k) if isinstance(value, dict) else None
    storage = (spec.get("volumes") or {}).get(volume)
    if not isinstance(value, str) or not isinstance(storage, dict) or not storage.get("hostPath"):
        return None
    mount = str(storage.get("mountPath") or DEFAULT_MOUNTS[volume]).rstrip("/")
    if value.startswith("/"):
        if not value.startswith(mount + "/"):
            return None
        value = value[len(mount) + 1:]
    return host_path_dir(work_dir, str(storage["hostPath"])) / str(value)


# ---- watching ----------------------------------------------------------------------------------


def watch(fetch: Callable[[], list[dict[str, Any]]], timeout_s: float, tty: bool,
          plain_every_s: float = 5.0) -> list[dict[str, Any]]:
    """Refresh the job table each second until every job has finished or ``timeout_s`` passed; returns
    the last objects. A rich Live table on a TTY; otherwise a plain table whenever a phase changes and
    every ``plain_every_s`` seconds."""
    end = time.monotonic() + timeout_s
    objs: list[dict[str, Any]] = []

    def rows() -> list[tuple[str, ...]]:
        now = dt.datetime.now(dt.UTC)
        return [job_row(o, now) for o in objs]

    if tty:
        from rich.live import Live

        with Live(rich_table([], "trex jobs"), refresh_per_second=4, transient=False) as live:
            while time.monotonic() < end:
                objs = fetch()
                live.update(rich_table(rows(), "trex jobs"))
                if all_terminal(objs):
                    break
                time.sleep(1.0)
        return objs
    last_phases: list[str] = []
    last_print = 0.0
    while time.monotonic() < end:
        objs = fetch()
        current = rows()
        phases = [r[2] for r in current]
        done = all_terminal(objs)
        if phases != last_phases or time.monotonic() - last_print >= plain_every_s or done:
            print(f"-- {dt.datetime.now(dt.UTC).strftime('%H:%M:%S')}\n{plain_table(current)}", flush=True)
            last_print, last_phases = time.monotonic(), phases
        if done:
            break
        time.sleep(1.0)
    return objs


def summarise(objs: list[dict[str, Any]], expected: list[tuple[str, str]]) -> tuple[bool, list[str]]:
    """Summary lines (each job's phase and key results) and whether every expected job Succeeded."""
    by_key = {(str(o.get("kind")), str((o.get("metadata") or {}).get("name"))): o for o in objs}
    lines: list[str] = []
    ok = True
    for kind, name in expected:
        o = by_key.get((kind, name))
        status = (o or {}).get("status") or {}
        phase = status.get("phase") or "missing"
        ok = ok and phase == "Succeeded"
        lines.append(f"{kind}/{name}: {phase}" + (f" ({status.get('reason')}: {status.get('message')})"
                                                    if phase != "Succeeded" and status.get("reason") else ""))
        results = status.get("results") or {}
        progress = status.get("progress") or {}
        if kind == "ORDataJob":
            keys = ("generated", "solved", "verified", "accepted", "duplicates", "rejected")
            lines.append("  " + ", ".join(f"{k}={results[k]}" for k in keys if k in results))
        elif kind == "TrainJob":
            keys = ("step", "maxSteps", "loss", "mfu", "tokensPerSecond", "lastCheckpointStep")
            shown = {k: results.get(k, progress.get(k)) for k in keys if k in results or k in progress}
            lines.append("  " + ", ".join(f"{k}={v}" for k, v in shown.items()))
            kern = results.get("kernels")
            if isinstance(kern, dict):  # tuned kernels the run used (kernelsFrom), and those it refused
                lines.append(f"  tuned kernels active: {', '.join(kern.get('active') or []) or 'none'}"
                             + (f"; refused: {', '.join(kern.get('refused') or {})}" if kern.get("refused") else ""))
                base = kern.get("baseline")
                if isinstance(base, dict):  # the same pod, one micro-batch, tuned then untuned
                    lines.append(f"  tokens/s with the tuned kernels {base.get('tunedTokensPerSecond')} vs untuned "
                                 f"{base.get('untunedTokensPerSecond')} (x{base.get('speedup')}, forward and "
                                 "backward of one micro-batch in the same pod)")
            rl = results.get("grpo")
            if isinstance(rl, dict):
                lines.append(f"  GRPO reward {rl.get('rewardMeanFirst')} -> {rl.get('rewardMeanLast')} over "
                             f"{rl.get('responses')} responses, verifier outcomes {json.dumps(rl.get('outcomes'))}; "
                             f"time: rollouts {rl.get('rolloutSeconds')} s, verification {rl.get('verifySeconds')} s, "
                             f"loss {rl.get('trainSeconds')} s")
        elif kind == "EvalJob":
            lines.append(f"  passAt1={results.get('passAt1')} per benchmark: "
                         + json.dumps(results.get("benchmarks") or {}, sort_keys=True)[:300])
            source = by_key.get(("TrainJob", str(((o or {}).get("spec") or {}).get("modelFrom", {}).get("name"))))
            if source is not None:
                t = (source.get("spec") or {}).get("trainer") or {}
                lines.append(f"  (the {(t.get('model') or {}).get('preset', 'tiny')} model after {t.get('maxSteps')} "
                             "SFT steps on a CPU: a score near 0 means too small a model and too short a run, "
                             "not a broken loop; the oracle check below scores the harness and budget)")
        elif kind == "KernelTuneJob":
            lines.append(f"  geomeanSpeedup={results.get('geomeanSpeedup')} (over eager), "
                         f"geomeanSpeedupCompile={results.get('geomeanSpeedupCompile')} (over torch.compile) kernels="
                         + ", ".join(sorted((results.get("kernels") or {}).keys())))
            lines += [f"  {w}" for w in speedup_warnings(results)]
    return ok, lines


def speedup_warnings(results: Mapping[str, Any]) -> list[str]:
    """What a KernelTuneJob's figures do not show by themselves: a geomean below 1.0 means the tuned kernels
    are slower than the baseline (the job succeeded; the kernels did not)."""
    out = []
    for key, base in (("geomeanSpeedup", "eager PyTorch"), ("geomeanSpeedupCompile", "torch.compile")):
        g = results.get(key)
        if isinstance(g, int | float) and g < 1.0:
            out.append(f"WARNING: {key}={g} < 1.0: the tuned kernels are slower than {base} on this host "
                       "(the quick tune runs 12 trials in 40 s; the job ran, the speedup is not there)")
    return out


def oracle_lines(docs: list[dict[str, Any]], work_dir: Path) -> list[str]:
    """The oracle check after a local run: the EvalJob's held-out items answered with their ORData reference
    answers, cut at its maxTokens with the trained tokenizer, through the harness (100 % when the budget fits)."""
    from trex.evaluation.oracle import oracle_pass_at_1

    by_kind = {str(d.get("kind")): d for d in docs}
    ev, tr, od = by_kind.get("EvalJob"), by_kind.get("TrainJob"), by_kind.get("ORDataJob")
    if ev is None or tr is None or od is None:
        return []
    data, ckpt = local_output(od, work_dir), local_output(tr, work_dir)
    evaluation = ev["spec"]["evaluation"]
    budget = int((evaluation["model"].get("sampling") or {}).get("maxTokens", 4096))
    limit = next((b.get("limit") for b in evaluation.get("benchmarks") or [] if b.get("name") == "ordata"), None)
    if data is None or ckpt is None or not (ckpt / "hf" / "tokenizer.json").is_file():
        return []
    try:
        score, n = oracle_pass_at_1(data / "heldout" / "heldout.jsonl", ckpt / "hf" / "tokenizer.json", budget,
                                    work_dir / "oracle-check", limit)
    except (OSError, ValueError) as exc:
        return [f"\n== oracle check failed: {exc}"]
    verdict = "the budget holds a correct answer" if score == 1.0 else "the budget cuts correct answers"
    return [f"\n== oracle check: reference answers cut at maxTokens={budget} score Pass@1 = {100 * score:.0f} % "
            f"on {n} held-out items ({verdict})"]


# ---- local stand-in cluster --------------------------------------------------------------------


class KubeletThread:
    """The local kubelet on its own event loop and thread."""

    def __init__(self, url: str, work_dir: Path, on_targets: Callable[[list[tuple[str, dict[str, str]]]], None],
                 vllm_python: str | None = None) -> None:
        self.url = url
        self.vllm_python = vllm_python
        self.work_dir = work_dir
        self.on_targets = on_targets
        self.kubelet: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="local-kubelet", daemon=True)

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        from trex_operator.kube import Connection, Kube
        from trex_operator.local.kubelet import LocalKubelet

        kube = Kube(Connection(server=self.url), retries=3, backoff_s=0.1, user_agent="trex-local-kubelet")
        self.kubelet = LocalKubelet(kube, self.work_dir, on_targets=self.on_targets, vllm_python=self.vllm_python)
        self._loop = asyncio.get_running_loop()
        self._ready.set()
        try:
            await self.kubelet.run()
        finally:
            await kube.close()

    def start(self) -> None:
        """Start polling."""
        self._thread.start()
        self._ready.wait(10)

    def stop(self) -> None:
        """Stop polling and kill every pod process (once the kubelet is up, so none starts afterwards)."""
        self._ready.wait(10)
        if self._loop is not None and self.kubelet is not None:
            self._loop.call_soon_threadsafe(self.kubelet.stop)
        self._thread.join(60)


def _http_json(method: str, url: str, body: Any = None) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        out: dict[str, Any] = json.loads(resp.read().decode() or "{}")
        return out


def scale_chart_operator(url: str, namespace: str) -> list[str]:
    """Scale the chart's operator Deployment to 0 replicas (``kubectl scale``): the demo runs the operator in-process,
    and the local kubelet runs Deployments' pods, so the chart's would be a second operator. Returns the names."""
    from trex_operator.kube import resource_path

    selector = urllib.parse.quote("app.kubernetes.io/component=operator,app.kubernetes.io/managed-by=Helm")
    items = _http_json("GET", url + resource_path("apps/v1", "Deployment", namespace) + f"?labelSelector={selector}")
    names = [str(d["metadata"]["name"]) for d in items.get("items") or []]
    for name in names:
        req = urllib.request.Request(url + resource_path("apps/v1", "Deployment", namespace, name),
                                     data=json.dumps({"spec": {"replicas": 0}}).encode(), method="PATCH",
                                     headers={"Content-Type": "application/merge-patch+json"})
        with urllib.request.urlopen(req, timeout=10):
            pass
    return [f"Deployment/{n}" for n in names]


def write_kubeconfig(path: Path, server: str, namespace: str = "default") -> None:
    """A kubeconfig with one context, ``trex-demo``, for the local API server (no credentials)."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "trex-demo", "preferences": {},
        "clusters": [{"name": "trex-demo", "cluster": {"server": server}}],
        "users": [{"name": "trex-demo", "user": {}}],
        "contexts": [{"name": "trex-demo", "context": {"cluster": "trex-demo", "user": "trex-demo",
                                                       "namespace": namespace}}]}, sort_keys=False), encoding="utf-8")


def find_tool(name: str) -> str | None:
    """A CLI (helm, kubectl) on PATH or next to this interpreter (the virtualenv's bin/)."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which(name)


def install_chart(chart: Path, kubeconfig: Path, namespace: str, log: Path, values: Mapping[str, str]) -> str | None:
    """``helm install trex <chart> --set k=v...`` into the local API server; None on success, else why not."""
    helm = find_tool("helm")
    if helm is None:
        return "helm not found"
    if not (chart / "Chart.yaml").is_file():
        return f"no chart at {chart}"
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HELM_CACHE_HOME": str(log.parent / "helm" / "cache"),
           "HELM_CONFIG_HOME": str(log.parent / "helm" / "config"), "HELM_DATA_HOME": str(log.parent / "helm" / "data")}
    sets = [a for k, v in values.items() for a in ("--set", f"{k}={v}")]
    res = subprocess.run([helm, "install", "trex", str(chart), "--namespace", namespace, *sets], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    log.write_text(res.stdout + res.stderr, encoding="utf-8")
    return None if res.returncode == 0 else f"helm install failed (exit {res.returncode}): {res.stderr.strip()[-300:]}"


def check_dashboard(prom: Any, dashboard: Path, since: float, out: Path, settle_s: float = 15.0) -> bool:
    """Run every Grafana panel's queries over the demo's time range (as the dashboard would); print and
    save which return data and every query that failed. Panels still empty are retried for ``settle_s``
    (the last job's results reach Prometheus a scrape after it finished). True when every panel has data
    and no query failed."""
    from trex_operator.local.prometheus import panel_queries

    queries = panel_queries(json.loads(dashboard.read_text(encoding="utf-8")), time.time() - since)
    errors: dict[str, str] = {}

    def series(title: str, exprs: list[str]) -> int:
        n = 0
        for expr in exprs:
            try:
                n += len(prom.query_range(expr, since, time.time(), step_s=2.0))
            except (OSError, RuntimeError, ValueError) as exc:
                errors[title] = f"{expr}: {exc}"
        return n

    counts = {title: series(title, exprs) for title, exprs in queries}
    end = time.monotonic() + settle_s
    while any(n == 0 for n in counts.values()) and time.monotonic() < end:
        time.sleep(1.0)
        for t, e in queries:
            if counts[t] == 0:
                errors.pop(t, None)
                counts[t] = series(t, e)
    out.write_text(json.dumps({"series": counts, "errors": errors}, indent=1), encoding="utf-8")
    empty = [t for t, n in counts.items() if n == 0]
    print(f"== Grafana dashboard: {len(counts) - len(empty)}/{len(counts)} panels return data"
          + (f"; no data: {', '.join(empty)}" if empty else ""))
    for title, why in errors.items():
        print(f"   query failed in panel {title!r}: {why}")
    return not empty and not errors


@contextlib.contextmanager
def _interrupt_on_signals() -> Iterator[None]:
    """While inside: SIGTERM (a closed terminal, a CI timeout) and SIGINT raise KeyboardInterrupt in the main
    thread, once, so the demo's cleanup stops the kubelet's pods, the operator, the API server and Prometheus
    (the default SIGTERM action would end the process with none of them stopped); further signals are ignored
    while that cleanup runs. The previous handlers come back on the way out."""
    import signal

    def interrupt(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_local(docs: list[dict[str, Any]], work_dir: Path, timeout_s: float, keep: bool, chart: Path | None = None,
              vllm_python: str | None = None) -> int:
    """Local API server (+ kubeconfig, + the chart through helm) + operator + local kubelet + Prometheus;
    apply ``docs``; watch; summarise; query the dashboard's panels."""
    try:
        from trex_operator.local.emulator import EmulatorThread, OperatorThread
    except ImportError as exc:
        print(f"trex demo: the local cluster needs kmock ({exc}); {INSTALL_HINT}", file=sys.stderr)
        return 2
    from trex_operator.kube import resource_path
    from trex_operator.local.prometheus import LocalPrometheus, find_binary, free_port

    prepare_work_dir(work_dir)
    import logging

    logging.basicConfig(level=logging.WARNING, filename=str(work_dir / "operator.log"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    namespace = "default"
    emulator = EmulatorThread(indexed=True, crds=False)
    operator: OperatorThread | None = None
    kubelet: KubeletThread | None = None
    prom: LocalPrometheus | None = None
    started = time.time()
    try:
        emulator.start()
        emulator.emulator.log_dir = work_dir / "logs"
        kubeconfig = work_dir / "kubeconfig"
        write_kubeconfig(kubeconfig, emulator.url, namespace)
        print(f"== local Kubernetes API server on {emulator.url}; kubectl and helm work against it:\n"
              f"   export KUBECONFIG={kubeconfig}")
        webhook_port = free_port()
        webhook = f"http://127.0.0.1:{webhook_port}"
        why_not = install_chart(chart, kubeconfig, namespace, work_dir / "helm-install.log",
                                {"webhook.url": webhook}) if chart else "no chart"
        if why_not is None:
            scaled = scale_chart_operator(emulator.url, namespace)
            print(f"== helm install trex {chart}: CRDs, RBAC, operator Deployment, validating webhook, dashboard"
                  f" ConfigMap (the operator runs in-process, its webhook on {webhook}; the chart's "
                  f"{', '.join(scaled) or 'operator'} scaled to 0 replicas, so the local kubelet does not start a"
                  " second one)")
        else:
            emulator.install_crds()
            print(f"== {why_not}; installed the trex CRDs directly (no admission webhook)")
        operator = OperatorThread(emulator.url, interval_s=1.0, webhook_port=webhook_port if why_not is None else -1)
        operator.start()
        print(f"== trex operator running in-process (reconcile every 1 s; metrics on 127.0.0.1:{operator.metrics_port})")
        binary = find_binary()
        if binary is None:
            print("== Prometheus: binary not found, skipping monitoring (Debian: apt-get install prometheus;"
                  " `make demo` installs it)")
        else:
            prom = LocalPrometheus(work_dir / "prometheus", binary,
                                   operator_target=f"127.0.0.1:{operator.metrics_port}" if operator.metrics_port else None)
            try:
                prom.start()
                print(f"== Prometheus on {prom.url} (scrape every 1 s; targets: running pods + the operator)")
            except RuntimeError as exc:
                print(f"== Prometheus did not start ({exc}); continuing without monitoring")
                prom.stop()
                prom = None
        kubelet = KubeletThread(emulator.url, work_dir, prom.set_targets if prom is not None else (lambda _t: None),
                                vllm_python)
        kubelet.start()
        print(f"== local kubelet: pods (of Jobs, Deployments and the jobs' gangs) run as processes on 127.x.y.z"
              f" loopback IPs, vLLM images from {vllm_python or 'no vLLM environment'}; logs in {work_dir / 'logs'}")
        for doc in docs:
            body = copy.deepcopy(doc)
            body.setdefault("metadata", {})["namespace"] = namespace
            _http_json("POST", emulator.url + resource_path(API_VERSION, body["kind"], namespace)
                       + "?fieldValidation=Strict", body)
            print(f"{body['kind'].lower()}.{GROUP}/{body['metadata']['name']} created")

        def fetch() -> list[dict[str, Any]]:
            out = []
            for doc in docs:
                kind, name = job_key(doc)
                try:
                    out.append(_http_json("GET", emulator.url + resource_path(API_VERSION, kind, namespace, name)))
                except (urllib.error.URLError, OSError, ValueError):
                    out.append({"kind": kind, "metadata": {"name": name}, "status": {}})
            return out

        objs = watch(fetch, timeout_s, tty=sys.stdout.isatty())
        if not all_terminal(objs):
            print(f"\n== timed out after {timeout_s:.0f}s")
        ok, lines = summarise(objs, [job_key(d) for d in docs])
        (work_dir / "jobs.json").write_text(json.dumps(objs, indent=1, sort_keys=True), encoding="utf-8")
        print("\n== summary")
        print("\n".join(lines))
        print("\n".join(oracle_lines(docs, work_dir)))
        print(f"\n== on disk (under {work_dir}):")
        for doc in docs:
            local = local_output(doc, work_dir)
            if local is not None:
                print(f"  {job_key(doc)[1]}: {local}")
        kube_dir = work_dir / "pods"
        print(f"  pod folders (config files, emptyDir volumes, termination messages): {kube_dir}")
        print(f"  pod logs: {work_dir / 'logs'}; operator log: {work_dir / 'operator.log'}")
        print(f"  final job objects: {work_dir / 'jobs.json'}")
        if prom is not None:
            query = "last_over_time(trex_train_mfu[1h])"
            try:
                result = prom.query(query)
                answer = ", ".join(f"{r['metric'].get('job_name', r['metric'].get('pod', '?'))}="
                                   f"{float(r['value'][1]):.4f}" for r in result) or "no samples"
                monitored = bool(result)
            except (OSError, RuntimeError, ValueError) as exc:
                answer, monitored = f"query failed: {exc}", False
            print(f"\n== Prometheus ({prom.url}): {query} -> {answer}")
            dashboard = (chart or Path("charts/trex")) / "dashboards" / "trex.json"
            if dashboard.is_file():
                monitored = check_dashboard(prom, dashboard, started, work_dir / "dashboard.json") and monitored
            if not monitored:
                print("== monitoring FAILED: a query failed or returned no data (see above)")
            ok = ok and monitored
        print(f"\n== demo {'OK: every job Succeeded' if ok else 'FAILED: not every job Succeeded or monitoring failed'}")
        if keep:
            print(f"--keep: the API server (export KUBECONFIG={kubeconfig}), the operator and Prometheus stay up;"
                  " press Ctrl-C to stop")
            if kubelet is not None:
                kubelet.stop()
                kubelet = None
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return 0 if ok else 1
    finally:
        # Each is stopped even when one before it fails: pods first (their processes), Prometheus last.
        stops = [kubelet.stop if kubelet is not None else None, operator.stop if operator is not None else None,
                 emulator.stop, prom.stop if prom is not None else None]
        for stop in stops:
            if stop is not None:
                try:
                    stop()
                except Exception as exc:  # report and go on to the next: nothing may be left running
                    print(f"trex demo: stopping {stop.__qualname__} failed: {exc}", file=sys.stderr)


# ---- a real cluster ----------------------------------------------------------------------------


def cluster_reachable() -> bool:
    """True when the kubeconfig loads and the API server answers within a few seconds."""
    try:
        k8s = _kubernetes()
        k8s.config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
        k8s.client.CustomObjectsApi().list_cluster_custom_object(GROUP, VERSION, KIND_INFO["TrainJob"].plural,
                                                                 limit=1, _request_timeout=5)
        return True
    except Exception as exc:  # an HTTP answer (403, 404: CRDs missing) still means "reachable"
        return isinstance(getattr(exc, "status", None), int) and getattr(exc, "status", 0) > 0


def current_context() -> tuple[str, str, str]:
    """(context name, API server URL, namespace) of the kubeconfig's current context."""
    k8s = _kubernetes()
    config_file = os.environ.get("KUBECONFIG") or None
    _contexts, active = k8s.config.list_kube_config_contexts(config_file=config_file)
    client = k8s.client.ApiClient(configuration=k8s.client.Configuration())
    k8s.config.load_kube_config(config_file=config_file, client_configuration=client.configuration)
    ctx = (active or {}).get("context") or {}
    return str((active or {}).get("name", "")), str(client.configuration.host), str(ctx.get("namespace") or "default")


def _kubernetes() -> Any:
    """The kubernetes client package (untyped), with its config and client modules loaded."""
    import kubernetes.client
    import kubernetes.config

    return kubernetes


def _replaceable(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a job a replace sets: spec, labels and annotations (not status or server fields)."""
    meta = obj.get("metadata") or {}
    return {"metadata": {"labels": dict(meta.get("labels") or {}), "annotations": {
        k: v for k, v in (meta.get("annotations") or {}).items() if not k.startswith(("kopf.", f"{GROUP}/"))}},
        "spec": obj.get("spec") or {}}


def run_cluster(docs: list[dict[str, Any]], namespace: str | None, timeout_s: float) -> int:
    """Create-or-replace the quickstart jobs in the current kubeconfig context and watch them (an existing
    job gets the merge patch that makes its spec, labels and annotations equal to the manifest's)."""
    from trex_operator.local.apimachinery import merge_diff

    k8s = _kubernetes()
    api_exception: type[Exception] = k8s.client.exceptions.ApiException
    k8s.config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
    context, server, default_ns = current_context()
    namespace = namespace or default_ns
    print(f"== --cluster: context {context!r}, server {server}, namespace {namespace}")
    api: Any = k8s.client.CustomObjectsApi()
    for doc in docs:
        kind, name = job_key(doc)
        plural = KIND_INFO[kind].plural
        body = copy.deepcopy(doc)
        body["metadata"]["namespace"] = namespace
        try:
            api.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
            print(f"{kind.lower()}.{GROUP}/{name} created")
        except api_exception as exc:
            if getattr(exc, "status", None) == 404:
                raise ValueError(f"the cluster does not serve {kind} ({GROUP}/{VERSION}): install the trex chart"
                                 " first (helm install trex charts/trex)") from None
            if getattr(exc, "status", None) != 409:
                raise
            current = api.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
            patch = merge_diff(_replaceable(current), _replaceable(body))
            version = (current.get("metadata") or {}).get("resourceVersion")
            if version:  # optimistic concurrency: the patch applies to exactly what was read
                patch.setdefault("metadata", {})["resourceVersion"] = version
            api.patch_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, patch)
            print(f"{kind.lower()}.{GROUP}/{name} replaced")

    def fetch() -> list[dict[str, Any]]:
        out = []
        for doc in docs:
            kind, name = job_key(doc)
            try:
                out.append(api.get_namespaced_custom_object(GROUP, VERSION, namespace, KIND_INFO[kind].plural, name))
            except api_exception:
                out.append({"kind": kind, "metadata": {"name": name}, "status": {}})
        return out

    objs = watch(fetch, timeout_s, tty=sys.stdout.isatty())
    ok, lines = summarise(objs, [job_key(d) for d in docs])
    print("\n== summary (namespace " + namespace + ")")
    print("\n".join(lines))
    return 0 if ok else 1


# ---- entry point -------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="trex demo", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--examples", type=Path, default=None, help="examples directory (default: the repository's)")
    ap.add_argument("--work-dir", type=Path, default=Path("demo-out"),
                    help="folder for volumes, pod logs and Prometheus data (default: ./demo-out; cleared first)")
    ap.add_argument("--quick", action="store_true", help="smaller budgets (CI): fewer samples, steps, items, trials")
    ap.add_argument("--rollouts", choices=ROLLOUT_ENGINES, default="inprocess",
                    help="where GRPO and OPD sample and the EvalJob generates: inprocess (in the job's pod, the "
                         "default) or vllm (vLLM server Deployments the operator runs, fed every step's weights; "
                         "needs .venv-vllm, or TREX_VLLM_VENV)")
    ap.add_argument("--keep", action="store_true",
                    help="after the run keep the API server, operator and Prometheus up until Ctrl-C (kubectl, helm)")
    ap.add_argument("--cluster", action="store_true",
                    help="apply to the kubeconfig's current context (must be reachable) instead of the local API server")
    ap.add_argument("-n", "--namespace", default=None, help="namespace on a real cluster (default: the context's)")
    ap.add_argument("--timeout", type=float, default=900.0, help="give up watching after this many seconds (900)")
    ap.add_argument("--validate-only", action="store_true", help="only stage 1: validate the examples offline")
    return ap


def main(argv: list[str]) -> int:
    """Run the demo; exit 0 when every stage succeeded."""
    args = _parser().parse_args(argv)
    if args.timeout <= 0:
        _parser().error("--timeout must be positive")
    examples = args.examples or _examples_root()
    try:
        examples = examples.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    if not examples.is_dir():
        print(f"trex demo: examples directory {examples} not found", file=sys.stderr)
        return 2
    ok = run_manifest_stage(examples)
    print("\n== offline validation of every example -> " + ("OK" if ok else "FAILED"))
    if not ok or args.validate_only:
        return 0 if ok else 1
    try:
        docs = load_quickstart(examples, args.quick, args.rollouts)
    except ValueError as exc:
        print(f"trex demo: {exc}", file=sys.stderr)
        return 1
    if args.cluster and not cluster_reachable():
        print("trex demo: --cluster: no reachable cluster in the kubeconfig", file=sys.stderr)
        return 2
    print(f"\n== applying {len(docs)} quickstart jobs ({'--quick budgets' if args.quick else 'full budgets'}, "
          f"rollouts {'on vLLM servers' if args.rollouts == 'vllm' else 'in process'})"
          f" to {'the kubeconfig current context' if args.cluster else 'the local API server'}")
    if args.cluster:
        try:
            return run_cluster(docs, args.namespace, args.timeout)
        except ValueError as exc:
            print(f"trex demo: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130
    vllm_venv = Path(os.environ.get("TREX_VLLM_VENV") or examples.resolve().parent / ".venv-vllm")
    if args.rollouts == "vllm" and not (vllm_venv / "bin" / "python").exists():
        print(f"trex demo: --rollouts vllm: no vLLM environment at {vllm_venv} (make demo creates it; or "
              "bash scripts/vllm-venv.sh; TREX_VLLM_VENV names another)", file=sys.stderr)
        return 2
    try:
        with _interrupt_on_signals():
            return run_local(docs, args.work_dir.resolve(), args.timeout, args.keep,
                             chart=examples.resolve().parent / "charts" / "trex",
                             vllm_python=str((vllm_venv / "bin" / "python").absolute()))
    except ValueError as exc:
        print(f"trex demo: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"trex demo: the local cluster failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        print(f"trex demo: interrupted ({exc or 'SIGINT'}); stopped the pods, the operator, the API server and"
              " Prometheus", file=sys.stderr)
        return 130
