"""Shared builders for child objects: deterministic names, labels, owner references, pods, config maps.

Every function here is pure: a job context in, a manifest dict out.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import yaml

from trex_operator.api import API_VERSION, CommonSpec, StorageSpec
from trex_operator.defaults import CONFIG_DIR as CONFIG_DIR
from trex_operator.defaults import ClusterDefaults, EffectiveGang, effective_gang
from trex_operator.plan import Manifest
from trex_operator.ranktable import RANK_INDEX_ANNOTATION, node_selector

LABEL_KIND = "trex.dev/job-kind"
LABEL_NAME = "trex.dev/job-name"
LABEL_ATTEMPT = "trex.dev/attempt"
LABEL_INDEX = "trex.dev/replica-index"
LABEL_ROLE = "trex.dev/role"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
MANAGER = "trex-operator"
KERNELS_DIR = "/etc/trex-kernels"
MASTER_PORT = 29500
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"
DEFAULT_MOUNTS = {"data": "/data", "checkpoints": "/checkpoints", "output": "/output"}


@dataclass(frozen=True)
class JobCtx:
    """Identity of the job that owns the children."""

    kind: str
    name: str
    namespace: str
    uid: str
    labels: dict[str, str]

    @staticmethod
    def from_body(body: dict[str, Any]) -> JobCtx:
        """Identity from a raw job object."""
        meta = body.get("metadata") or {}
        labels = meta.get("labels") or {}
        return JobCtx(
            kind=str(body.get("kind", "")), name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace") or "default"), uid=str(meta.get("uid") or ""),
            labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
        )


def selector_labels(job: JobCtx) -> dict[str, str]:
    """Labels that identify the children of ``job`` (used by selectors and the pod index)."""
    return {LABEL_KIND: job.kind, LABEL_NAME: job.name}


def child_labels(job: JobCtx, **extra: str) -> dict[str, str]:
    """The job's own labels plus the identifying ones and ``extra``."""
    out = {k: v for k, v in job.labels.items() if not k.startswith("trex.dev/")}
    out.update(selector_labels(job))
    out[LABEL_MANAGED] = MANAGER
    out.update(extra)
    return out


def owner_reference(job: JobCtx) -> dict[str, Any]:
    """The controller ownerReference every child carries (garbage collection with the job)."""
    return {"apiVersion": API_VERSION, "kind": job.kind, "name": job.name, "uid": job.uid,
            "controller": True, "blockOwnerDeletion": True}


def metadata(job: JobCtx, name: str, labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """Child metadata: name, namespace, labels, annotations and the owner reference."""
    meta: dict[str, Any] = {"name": name, "namespace": job.namespace, "labels": labels or child_labels(job),
                            "ownerReferences": [owner_reference(job)]}
    if annotations:
        meta["annotations"] = annotations
    return meta


def service_name(job: JobCtx) -> str:
    """Headless Service name: a DNS-1035 label (must start with a letter)."""
    return job.name if job.name[:1].isalpha() else ("j-" + job.name)[:63].rstrip("-")


def config_map_name(job: JobCtx) -> str:
    """The job's configuration ConfigMap."""
    return f"{job.name}-config"


def kernels_config_map_name(job_name: str) -> str:
    """The ConfigMap a KernelTuneJob publishes its tuned kernels in."""
    return f"{job_name}-kernels"


def config_map(job: JobCtx, name: str, data: dict[str, str]) -> Manifest:
    """A ConfigMap owned by the job."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(job, name), "data": data}


def render_yaml(section: str, value: dict[str, Any]) -> str:
    """YAML text of a config section (`trex <cmd> --config` accepts the section key); memoised per content."""
    return _render_yaml(section, json.dumps(value, separators=(",", ":")))


@functools.lru_cache(maxsize=4096)
def _render_yaml(section: str, value_json: str) -> str:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump({section: json.loads(value_json)}, Dumper=dumper, sort_keys=False)


def to_json(value: Any) -> str:
    """Stable compact JSON (for ConfigMap data and hashing)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def headless_service(job: JobCtx, ports: list[tuple[str, int]]) -> Manifest:
    """A headless Service giving each pod a stable DNS name (<hostname>.<service>)."""
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": metadata(job, service_name(job)),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector_labels(job),
                 "ports": [{"name": n, "port": p, "targetPort": p, "protocol": "TCP"} for n, p in ports]},
    }


