"""The demo's job table rows, the local Prometheus configuration (checked by promtool when installed) and
the demo's pure helpers (quick budgets stay valid, output locations)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from trex_operator.demo import load_quickstart, local_output, prepare_work_dir, quick_overrides
from trex_operator.local.prometheus import scrape_config, targets_document, write_targets
from trex_operator.local.table import HEADER, age, all_terminal, job_row, plain_table
from trex_operator.validate import check_document

REPO = Path(__file__).resolve().parents[3]
NOW = dt.datetime(2026, 1, 1, 0, 10, 5, tzinfo=dt.UTC)


def test_rows_show_phase_progress_mfu_and_pass_at_1() -> None:
    train = {"kind": "TrainJob", "metadata": {"name": "t", "creationTimestamp": "2026-01-01T00:00:00Z"},
             "status": {"phase": "Running", "progress": {"percent": "50.0%", "mfu": 0.1234, "step": 30,
                                                          "maxSteps": 60, "loss": 4.5}}}
    ev = {"kind": "EvalJob", "metadata": {"name": "e", "creationTimestamp": "2026-01-01T00:10:00Z"},
          "status": {"phase": "Succeeded", "results": {"passAt1": 0.25, "benchmarks": {"ordata": {"passAt1": 0.25}}}}}
    od = {"kind": "ORDataJob", "metadata": {"name": "o"}, "status": {"phase": "Succeeded",
                                                                      "results": {"accepted": 60, "generated": 64}}}
    assert job_row(train, NOW) == ("TrainJob", "t", "Running", "50.0%", "12.3%", "", "step 30/60 loss 4.500", "10m5s")
    assert job_row(ev, NOW) == ("EvalJob", "e", "Succeeded", "", "", "25.0%", "ordata: 25.0%", "5s")
    assert job_row(od, NOW)[6] == "accepted 60/64"
    assert job_row({"kind": "KernelTuneJob", "metadata": {"name": "k"}}, NOW)[2] == "Pending"
    assert not all_terminal([train, ev]) and all_terminal([ev, od]) and not all_terminal([])


def test_plain_table_aligns_columns() -> None:
    text = plain_table([("TrainJob", "a-long-name", "Running", "", "", "", "", "1s")])
    header, row = text.splitlines()
    assert header.split() == list(HEADER)
    assert header.index("NAME") == row.index("a-long-name") and header.index("PHASE") == row.index("Running")


def test_age_format() -> None:
    assert age("2026-01-01T00:10:00Z", NOW) == "5s"
    assert age("2025-12-31T21:00:00Z", NOW) == "3h10m"
    assert age(None, NOW) == "" and age("garbage", NOW) == ""


def test_prometheus_config_and_targets(tmp_path: Path) -> None:
    targets = tmp_path / "targets.json"
    write_targets(targets, [("127.20.0.2:9400", {"pod": "p"})])
    assert json.loads(targets.read_text()) == [{"targets": ["127.20.0.2:9400"], "labels": {"pod": "p"}}]
    assert targets_document([]) == []
    cfg = yaml.safe_load(scrape_config(targets, "127.0.0.1:8080"))
    assert cfg["global"]["scrape_interval"] == "1s"
    assert cfg["scrape_configs"][0]["file_sd_configs"][0]["files"] == [str(targets)]
    assert cfg["scrape_configs"][1]["static_configs"][0]["targets"] == ["127.0.0.1:8080"]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    path = tmp_path / "prometheus.yml"
    path.write_text(scrape_config(targets, "127.0.0.1:8080"))
    res = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_quick_budgets_are_smaller_and_valid() -> None:
    full = load_quickstart(REPO / "examples", quick=False)
    quick = load_quickstart(REPO / "examples", quick=True)
    assert [d["kind"] for d in full] == ["ORDataJob", "KernelTuneJob", "TrainJob", "TrainJob", "TrainJob", "EvalJob"]
    for f, q in zip(full, quick, strict=True):
        assert check_document("q", 0, q).problems == []
        assert q != f or (f["kind"] == "ORDataJob" and f["spec"]["ordata"]["count"] <= 32)
        assert quick_overrides(f) == q
    train = {d["metadata"]["name"]: d for d in quick}["quickstart-train"]["spec"]["trainer"]
    assert train["maxSteps"] <= 8
    # the quick budgets still hold the quickstart's samples and reference answers
    from trex_operator.budgets import budget_problems

    assert budget_problems([check_document("q", 0, q) for q in quick]) == []


def test_local_output_maps_hostpath(tmp_path: Path) -> None:
    doc: dict[str, Any] = {"kind": "ORDataJob", "spec": {"ordata": {"output": "/output/q"},
                                         "volumes": {"output": {"hostPath": "/var/lib/trex/x"}}}}
    assert local_output(doc, tmp_path) == tmp_path / "hostpath" / "var" / "lib" / "trex" / "x" / "q"
    doc["spec"]["volumes"] = {}
    assert local_output(doc, tmp_path) is None


def test_prepare_work_dir_refuses_foreign_folders(tmp_path: Path) -> None:
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        prepare_work_dir(foreign)
    assert (foreign / "precious.txt").exists()
    demo = tmp_path / "demo"
    prepare_work_dir(demo)
    (demo / "old").write_text("stale")
    prepare_work_dir(demo)
    assert not (demo / "old").exists() and (demo / ".trex-demo").exists()


def test_vllm_rollouts_add_servers_and_stay_valid() -> None:
    from trex_operator.demo import VLLM_CPU_IMAGE, rollout_overrides
    from trex_operator.local.kubelet import container_argv, is_vllm_image

    for quick in (False, True):
        plain = load_quickstart(REPO / "examples", quick=quick)
        served = load_quickstart(REPO / "examples", quick=quick, rollouts="vllm")
        for p, v in zip(plain, served, strict=True):
            assert check_document("q", 0, v).problems == []
            assert rollout_overrides(p, "vllm") == v and rollout_overrides(p, "inprocess") == p
        by_name = {d["metadata"]["name"]: d["spec"] for d in served}
        for name in ("quickstart-grpo", "quickstart-opd"):
            server = by_name[name]["rollout"]["server"]
            assert server["image"] == VLLM_CPU_IMAGE and "--max-model-len" in server["args"]
        before = {d["metadata"]["name"]: d["spec"] for d in plain}
        for name in ("quickstart-ordata", "quickstart-kernels"):
            assert by_name[name] == before[name]
        for name in ("quickstart-train", "quickstart-grpo", "quickstart-opd"):
            # every TrainJob's model takes the latent vLLM's CPU MLA kernel serves (512 + 64 = 576), unclamped;
            # the in-process quickstart keeps its smaller one
            over, was = by_name[name]["trainer"]["model"]["overrides"], before[name]["trainer"]["model"]["overrides"]
            assert over["kvLoraRank"] + over["qkRopeHeadDim"] == 576 and over["swigluLimit"] == 0, over
            assert "kvLoraRank" not in was and {k: over[k] for k in was} == was
        assert {k: v for k, v in by_name["quickstart-train"].items() if k != "trainer"} == {
            k: v for k, v in before["quickstart-train"].items() if k != "trainer"}
        ev = by_name["quickstart-eval"]
        # the eval requests name the model the server serves, with the in-process run's sampling
        assert ev["evaluation"]["model"] == {"kind": "openai", "name": "quickstart-train",
                                             "sampling": {"maxTokens": 1536}}
        args = ev["server"]["args"]
        assert args[args.index("--served-model-name") + 1] == "quickstart-train"
        # the local kubelet knows the image's entrypoint: the container (no command) runs `vllm serve <args>`
        assert is_vllm_image(ev["server"]["image"])
        assert container_argv({"image": ev["server"]["image"], "args": args})[:2] == ["vllm", "serve"]
    with pytest.raises(ValueError, match="--rollouts 'gpu'"):
        rollout_overrides(plain[0], "gpu")


def test_the_vllm_eval_server_takes_the_export_as_its_model() -> None:
    """The operator appends the export's folder to the server's args: it must land as --model's value (vllm serve
    refuses a trailing positional model next to --served-model-name)."""
    from trex_operator.demo import rollout_overrides

    [ev] = [d for d in load_quickstart(REPO / "examples", quick=True) if d["kind"] == "EvalJob"]
    assert rollout_overrides(ev, "vllm")["spec"]["server"]["args"][-1] == "--model"
