"""The local kubelet against the kmock emulator, running real processes: an Indexed batch Job with a
hostPath volume and a ConfigMap, a failing pod's exit code and log fallback, and pod deletion killing
the process group."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from trex_operator.kube import Connection, Kube
from trex_operator.local.emulator import EmulatorThread
from trex_operator.local.kubelet import LocalKubelet, host_path_dir

NS = "default"
WRITER = r"""
import json, os, pathlib, sys
i = os.environ["JOB_COMPLETION_INDEX"]
cfg = pathlib.Path("/etc/cfg/conf.txt").read_text().strip()
out = pathlib.Path(cfg) / f"shard-{i}.txt"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(f"{i} {os.environ['POD_IP']} {sys.argv[1]}")
pathlib.Path(os.environ["TREX_TERMINATION_PATH"]).write_text(json.dumps({"index": int(i), "out": str(out)}))
"""


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[Kube, LocalKubelet, Path]]:
    server = EmulatorThread()
    server.start()
    kube = Kube(Connection(server=server.url), retries=2, backoff_s=0.05)
    targets: list[list[tuple[str, dict[str, str]]]] = []
    kubelet = LocalKubelet(kube, tmp_path, poll_s=0.1, on_targets=targets.append)
    task = asyncio.create_task(kubelet.run())
    try:
        yield kube, kubelet, tmp_path
    finally:
        kubelet.stop()
        await task
        await kube.close()
        server.stop()


async def wait(predicate: Any, timeout: float = 60.0, what: str = "condition") -> Any:
    end = asyncio.get_running_loop().time() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def _container(command: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": "trex", "image": "img", "command": command,
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "terminationMessagePolicy": "FallbackToLogsOnError", "terminationMessagePath": "/dev/termination-log",
            **extra}


async def test_indexed_job_with_volumes(cluster: tuple[Kube, LocalKubelet, Path]) -> None:
    kube, _kubelet, work = cluster
    await kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": NS},
                       "data": {"conf.txt": "/out/shards\n"}})
    container = _container(["python", "-c", WRITER, "$(JOB_COMPLETION_INDEX)"],
                           volumeMounts=[{"name": "cfg", "mountPath": "/etc/cfg"}, {"name": "out", "mountPath": "/out"}])
    await kube.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "gen", "namespace": NS, "uid": "u"},
                       "spec": {"completionMode": "Indexed", "completions": 3, "parallelism": 2,
                                "backoffLimitPerIndex": 0,
                                "template": {"metadata": {"labels": {"app": "gen"}},
                                             "spec": {"restartPolicy": "Never", "containers": [container],
                                                      "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}},
                                                                  {"name": "out", "hostPath": {"path": "/data/q"}}]}}}})

    async def complete() -> dict[str, Any] | None:
        job = await kube.get("batch/v1", "Job", NS, "gen")
        conds = ((job or {}).get("status") or {}).get("conditions") or []
        return job if any(c["type"] in ("Complete", "Failed") for c in conds) else None

    job = await wait(complete, what="the Job to finish")
    assert job["status"]["conditions"][0]["type"] == "Complete"
    assert job["status"]["succeeded"] == 3 and job["status"]["completedIndexes"] == "0-2"
    shards = host_path_dir(work, "/data/q") / "shards"
    lines = sorted(p.read_text() for p in shards.glob("shard-*.txt"))
    assert [line.split()[0] for line in lines] == ["0", "1", "2"]
    assert [line.split()[2] for line in lines] == ["0", "1", "2"]          # $(JOB_COMPLETION_INDEX) in args
    ips = {line.split()[1] for line in lines}
    assert len(ips) == 3 and all(ip.startswith("127.") for ip in ips)
    for i in range(3):
        pod = await kube.get("v1", "Pod", NS, f"gen-{i}-0")
        assert pod is not None and pod["status"]["phase"] == "Succeeded"
        assert pod["status"]["podIP"] in ips
        term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == 0 and term["reason"] == "Completed"
        assert json.loads(term["message"]) == {"index": i, "out": str(shards / f"shard-{i}.txt")}


async def test_failure_reports_exit_code_and_log_tail(cluster: tuple[Kube, LocalKubelet, Path]) -> None:
    kube, _kubelet, _work = cluster
    script = "import sys; print('about to fail'); sys.exit(3)"
    await kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad", "namespace": NS},
                       "spec": {"restartPolicy": "Never", "containers": [_container(["python", "-c", script])]}})

    async def failed() -> dict[str, Any] | None:
        pod = await kube.get("v1", "Pod", NS, "bad")
        return pod if (pod or {}).get("status", {}).get("phase") == "Failed" else None

    pod = await wait(failed, what="the pod to fail")
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error" and "about to fail" in term["message"]


async def test_deleting_a_pod_kills_its_process_group(cluster: tuple[Kube, LocalKubelet, Path]) -> None:
    kube, kubelet, work = cluster
    pidfile = work / "pids.txt"
    # the pod starts a child too: deletion must kill the whole group
    script = ("import os, subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
              f"open({str(pidfile)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}'); time.sleep(120)")
    await kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper", "namespace": NS},
                       "spec": {"restartPolicy": "Never", "containers": [_container([sys.executable, "-c", script])]}})

    async def pids() -> list[int] | None:
        text = pidfile.read_text() if pidfile.exists() else ""
        return [int(x) for x in text.split()] if len(text.split()) == 2 else None

    both = await wait(pids, what="the pod's processes")
    pod = await kube.get("v1", "Pod", NS, "sleeper")
    assert pod is not None and pod["status"]["phase"] == "Running"
    await kube.delete("v1", "Pod", NS, "sleeper")

    async def gone() -> bool:
        return not any(_alive(p) for p in both) and "sleeper" not in kubelet.pods

    await wait(gone, what="the processes to be killed")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


async def test_master_addr_resolves_to_the_master_pod_ip(cluster: tuple[Kube, LocalKubelet, Path]) -> None:
    kube, _kubelet, work = cluster
    script = "import os, sys; open(sys.argv[1], 'w').write(os.environ['MASTER_ADDR'] + ' ' + os.environ['POD_IP'])"
    for i in (1, 0):  # the worker first: it waits until the master pod has an address
        container = _container(["python", "-c", script, str(work / f"w{i}.txt")])
        container["env"].append({"name": "MASTER_ADDR", "value": "worker-0.gang.default.svc"})
        await kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"gang-{i}", "namespace": NS},
                           "spec": {"restartPolicy": "Never", "hostname": f"worker-{i}", "subdomain": "gang",
                                    "containers": [container]}})

    async def written() -> bool:
        return all((work / f"w{i}.txt").exists() and (work / f"w{i}.txt").read_text() for i in (0, 1))

    await wait(written, what="both pods to run")
    master0, ip0 = (work / "w0.txt").read_text().split()
    master1, ip1 = (work / "w1.txt").read_text().split()
    assert master0 == master1 == ip0 != ip1
    pod0 = await kube.get("v1", "Pod", NS, "gang-0")
    assert pod0 is not None and pod0["status"]["podIP"] == ip0


async def test_cpu_requests_queue_pods_first_come_first_served(cluster: tuple[Kube, LocalKubelet, Path]) -> None:
    kube, kubelet, work = cluster
    kubelet.cpus = 2.0
    release = work / "release"
    hold = f"import pathlib, time\nwhile not pathlib.Path({str(release)!r}).exists(): time.sleep(0.05)"
    for name, cpu in (("big", "2"), ("small", "500m")):
        container = _container(["python", "-c", hold], resources={"requests": {"cpu": cpu}})
        await kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
                           "spec": {"restartPolicy": "Never", "containers": [container]}})

    async def phase(name: str) -> str:
        pod = await kube.get("v1", "Pod", NS, name)
        return str(((pod or {}).get("status") or {}).get("phase"))

    async def big_running() -> bool:
        return await phase("big") == "Running"

    await wait(big_running, what="the first pod to run")
    for _ in range(10):  # ten kubelet passes with the node full: the second pod must not start
        await asyncio.sleep(0.1)
        assert await phase("small") == "Pending" and kubelet.pods["small"].proc is None
    release.write_text("go")

    async def both_done() -> bool:
        return await phase("big") == "Succeeded" and await phase("small") == "Succeeded"

    await wait(both_done, what="both pods to finish")


SERVER = r"""
import http.server, os, pathlib, sys
host, port, gate = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
pathlib.Path(sys.argv[4]).write_text(f"{os.getpid()} {host} {sys.executable}")

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path != "/health" or gate.exists()
        self.send_response(200 if ok else 503)
        self.end_headers()
        self.wfile.write(b"served by " + host.encode())

    def log_message(self, *a):
        pass