def quantity(value: int | str) -> str:
    """A Kubernetes quantity as a string."""
    return str(value)


def pod_resources(spec: CommonSpec, devices: int, defaults: ClusterDefaults,
                  extra_requests: dict[str, int | str] | None = None,
                  extra_limits: dict[str, int | str] | None = None) -> dict[str, Any]:
    """Requests/limits: the user's values plus the cluster's device resource (requests = limits for devices)."""
    requests = {k: quantity(v) for k, v in (extra_requests if extra_requests is not None else spec.resources.requests).items()}
    limits = {k: quantity(v) for k, v in (extra_limits if extra_limits is not None else spec.resources.limits).items()}
    resource = defaults.device_resource(spec.device_type)
    if devices > 0 and resource is not None:
        requests[resource] = limits[resource] = str(devices)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def volume_source(storage: StorageSpec) -> dict[str, Any]:
    """The volume source of a storage spec (PVC, hostPath or emptyDir)."""
    if storage.claim_name is not None:
        return {"persistentVolumeClaim": {"claimName": storage.claim_name}}
    if storage.host_path is not None:
        return {"hostPath": {"path": storage.host_path, "type": "DirectoryOrCreate"}}
    return {"emptyDir": {}}


def storage_mounts(spec: CommonSpec) -> dict[str, str]:
    """Mount path of each configured storage volume (data, checkpoints, output)."""
    out: dict[str, str] = {}
    for key in ("data", "checkpoints", "output"):
        storage: StorageSpec | None = getattr(spec.volumes, key)
        if storage is not None:
            out[key] = storage.mount_path or DEFAULT_MOUNTS[key]
    return out


REFS_DIR = "/refs"


@dataclass(frozen=True)
class RefMount:
    """A referenced job's storage, mounted read-only at /refs/<job name> (its outputs as this pod's inputs)."""

    job_name: str
    source: dict[str, Any]

    @property
    def mount_path(self) -> str:
        """Where the referenced storage appears in the pod."""
        return f"{REFS_DIR}/{self.job_name}"


def ref_volume_source(storage: Any) -> dict[str, Any] | None:
    """Read-only volume source of a referenced job's raw storage spec; None when it cannot be shared."""
    if not isinstance(storage, dict):
        return None
    if isinstance(storage.get("claimName"), str):
        return {"persistentVolumeClaim": {"claimName": storage["claimName"], "readOnly": True}}
    if isinstance(storage.get("hostPath"), str):
        return {"hostPath": {"path": storage["hostPath"], "type": "Directory"}}
    return None


