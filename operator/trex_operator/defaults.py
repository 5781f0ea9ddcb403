"""Cluster defaults the Helm chart passes the operator (TREX_* env vars), parsed once at start-up.

The planners read them from :attr:`trex_operator.plan.Observed.defaults`, so every decision stays a
pure function of (job, observed). Unset or empty variables fall back to the built-in values, which
reproduce the operator's behaviour without the chart.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from trex.config_base import DNS1123_LABEL

from trex_operator.api import DEFAULT_IMAGES, SchedulingSpec

Gang = Literal["none", "volcano", "kueue"]
GANGS: tuple[Gang, ...] = ("none", "volcano", "kueue")
CONFIG_DIR = "/etc/trex"
"""Where a job's ConfigMap is mounted in its pods (also the built-in rank table directory)."""
RESERVED_DIRS = ("/etc/trex-kernels", "/dev/shm", "/refs")
"""Mount points the operator uses for other volumes: the rank table may not go there."""
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
# An extended resource: <DNS-1123 subdomain>/<name> (Kubernetes qualified name).
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                       r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_CONFIG_KEY = re.compile(r"^[-._A-Za-z0-9]+$")
_IMAGE = re.compile(r"^[^\s]+$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def _builtin_images() -> Mapping[str, str]:
    return MappingProxyType(dict(DEFAULT_IMAGES))


@dataclass(frozen=True)
class ClusterDefaults:
    """What the cluster administrator chose for jobs that leave a field unset (see docs/cluster.md)."""

    images: Mapping[str, str] = field(default_factory=_builtin_images)
    """Workload image per deviceType (cpu, gpu, npu) for jobs without spec.image."""
    rollout_images: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Rollout server image per deviceType (gpu, npu) the administrator chose for TrainJobs whose
    spec.rollout.server names none (unset: vLLM on gpu, vllm-ascend on npu)."""
    scrape_annotations: bool = False
    """Annotate workload pods with prometheus.io/scrape, /port and /path."""
    default_gang: Gang = "none"
    """Gang scheduling of jobs without spec.scheduling.gang."""
    volcano_enabled: bool = True
    """Volcano is installed (gang: volcano is allowed)."""
    volcano_default_queue: str | None = None
    """Volcano queue of jobs that name none (None: Volcano's own default)."""
    kueue_enabled: bool = True
    """Kueue is installed (gang: kueue is allowed)."""
    kueue_default_queue: str | None = None
    """Kueue LocalQueue of jobs that name none (None: such jobs fail with InvalidSpec)."""
    npu_resource: str = "huawei.com/Ascend910"
    """Extended resource of the Ascend device plugin."""
    npu_mindcluster: bool = True
    """NPUs come from MindCluster's Ascend device plugin in its Volcano mode, which allocates NPUs only to pods
    Volcano's huawei-npu plugin placed (and annotated): npu jobs default to, and must use, gang volcano."""
    npu_accelerator_type: str | None = None
    """nodeSelector accelerator-type of npu pods that set none (e.g. module-910b-8): Volcano's huawei-npu plugin
    picks its topology handler from it (None: the job's own nodeSelector decides)."""
    hccl_connect_timeout_s: int = 1200
    """HCCL_CONNECT_TIMEOUT of npu TrainJob pods (s, 120..7200): how long HCCL waits for every rank to connect."""
    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource of the NVIDIA device plugin."""
    rank_table_dir: str = CONFIG_DIR
    """Directory of the HCCL rank table in TrainJob pods on npu."""
    rank_table_file_name: str = "hccl.json"
    """File name of the rank table (also its key in the job's ConfigMap)."""

    @property
    def rank_table_file(self) -> str:
        """RANK_TABLE_FILE: the rank table's path in the pods."""
        return f"{self.rank_table_dir.rstrip('/')}/{self.rank_table_file_name}"

    @property
    def rank_table_mounted_separately(self) -> bool:
        """True when the rank table needs its own volume (its directory is not the config directory)."""
        return self.rank_table_dir.rstrip("/") != CONFIG_DIR

    @staticmethod
    def from_env(env: Mapping[str, str]) -> ClusterDefaults:
        """Parse the TREX_* variables of ``env``; a bad value raises ValueError naming the variable."""
        base = ClusterDefaults()

        def get(name: str) -> str | None:
            raw = env.get(name)
            return raw.strip() if raw is not None and raw.strip() else None

        images = dict(base.images)
        for device in ("cpu", "gpu", "npu"):
            name = f"TREX_DEFAULT_IMAGE_{device.upper()}"
            value = get(name)
            if value is not None:
                if not _IMAGE.match(value):
                    raise ValueError(f"environment variable {name}={value!r} is not an image reference")
                images[device] = value
        rollout_images = {}
        for device in ("gpu", "npu"):
            name = f"TREX_DEFAULT_ROLLOUT_IMAGE_{device.upper()}"
            value = get(name)
            if value is not None:
                if not _IMAGE.match(value):
                    raise ValueError(f"environment variable {name}={value!r} is not an image reference")
                rollout_images[device] = value
        gang = get("TREX_DEFAULT_GANG")
        if gang is not None and gang not in GANGS:
            raise ValueError(f"environment variable TREX_DEFAULT_GANG={gang!r} must be one of {', '.join(GANGS)}")
        out = ClusterDefaults(
            images=MappingProxyType(images),
            rollout_images=MappingProxyType(rollout_images),
            scrape_annotations=_bool(env, "TREX_SCRAPE_ANNOTATIONS", base.scrape_annotations),
            default_gang=gang if gang is not None else base.default_gang,
            volcano_enabled=_bool(env, "TREX_VOLCANO_ENABLED", base.volcano_enabled),
            volcano_default_queue=_queue(get("TREX_VOLCANO_DEFAULT_QUEUE"), "TREX_VOLCANO_DEFAULT_QUEUE"),
            kueue_enabled=_bool(env, "TREX_KUEUE_ENABLED", base.kueue_enabled),
            kueue_default_queue=_queue(get("TREX_KUEUE_DEFAULT_QUEUE"), "TREX_KUEUE_DEFAULT_QUEUE"),
            npu_resource=_resource(get("TREX_NPU_RESOURCE"), "TREX_NPU_RESOURCE", base.npu_resource),
            npu_mindcluster=_bool(env, "TREX_NPU_MINDCLUSTER", base.npu_mindcluster),
            npu_accelerator_type=_label_value(get("TREX_NPU_ACCELERATOR_TYPE"), "TREX_NPU_ACCELERATOR_TYPE"),
            hccl_connect_timeout_s=_int_range(get("TREX_HCCL_CONNECT_TIMEOUT"), "TREX_HCCL_CONNECT_TIMEOUT",
                                              base.hccl_connect_timeout_s, 120, 7200),
            gpu_resource=_resource(get("TREX_GPU_RESOURCE"), "TREX_GPU_RESOURCE", base.gpu_resource),
            rank_table_dir=get("TREX_RANK_TABLE_DIR") or base.rank_table_dir,
            rank_table_file_name=get("TREX_RANK_TABLE_FILE_NAME") or base.rank_table_file_name,
        )
        out._check()
        return out

    def _check(self) -> None:
        d, f = self.rank_table_dir, self.rank_table_file_name
        if not d.startswith("/") or "/../" in f"{d}/" or "/./" in f"{d}/":
            raise ValueError(f"environment variable TREX_RANK_TABLE_DIR={d!r} must be a normalised absolute path")
        if any(d.rstrip("/") == r or d.startswith(r + "/") for r in RESERVED_DIRS) or d.rstrip("/") == "":
            raise ValueError(f"environment variable TREX_RANK_TABLE_DIR={d!r} collides with a directory the "
                             f"operator mounts ({', '.join(RESERVED_DIRS)} or /)")
        if not _CONFIG_KEY.match(f) or f in (".", "..") or len(f) > 253:
            raise ValueError(f"environment variable TREX_RANK_TABLE_FILE_NAME={f!r} must be a plain file name "
                             "(letters, digits, '-', '_', '.')")
        if not self.rank_table_mounted_separately and f == "trainer.yaml":
            raise ValueError("environment variable TREX_RANK_TABLE_FILE_NAME='trainer.yaml' would replace the "
                             "trainer configuration")
        if self.default_gang == "volcano" and not self.volcano_enabled:
            raise ValueError("environment variable TREX_DEFAULT_GANG='volcano' needs TREX_VOLCANO_ENABLED=true")
        if self.default_gang == "kueue" and not self.kueue_enabled:
            raise ValueError("environment variable TREX_DEFAULT_GANG='kueue' needs TREX_KUEUE_ENABLED=true")

    def image(self, device_type: str) -> str:
        """The default workload image for ``device_type``."""
        return self.images[device_type]

    def device_resource(self, device_type: str) -> str | None:
        """The extended resource a pod of ``device_type`` requests (None for cpu)."""
        return {"npu": self.npu_resource, "gpu": self.gpu_resource}.get(device_type)


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"environment variable {name}={raw!r} is not a boolean (true or false)")


def _queue(value: str | None, name: str) -> str | None:
    if value is not None and (len(value) > 63 or not DNS1123_LABEL.match(value)):
        raise ValueError(f"environment variable {name}={value!r} is not a queue name (DNS-1123 label)")
    return value


def _label_value(value: str | None, name: str) -> str | None:
    if value is not None and not _LABEL_VALUE.match(value):
        raise ValueError(f"environment variable {name}={value!r} is not a label value (at most 63 letters, digits, "
                         "'-', '_', '.', starting and ending with a letter or digit)")
    return value


def _int_range(value: str | None, name: str, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    try:
        out = int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None
    if not low <= out <= high:
        raise ValueError(f"environment variable {name}={out} must be between {low} and {high}")
    return out


def _resource(value: str | None, name: str, default: str) -> str:
    if value is None:
        return default
    if not _RESOURCE.match(value) or len(value) > 253:
        raise ValueError(f"environment variable {name}={value!r} is not an extended resource name "
                         "(<domain>/<name>, e.g. nvidia.com/gpu)")
    return value


@dataclass(frozen=True)
class EffectiveGang:
    """The gang scheduling a job gets once the cluster defaults are applied."""

    gang: Gang
    queue: str | None


class GangError(ValueError):
    """A job whose effective gang scheduling this cluster cannot honour (the job fails with InvalidSpec)."""


def effective_gang(scheduling: SchedulingSpec, defaults: ClusterDefaults, device_type: str = "cpu") -> EffectiveGang:
    """spec.scheduling with the cluster defaults applied: an explicit gang or queue always wins.

    Raises GangError when the effective gang is disabled on this cluster, or is kueue without a queue, or is
    not volcano for an npu job on a MindCluster cluster (whose device plugin would refuse the pods).
    """
    if device_type == "npu" and defaults.npu_mindcluster:
        return _mindcluster_gang(scheduling, defaults)
    gang: Gang = scheduling.gang if scheduling.gang is not None else defaults.default_gang
    source = "spec.scheduling.gang" if scheduling.gang is not None else "the cluster default gang (TREX_DEFAULT_GANG)"
    if gang == "volcano":
        if not defaults.volcano_enabled:
            raise GangError(f"scheduling.gang: {source} is 'volcano' but this cluster has Volcano disabled "
                            "(volcano.enabled=false)")
        return EffectiveGang("volcano", scheduling.queue or defaults.volcano_default_queue)
    if gang == "kueue":
        if not defaults.kueue_enabled:
            raise GangError(f"scheduling.gang: {source} is 'kueue' but this cluster has Kueue disabled "
                            "(kueue.enabled=false)")
        queue = scheduling.queue or defaults.kueue_default_queue
        if not queue:
            raise GangError("scheduling.queue: required with gang 'kueue' (the LocalQueue to submit to); "
                            "neither spec.scheduling.queue nor the cluster default (kueue.defaultQueue) is set")
        return EffectiveGang("kueue", queue)
    return EffectiveGang("none", scheduling.queue)


def _mindcluster_gang(scheduling: SchedulingSpec, defaults: ClusterDefaults) -> EffectiveGang:
    why = ("this cluster's Ascend device plugin (MindCluster, npu.mindcluster=true) allocates NPUs only to pods "
           "that Volcano's huawei-npu plugin scheduled; kubelet rejects any other pod")
    if scheduling.gang not in (None, "volcano"):
        raise GangError(f"scheduling.gang: {scheduling.gang!r} cannot run deviceType npu here: {why}; use gang "
                        "'volcano' (the default for npu jobs)")
    if not defaults.volcano_enabled:
        raise GangError(f"deviceType: npu needs Volcano on this cluster ({why}) but Volcano is disabled "
                        "(volcano.enabled=false)")
    return EffectiveGang("volcano", scheduling.queue or defaults.volcano_default_queue)
