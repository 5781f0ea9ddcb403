"""The real kubectl and helm binaries (installed by `make test`) against the local API server the demo
runs: discovery, short names and categories, server-side tables with the CRDs' printer columns,
OpenAPI (explain, apply with validation on), selectors, watch (wait), events in describe, pod logs,
garbage collection (background, foreground, orphan), protobuf writes, and helm install/upgrade/uninstall."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from trex_operator.demo import write_kubeconfig
from trex_operator.local.emulator import EmulatorThread

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
KUBECTL = str(BIN / "kubectl") if (BIN / "kubectl").exists() else shutil.which("kubectl")
HELM = str(BIN / "helm") if (BIN / "helm").exists() else shutil.which("helm")
pytestmark = pytest.mark.skipif(not (KUBECTL and HELM), reason="kubectl/helm not installed (make test installs them)")


class Cluster:
    """The local API server and a kubeconfig for it."""

    def __init__(self, tmp: Path) -> None:
        self.server = EmulatorThread(crds=False)
        self.server.start()
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.server.emulator.log_dir = self.logs
        self.kubeconfig = tmp / "kubeconfig"
        write_kubeconfig(self.kubeconfig, self.server.url)
        self.env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HELM_CACHE_HOME": str(tmp / "hc"),
                    "HELM_CONFIG_HOME": str(tmp / "hcfg"), "HELM_DATA_HOME": str(tmp / "hd")}

    def run(self, *args: str, ok: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        tool = HELM if args[0] == "helm" else KUBECTL
        assert tool is not None
        res = subprocess.run([tool, *args[1:]], env=self.env, capture_output=True, text=True, input=stdin,
                             timeout=60, cwd=REPO, check=False)
        if ok:
            assert res.returncode == 0, f"{' '.join(args)}: {res.stdout}\n{res.stderr}"
        return res

    def json(self, *args: str) -> Any:
        return json.loads(self.run("kubectl", *args, "-o", "json").stdout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("local-api"))
    try:
        c.run("helm", "install", "trex", "charts/trex")
        yield c
    finally:
        c.server.stop()


def _header(out: str) -> list[str]:
    return out.splitlines()[0].split()


def test_discovery_version_and_helm_release(cluster: Cluster) -> None:
    version = json.loads(cluster.run("kubectl", "version", "-o", "json").stdout)["serverVersion"]
    assert (int(version["major"]), int(version["minor"])) >= (1, 28)
    crds = cluster.run("kubectl", "get", "crd", "-o", "name").stdout.split()
    assert sorted(crds) == [f"customresourcedefinition.apiextensions.k8s.io/{p}.trex.dev"
                            for p in ("evaljobs", "kerneltunejobs", "ordatajobs", "trainjobs")]
    [release] = json.loads(cluster.run("helm", "list", "-o", "json").stdout)
    assert (release["name"], release["status"]) == ("trex", "deployed")
    assert cluster.json("get", "deployment", "trex")["kind"] == "Deployment"
    names = cluster.run("kubectl", "api-resources", "--categories=trex", "-o", "name").stdout.split()
    assert sorted(names) == ["evaljobs.trex.dev", "kerneltunejobs.trex.dev", "ordatajobs.trex.dev", "trainjobs.trex.dev"]
    core = cluster.run("kubectl", "api-resources", "--api-group=", "-o", "name").stdout.split()
    assert {"pods", "events", "configmaps", "secrets"} <= set(core)


def test_apply_get_explain_and_validation(cluster: Cluster) -> None:
    out = cluster.run("kubectl", "apply", "-f", "examples/quickstart/").stdout   # client validation on
    assert out.count(" created") == 6, out
    assert cluster.run("kubectl", "get", "trex").stdout.count("quickstart-") == 6
    assert _header(cluster.run("kubectl", "get", "trainjobs").stdout) == ["NAME", "PHASE", "STEP", "MFU", "LOSS", "AGE"]
    assert "PASS@1" in _header(cluster.run("kubectl", "get", "ej").stdout)
    listed = cluster.json("get", "tj")
    assert [i["kind"] for i in listed["items"]] == ["TrainJob"] * 3
    explained = cluster.run("kubectl", "explain", "trainjob.spec.trainer").stdout
    assert "KIND:       TrainJob" in explained and "checkpoint" in explained
    unknown = cluster.run("kubectl", "apply", "-f", "-", ok=False, stdin=(
        "apiVersion: trex.dev/v1alpha1\nkind: TrainJob\nmetadata: {name: typo}\nspec: {trainer: {maxStepz: 3}}\n"))
    assert unknown.returncode != 0 and 'unknown field "spec.trainer.maxStepz"' in unknown.stderr
    wrong = cluster.run("kubectl", "apply", "-f", "-", ok=False, stdin=(
        "apiVersion: trex.dev/v1alpha1\nkind: TrainJob\nmetadata: {name: typed}\nspec: {trainer: {maxSteps: lots}}\n"))
    assert wrong.returncode != 0 and "spec.trainer.maxSteps" in wrong.stderr
    assert cluster.run("kubectl", "get", "tj", "typo", ok=False).returncode != 0


def test_printer_columns_watch_and_describe_events(cluster: Cluster) -> None:
    cluster.run("kubectl", "patch", "tj", "quickstart-train", "--subresource=status", "--type=merge", "-p",
                json.dumps({"status": {"phase": "Running", "progress": {"step": 3, "mfu": 0.25, "loss": 1.5}}}))
    row = cluster.run("kubectl", "get", "tj", "quickstart-train", "--no-headers").stdout.split()
    assert row[:5] == ["quickstart-train", "Running", "3", "0.25", "1.5"]
    assert KUBECTL is not None
    waiter = subprocess.Popen([KUBECTL, "wait", "--for=jsonpath={.status.phase}=Succeeded", "tj/quickstart-train",
                               "--timeout=30s"], env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Kept: a pause, not a sync; whichever comes first, the watch or the patch, `kubectl wait` must report it met.
    time.sleep(1.0)
    cluster.run("kubectl", "patch", "tj", "quickstart-train", "--subresource=status", "--type=merge", "-p",
                '{"status": {"phase": "Succeeded"}}')
    out, err = waiter.communicate(timeout=40)
    assert waiter.returncode == 0 and "condition met" in out, err
    for job, kind, message in (("quickstart-train", "TrainJob", "train-only message"),
                               ("quickstart-eval", "EvalJob", "eval-only message")):
        uid = cluster.json("get", kind.lower(), job)["metadata"]["uid"]
        cluster.run("kubectl", "create", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{job}.ev"}, "type": "Normal",
            "reason": "Tested", "message": message, "involvedObject": {
                "apiVersion": "trex.dev/v1alpha1", "kind": kind, "name": job, "namespace": "default", "uid": uid}}))
    described = cluster.run("kubectl", "describe", "tj", "quickstart-train").stdout
    assert "train-only message" in described and "eval-only message" not in described
    events = cluster.run("kubectl", "get", "events", "--field-selector", "involvedObject.kind=EvalJob").stdout
    assert "eval-only message" in events and "train-only" not in events


def _pod(name: str, owner: dict[str, Any] | None, job: str) -> str:
    meta: dict[str, Any] = {"name": name, "labels": {"trex.dev/job-name": job}}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "controller": True,
                                    "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                       "spec": {"containers": [{"name": "trex", "image": "busybox"}]}})


def test_pods_logs_selectors_and_garbage_collection(cluster: Cluster) -> None:
    train = cluster.json("get", "tj", "quickstart-train")
    evaljob = cluster.json("get", "ej", "quickstart-eval")
    cluster.run("kubectl", "create", "configmap", "owner", "--from-literal=a=b")   # a protobuf body
    owner = cluster.json("get", "configmap", "owner")
    assert owner["data"] == {"a": "b"}
    for name, o, job in (("train-0", train, "quickstart-train"), ("train-1", train, "quickstart-train"),
                         ("eval-0", evaljob, "quickstart-eval"), ("cm-0", owner, "none")):
        cluster.run("kubectl", "apply", "-f", "-", stdin=_pod(name, o, job))
    (cluster.logs / "train-0.log").write_text("line 1\nline 2\nstep 3 loss 1.5\n")
    assert cluster.run("kubectl", "logs", "train-0").stdout == "line 1\nline 2\nstep 3 loss 1.5\n"
    assert cluster.run("kubectl", "logs", "train-0", "--tail=1").stdout == "step 3 loss 1.5\n"
    labelled = cluster.run("kubectl", "get", "pods", "-l", "trex.dev/job-name=quickstart-train", "-o", "name").stdout
    assert labelled.split() == ["pod/train-0", "pod/train-1"]
    by_field = cluster.run("kubectl", "get", "pods", "--field-selector", "metadata.name=eval-0", "-o", "name").stdout
    assert by_field.split() == ["pod/eval-0"]

    cluster.run("kubectl", "delete", "tj", "quickstart-train")                     # background cascade
    assert cluster.run("kubectl", "get", "pods", "-l", "trex.dev/job-name=quickstart-train", "-o", "name").stdout == ""
    cluster.run("kubectl", "delete", "configmap", "owner", "--cascade=foreground")
    assert cluster.run("kubectl", "get", "pod", "cm-0", ok=False).returncode != 0
    cluster.run("kubectl", "delete", "ej", "quickstart-eval", "--cascade=orphan")
    kept = cluster.json("get", "pod", "eval-0")
    assert kept["metadata"].get("ownerReferences") in (None, [])


def test_helm_upgrade_and_uninstall(cluster: Cluster) -> None:
    dashboards = cluster.run("kubectl", "get", "configmap", "-l", "grafana_dashboard=1", "-o", "name").stdout.split()
    assert dashboards
    cluster.run("helm", "upgrade", "trex", "charts/trex", "--set", "monitoring.dashboard.enabled=false")
    assert cluster.run("kubectl", "get", "configmap", "-l", "grafana_dashboard=1", "-o", "name").stdout == ""
    [release] = json.loads(cluster.run("helm", "list", "-o", "json").stdout)
    assert release["revision"] == "2"
    cluster.run("helm", "uninstall", "trex")
    assert cluster.run("kubectl", "get", "deployment", "trex", ok=False).returncode != 0
    assert json.loads(cluster.run("helm", "list", "-o", "json").stdout) == []