def volumes(job: JobCtx, spec: CommonSpec, config: str | None = None,
            kernels_from: str | None = None, refs: tuple[RefMount, ...] = (),
            rank_table: ClusterDefaults | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pod volumes and container mounts: config map, the HCCL rank table (when ``rank_table`` places it
    outside the config directory), kernels, data/checkpoints/output storage, referenced jobs' storage
    (read-only under /refs), /dev/shm."""
    vols: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if config is not None:
        vols.append({"name": "trex-config", "configMap": {"name": config}})
        mounts.append({"name": "trex-config", "mountPath": CONFIG_DIR, "readOnly": True})
        if rank_table is not None and rank_table.rank_table_mounted_separately:
            key = rank_table.rank_table_file_name
            vols.append({"name": "rank-table", "configMap": {"name": config, "items": [{"key": key, "path": key}]}})
            mounts.append({"name": "rank-table", "mountPath": rank_table.rank_table_dir, "readOnly": True})
    if kernels_from is not None:
        vols.append({"name": "trex-kernels", "configMap": {"name": kernels_config_map_name(kernels_from)}})
        mounts.append({"name": "trex-kernels", "mountPath": KERNELS_DIR, "readOnly": True})
    for key, path in storage_mounts(spec).items():
        storage: StorageSpec = getattr(spec.volumes, key)
        vols.append({"name": key, **volume_source(storage)})
        mounts.append({"name": key, "mountPath": path})
    for i, ref in enumerate(refs):
        vols.append({"name": f"ref-{i}", **ref.source})
        mounts.append({"name": f"ref-{i}", "mountPath": ref.mount_path, "readOnly": True})
    if spec.device_type != "cpu":
        vols.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return vols, mounts


def env_list(values: dict[str, str], spec: CommonSpec) -> list[dict[str, Any]]:
    """Container env: the contract values, then the user's extra variables (which may not override them)."""
    out: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
    out.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    out.extend({"name": e.name, "value": e.value} for e in spec.env if e.name not in values)
    return out


def pod_image(spec: CommonSpec, defaults: ClusterDefaults) -> str:
    """The workload image: spec.image, else the cluster's default image for the job's deviceType."""
    return spec.image or defaults.image(spec.device_type)


def scrape_annotations(spec: CommonSpec) -> dict[str, str]:
    """prometheus.io annotations for plain Prometheus pod discovery of the workload's metrics port."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(spec.metrics_port),
            "prometheus.io/path": "/metrics"}


WORKLOAD_UID = 65532
"""The uid and gid the trex workload images run as (images/*.Dockerfile: USER 65532:65532)."""


def pod_security_context(image_user: bool = True) -> dict[str, Any]:
    """The pod-level securityContext of workload pods: the Pod Security "restricted" profile's pod fields,
    and (``image_user``, for the trex images) the image's non-root uid/gid, with fsGroup so volumes that
    support ownership management (PVCs, emptyDir) are writable by it. hostPath volumes are not chowned."""
    out: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if image_user:
        out.update({"runAsNonRoot": True, "runAsUser": WORKLOAD_UID, "runAsGroup": WORKLOAD_UID,
                    "fsGroup": WORKLOAD_UID, "fsGroupChangePolicy": "OnRootMismatch"})
    return out


def container_security_context() -> dict[str, Any]:
    """The container securityContext: no privilege escalation and no capabilities. The sandbox needs
    none: it isolates with rlimits, a pids cgroup where writable, bubblewrap or its own user and mount
    namespaces where the pod's seccomp, AppArmor and /proc settings allow them (RuntimeDefault does not;
    docs/cluster.md lists what must be allowed) and its in-process guards otherwise."""
    return {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]}}


def pod(job: JobCtx, spec: CommonSpec, *, name: str, role: str, attempt: int, command: list[str],
        env: dict[str, str], devices: int, defaults: ClusterDefaults, index: int | None = None,
        hostname: str | None = None, config: str | None = None, kernels_from: str | None = None,
        gang_size: int = 1, config_text: str | None = None, refs: tuple[RefMount, ...] = (),
        rank_table: bool = False) -> Manifest:
    """A workload pod: one container running ``command`` with the env contract, devices and volumes.

    ``config_text`` (the rendered workload config) is hashed into an annotation, so a config change
    is visible on the pod and restarts the gang. ``defaults`` supply the image, gang scheduling, device
    resource, scrape annotations and (with ``rank_table``) where the HCCL rank table is mounted.
    """
    extra = {LABEL_ROLE: role, LABEL_ATTEMPT: str(attempt)}
    if index is not None:
        extra[LABEL_INDEX] = str(index)
    labels = child_labels(job, **extra)
    annotations: dict[str, str] = scrape_annotations(spec) if defaults.scrape_annotations else {}
    if config_text is not None:
        annotations["trex.dev/config-hash"] = hashlib.sha256(config_text.encode()).hexdigest()[:16]
    pod_spec: dict[str, Any] = {"restartPolicy": "Never"}
    sched = spec.scheduling
    gang = effective_gang(sched, defaults, spec.device_type)
    if gang.gang == "volcano":
        pod_spec["schedulerName"] = "volcano"
        annotations[VOLCANO_GROUP_ANNOTATION] = job.name
    elif gang.gang == "kueue" and gang.queue:
        labels[KUEUE_QUEUE_LABEL] = gang.queue
        labels[KUEUE_GROUP_LABEL] = f"{job.name}-{attempt}"
        annotations[KUEUE_GROUP_COUNT] = str(gang_size)
    if sched.priority_class_name:
        pod_spec["priorityClassName"] = sched.priority_class_name
    vols, mounts = volumes(job, spec, config=config, kernels_from=kernels_from, refs=refs,
                           rank_table=defaults if rank_table else None)
    # npu images run the command through their entrypoint, which sources CANN's set_env.sh (as CANN images do)
    argv_key = "args" if spec.device_type == "npu" else "command"
    container: dict[str, Any] = {
        "name": "trex", "image": pod_image(spec, defaults), "imagePullPolicy": spec.image_pull_policy, argv_key: command,
        "env": env_list(env, spec), "ports": [{"name": "metrics", "containerPort": spec.metrics_port, "protocol": "TCP"}],
        "terminationMessagePolicy": "FallbackToLogsOnError", "terminationMessagePath": "/dev/termination-log",
        "volumeMounts": mounts, "securityContext": container_security_context(),
    }
    res = pod_resources(spec, devices, defaults)
    if res:
        container["resources"] = res
    pod_spec["containers"] = [container]
    pod_spec["volumes"] = vols
    # workload pods never call the API server, and eval / ORData pods run untrusted code: no token
    pod_spec["automountServiceAccountToken"] = False
    pod_spec["securityContext"] = pod_security_context()
    if hostname is not None:
        pod_spec["hostname"] = hostname
        pod_spec["subdomain"] = service_name(job)
    selector = node_selector(spec, defaults)
    if selector:
        pod_spec["nodeSelector"] = selector
    if spec.device_type == "npu" and index is not None:
        annotations[RANK_INDEX_ANNOTATION] = str(index)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    if spec.service_account_name:
        pod_spec["serviceAccountName"] = spec.service_account_name
    runtime_class = getattr(spec, "runtime_class_name", None)  # ORData and eval pods run untrusted programs
    if runtime_class:
        pod_spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata(job, name, labels, annotations or None),
            "spec": pod_spec}


def contract_env(job: JobCtx, spec: CommonSpec, *, attempt: int, config_path: str, master_addr: str,
                 nnodes: int, node_rank: int, nproc: int) -> dict[str, str]:
    """The pod env contract of DESIGN.md (read by trex.runtime.env)."""
    return {
        "TREX_JOB_KIND": job.kind, "TREX_JOB_NAME": job.name, "TREX_ATTEMPT": str(attempt),
        "TREX_CONFIG": config_path, "MASTER_ADDR": master_addr, "MASTER_PORT": str(MASTER_PORT),
        "WORLD_SIZE": str(nnodes * nproc), "RANK": str(node_rank * nproc), "NNODES": str(nnodes),
        "NODE_RANK": str(node_rank), "NPROC_PER_NODE": str(nproc), "TREX_METRICS_PORT": str(spec.metrics_port),
    }


def volcano_pod_group(job: JobCtx, spec: CommonSpec, min_member: int, gang: EffectiveGang,
                      annotations: dict[str, str] | None = None) -> Manifest:
    """A Volcano PodGroup: the scheduler binds all ``min_member`` pods at once or none (in ``gang.queue``);
    ``annotations`` carry scheduler-plugin hints (MindCluster's sp-block and schedule policy)."""
    pg_spec: dict[str, Any] = {"minMember": min_member}
    if gang.queue:
        pg_spec["queue"] = gang.queue
    if spec.scheduling.priority_class_name:
        pg_spec["priorityClassName"] = spec.scheduling.priority_class_name
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": metadata(job, job.name, annotations=annotations), "spec": pg_spec}
