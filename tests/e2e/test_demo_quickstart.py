"""`trex demo --quick` end to end: the quickstart's six jobs on the local stand-in cluster (API server with the
chart installed by helm, operator, local kubelet running real workload processes, a real Prometheus) must
each succeed, by name, with the exact results its --quick budget implies, and every Grafana panel must
return data from that Prometheus with no query failing."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.vllm_env import vllm_venv

REPO = Path(__file__).resolve().parents[2]
JOBS = {"quickstart-ordata": "ORDataJob", "quickstart-kernels": "KernelTuneJob", "quickstart-train": "TrainJob",
        "quickstart-grpo": "TrainJob", "quickstart-opd": "TrainJob", "quickstart-eval": "EvalJob"}


def _demo(work: Path, *extra: str) -> str:
    """Run `trex demo --quick` into ``work``; its output (the test fails on a non-zero exit)."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (make test installs it): the dashboard cannot be checked")
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run([sys.executable, "-m", "trex", "demo", "--quick", "--work-dir", str(work),
                          "--timeout", "600", *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=840)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_quickstart_quick(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    out = _demo(work)
    _check_quickstart(work, out, latent=32)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_quickstart_quick_on_vllm(tmp_path: Path) -> None:
    """`trex demo --quick --rollouts vllm`: the same jobs and results, with GRPO and OPD sampling on vLLM servers
    the local kubelet ran as Deployments (every step after the first pushed new weights to them) and the EvalJob
    answered by a vLLM server; the servers' own access logs show the requests."""
    vllm_venv()
    work = tmp_path / "demo"
    out = _demo(work, "--rollouts", "vllm")
    _check_quickstart(work, out, latent=512)
    jobs = {o["metadata"]["name"]: o for o in json.loads((work / "jobs.json").read_text())}
    for name in ("quickstart-grpo", "quickstart-opd"):
        conds = {c["type"]: c for c in jobs[name]["status"]["conditions"]}
        assert conds["RolloutServerReady"]["status"] == "True", conds
    logs = {p.name: p.read_text(errors="replace") for p in (work / "logs").glob("*.log")}

    def server_log(prefix: str) -> str:
        [text] = [t for n, t in logs.items() if n.startswith(prefix)]
        return text

    for name, steps in (("quickstart-grpo", 3), ("quickstart-opd", 3)):
        text = server_log(f"{name}-rollout-0-")
        assert re.search(r'"POST /v1/completions HTTP/1.1" 200', text), text[-3000:]
        # a weight push before each step but the first (the server starts on the SFT export): reload_weights
        assert len(re.findall(r'"POST /collective_rpc HTTP/1.1" 200', text)) >= steps - 1, text[-3000:]
    text = server_log("quickstart-eval-server-")
    assert re.search(r'"POST /v1/chat/completions HTTP/1.1" 200', text), text[-3000:]


def _check_quickstart(work: Path, out: str, latent: int) -> None:
    """The quickstart's jobs, results, kernels and dashboard; ``latent``: the SFT model's kv_lora_rank (32 in
    process, 512 on vLLM, whose CPU MLA kernel serves only a 576-value latent with the 64 rotary values)."""
    jobs: dict[str, dict[str, Any]] = {o["metadata"]["name"]: o for o in json.loads((work / "jobs.json").read_text())}
    assert {name: o["kind"] for name, o in jobs.items()} == JOBS
    assert {name: o["status"]["phase"] for name, o in jobs.items()} == dict.fromkeys(JOBS, "Succeeded")
    results = {name: o["status"]["results"] for name, o in jobs.items()}

    # ORData: --quick plans 32 instances; every one is generated, solved, verified and accepted.
    ordata = results["quickstart-ordata"]
    assert {k: ordata[k] for k in ("planned", "generated", "solved", "verified", "accepted", "duplicates")} == {
        "planned": 32, "generated": 32, "solved": 32, "verified": 32, "accepted": 32, "duplicates": 0}
    assert ordata["rejected"] == {}

    # The three TrainJobs ran every step of their --quick budgets and checkpointed the last one.
    for name, steps in (("quickstart-train", 8), ("quickstart-grpo", 3), ("quickstart-opd", 3)):
        r = results[name]
        assert (r["result"], r["step"], r["maxSteps"], r["lastCheckpointStep"]) == ("Succeeded", steps, steps, steps), r
        assert math.isfinite(r["loss"]) and 0 < r["mfu"] <= 1 and r["tokens"] > 0, r
    train = jobs["quickstart-train"]
    assert results["quickstart-train"]["sftSamples"]["whole"] > 0
    ckpt = work / "hostpath" / train["spec"]["volumes"]["checkpoints"]["hostPath"].lstrip("/")
    assert list(ckpt.rglob("quickstart-train/hf/model.safetensors")), sorted(str(p) for p in ckpt.rglob("*"))[:20]
    # GRPO: 3 steps x promptsPerStep 2 x groupSize 2 = 12 responses, each with one verifier outcome.
    grpo = results["quickstart-grpo"]["grpo"]
    assert (grpo["steps"], grpo["responses"], sum(grpo["outcomes"].values())) == (3, 12, 12), grpo
    assert 0 <= grpo["rewardMeanFirst"] <= 1 and 0 <= grpo["rewardMeanLast"] <= 1
    assert "GRPO reward" in out and "over 12 responses" in out
    # OPD: trex train writes no OPD block into the results (kept: it has none to check); its distillation
    # metrics are checked below, in the two Distillation panels.
    assert "grpo" not in results["quickstart-opd"]

    # Eval: --quick scores one held-out item; the job's Pass@1 is that benchmark's.
    ev = results["quickstart-eval"]
    assert (ev["complete"], ev["failedRequests"], ev["benchmarks"]["ordata"]["samples"]) == (True, 0, 1), ev
    assert ev["passAt1"] == ev["benchmarks"]["ordata"]["passAt1"] in (0.0, 1.0)
    assert "SFT steps on a CPU: a score near 0 means too small a model" in out
    assert "== oracle check: reference answers cut at maxTokens=1536 score Pass@1 = 100 %" in out, out[-3000:]

    # Kernels: the two kernels of the manifest at the quickstart TrainJob's shape classes (shapesFrom: RMSNorm at
    # hidden 64 and the kv latent; SwiGLU at the expert hidden 32 over three row classes), the geomean is theirs,
    # and the TrainJob (kernelsFrom) ran with every tuned class active and none refused.
    kernels = results["quickstart-kernels"]
    assert sorted(kernels["kernels"]) == sorted([
        f"rmsnorm_fwd/fp32/cols{latent}-rows4096", "rmsnorm_fwd/fp32/cols64-rows4096",
        "swiglu_clamp_fwd/fp32/cols32-rows16384", "swiglu_clamp_fwd/fp32/cols32-rows4096",
        "swiglu_clamp_fwd/fp32/cols32-rows8192"])
    active = results["quickstart-train"]["kernels"]
    assert sorted(active["active"]) == sorted(kernels["kernels"]) and not active["refused"], active
    # ... and timed one micro-batch tuned and untuned side by side in its pod, shown in the summary.
    base = active["baseline"]
    assert base["tokens"] > 0 and base["tunedTokensPerSecond"] > 0 and base["untunedTokensPerSecond"] > 0, base
    assert f"tokens/s with the tuned kernels {base['tunedTokensPerSecond']} vs untuned" in out
    speedups = [k["speedup"] for k in kernels["kernels"].values()]
    assert kernels["geomeanSpeedup"] == pytest.approx(math.prod(speedups) ** (1 / len(speedups)), abs=1e-3)

    # the demo installed the chart with helm and wrote a kubeconfig for its API server
    assert "helm install trex" in out and f"export KUBECONFIG={work / 'kubeconfig'}" in out, out[-3000:]

    # Prometheus saw each TrainJob's MFU, and every Grafana panel returned data with no query failing.
    line = next(x for x in out.splitlines() if "last_over_time(trex_train_mfu" in x)
    assert all(f"{name}=" in line for name in ("quickstart-train", "quickstart-grpo", "quickstart-opd")), line
    dashboard = json.loads((work / "dashboard.json").read_text())
    panels = [p["title"] for p in json.loads((REPO / "charts/trex/dashboards/trex.json").read_text())["panels"]
              if p.get("targets")]
    assert sorted(dashboard["series"]) == sorted(panels)
    assert dashboard["errors"] == {}
    assert [t for t, n in dashboard["series"].items() if n == 0] == []
    assert f"== Grafana dashboard: {len(panels)}/{len(panels)} panels return data" in out