http.server.HTTPServer((host, port), H).serve_forever()
"""
CLIENT = r"""
import pathlib, sys, urllib.request
url = pathlib.Path("/etc/cfg/url.txt").read_text().strip()
pathlib.Path(sys.argv[1]).write_text(url + " " + urllib.request.urlopen(url, timeout=10).read().decode())
"""


async def test_a_deployment_serves_behind_its_readiness_probe_and_service(
        cluster: tuple[Kube, LocalKubelet, Path], tmp_path: Path) -> None:
    """A Deployment of a (stand-in) vLLM image: its pod runs from the vLLM interpreter, binds its own IP for
    0.0.0.0, is Ready (and the Deployment available) only once its probe answers, is reached through its Service's
    DNS name from another pod's config file, is restarted when its process dies, and is killed when the Deployment
    is deleted."""
    kube, kubelet, work = cluster
    stand_in = tmp_path / "vllm-python"  # the vLLM environment's interpreter: here a link to this one
    stand_in.symlink_to(sys.executable)
    kubelet.vllm_python = str(stand_in)
    gate, info = work / "gate", work / "server.txt"
    server = {"name": "server", "image": "vllm/vllm-openai:v0.32.0",
              "command": ["python", "-c", SERVER, "0.0.0.0", "8000", str(gate), str(info)],
              "ports": [{"name": "http", "containerPort": 8000}],
              "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
              "resources": {"requests": {"cpu": "500m"}}}
    labels = {"app": "srv"}
    await kube.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "srv", "namespace": NS},
                       "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                                "template": {"metadata": {"labels": labels}, "spec": {"containers": [server]}}}})
    await kube.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "srv", "namespace": NS},
                       "spec": {"selector": labels, "ports": [{"port": 8000}]}})

    async def server_pod() -> dict[str, Any] | None:
        pods = (await kube.request("GET", f"/api/v1/namespaces/{NS}/pods")).get("items") or []
        mine = [p for p in pods if (p["metadata"].get("labels") or {}).get("app") == "srv"
                and not p["metadata"].get("deletionTimestamp")]
        return mine[0] if mine and (mine[0].get("status") or {}).get("phase") == "Running" else None

    pod = await wait(server_pod, what="the server pod to run")
    await wait(lambda: asyncio.sleep(0, info.exists()), what="the server to start")
    pid, host, python = info.read_text().split()
    assert host == pod["status"]["podIP"] != "0.0.0.0" and python == str(stand_in)
    await asyncio.sleep(1.5)  # probes fail while the server is "loading"
    pod = await kube.get("v1", "Pod", NS, pod["metadata"]["name"])
    dep = await kube.get("apps/v1", "Deployment", NS, "srv")
    assert pod is not None and dep is not None
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "False"
    assert (dep.get("status") or {}).get("availableReplicas", 0) == 0
    gate.write_text("loaded")

    async def available() -> bool:
        d = await kube.get("apps/v1", "Deployment", NS, "srv")
        return ((d or {}).get("status") or {}).get("availableReplicas") == 1

    await wait(available, what="the Deployment to become available")
    # a pod whose config names the Service reaches the server through it
    await kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": NS},
                       "data": {"url.txt": "http://srv.default.svc:8000/v1/models\n"}})
    await kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": NS},
                       "spec": {"restartPolicy": "Never", "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}],
                                "containers": [_container(["python", "-c", CLIENT, str(work / "client.txt")],
                                                          volumeMounts=[{"name": "cfg", "mountPath": "/etc/cfg"}])]}})
    await wait(lambda: asyncio.sleep(0, (work / "client.txt").exists()), what="the client to answer")
    assert (work / "client.txt").read_text() == f"http://{host}:8000/v1/models served by {host}"

    # the server dies: the pod is restarted (restartPolicy Always) after the back-off, and is Ready again
    info.unlink()
    os.kill(int(pid), 9)

    async def restarted() -> dict[str, Any] | None:
        p = await kube.get("v1", "Pod", NS, pod["metadata"]["name"])
        cs = ((p or {}).get("status") or {}).get("containerStatuses") or [{}]
        return p if cs[0].get("restartCount") == 1 and cs[0].get("ready") else None

    again = await wait(restarted, timeout=60, what="the server to be restarted")
    assert again["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137
    pid2 = int(info.read_text().split()[0])
    assert pid2 != int(pid) and _alive(pid2)

    # the Deployment is deleted (its job ended): its pod goes and the process is killed
    await kube.delete("apps/v1", "Deployment", NS, "srv")
    await wait(lambda: asyncio.sleep(0, not _alive(pid2) and not any(
        n.startswith("srv-") for n in kubelet.pods)), what="the server to be stopped")
