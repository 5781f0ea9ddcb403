"""CRD envelopes for the four job kinds: common pod fields, the workload section, references, status.

These pydantic models are the single source of truth: the CRD YAML in crds/ is generated from them
(`trex crds`), `trex validate` checks manifests with them, and the operator parses specs with them.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator
from trex.config_base import DNS1123_LABEL, TrexModel, check_dns1123_label
from trex.evaluation.config import EvalConfig
from trex.kernels.config import KernelTuneConfig
from trex.ordata.config import ORDataConfig
from trex.trainer.config import TrainerConfig
from trex.trainer.mfu import DEFAULT_DEVICE_MODEL, DEVICES, DeviceSku
from trex.trainer.rules import GRPO_NEEDS_PROMPTS, job_problems

GROUP = "trex.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
DEFAULT_IMAGES: dict[str, str] = {
    "cpu": "ghcr.io/trex-dev/trex-workload-cpu:0.1.0",
    "gpu": "ghcr.io/trex-dev/trex-workload-cuda:0.1.0",
    "npu": "ghcr.io/trex-dev/trex-workload-ascend:0.1.0",
}
"""Built-in workload image per deviceType (the images/ builds); the operator's TREX_DEFAULT_IMAGE_* override them."""
DEFAULT_IMAGE = DEFAULT_IMAGES["cpu"]
DEFAULT_ROLLOUT_IMAGES: dict[str, str] = {
    "gpu": "vllm/vllm-openai:v0.32.0",
    "npu": "quay.io/ascend/vllm-ascend:v0.23.0",
}
"""Rollout server image per deviceType when spec.rollout.server.image is unset: vLLM on GPUs, vllm-ascend on NPUs
(on Atlas A3 dies, deviceModel 910c, the release's -a3 build)."""
NPU_DEVICES_PER_REPLICA = (1, 2, 4, 8, 16)
QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "m": 1e-3}
PHASES = ("Pending", "Starting", "Running", "Restarting", "Suspended", "Succeeded", "Failed")
_DNS_SCHEMA: dict[str, Any] = {"pattern": DNS1123_LABEL.pattern, "maxLength": 63}
Phase = Literal["Pending", "Starting", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]


class ObjectMeta(TrexModel):
    """The parts of Kubernetes object metadata trex reads; server-set fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    name: str
    """Object name (DNS-1123 label: lowercase letters, digits and '-', at most 63 characters)."""
    namespace: str | None = None
    """Namespace (default: the current one)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels, copied to every child object."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_dns1123_label(v, "")


class Toleration(TrexModel):
    """A pod toleration (as in core/v1)."""

    key: str | None = None
    """Taint key (unset with operator Exists = all taints)."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists or Equal."""
    value: str | None = None
    """Taint value for Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect (unset = all)."""
    toleration_seconds: int | None = Field(default=None, ge=0)
    """NoExecute: seconds to stay bound after the taint appears."""


Quantity = int | str


class ResourceSpec(TrexModel):
    """Extra resource requests/limits per replica; device resources are added from deviceType."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Requests, e.g. {cpu: 8, memory: 64Gi}."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Limits, e.g. {memory: 64Gi}."""

    @model_validator(mode="after")
    def _quantities(self) -> ResourceSpec:
        for section, values in (("requests", self.requests), ("limits", self.limits)):
            for k, v in values.items():
                if isinstance(v, int):
                    if v < 0:
                        raise ValueError(f"{section}.{k}: quantity must not be negative, got {v}")
                elif not QUANTITY.match(v) or v.startswith("-"):
                    raise ValueError(f"{section}.{k}: {v!r} is not a Kubernetes quantity (e.g. 500m, 4, 16Gi)")
        return self


class SchedulingSpec(TrexModel):
    """Gang scheduling and priority."""

    gang: Literal["none", "volcano", "kueue"] | None = None
    """none; volcano (a PodGroup); kueue (queue label, suspend honoured); unset = the cluster default gang."""
    queue: str | None = Field(default=None, json_schema_extra=_DNS_SCHEMA)
    """Volcano queue or Kueue LocalQueue; unset = the cluster default queue (kueue needs one: else InvalidSpec)."""
    priority_class_name: str | None = None
    """PriorityClass of the pods."""

    @model_validator(mode="after")
    def _check(self) -> SchedulingSpec:
        # gang kueue without a queue is valid here: the cluster default queue applies, and the operator
        # fails the job (InvalidSpec) when there is none (trex_operator.defaults.effective_gang).
        if self.queue is not None:
            check_dns1123_label(self.queue, "queue:")
        return self


class RunPolicy(TrexModel):
    """Restarts, deadlines, suspension and cleanup."""

    backoff_limit: int = Field(default=3, ge=0, le=1000)
    """Genuine failures tolerated (gang restarts) before the job fails; preemption does not count."""
    active_deadline_seconds: int | None = Field(default=None, gt=0, le=366 * 86400)
    """Fail the job when it runs longer than this (s)."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=366 * 86400)
    """Delete the job this long after it finished (s)."""
    suspend: bool = False
    """Suspend: delete the pods (keep config); resume recreates them."""
    clean_pod_policy: Literal["None", "Running", "All"] = "Running"
    """Pods deleted when the job ends: None, those still Running, or All."""
    dependency_timeout_seconds: int = Field(default=3600, gt=0, le=30 * 86400)
    """How long to wait for referenced jobs before failing (s)."""
    stall_seconds: int = Field(default=1800, gt=0, le=7 * 86400)
    """No progress for this long adds a Stalled condition (s)."""


class StorageSpec(TrexModel):
    """Where a volume comes from: exactly one of claimName, hostPath, emptyDir."""

    claim_name: str | None = Field(default=None, json_schema_extra=_DNS_SCHEMA)
    """PersistentVolumeClaim name."""
    host_path: str | None = None
    """Host directory (single-node or development clusters)."""
    empty_dir: bool = False
    """Scratch space that lives as long as the pod."""
    mount_path: str | None = None
    """Mount path in the container (default /data, /checkpoints or /output)."""

    @model_validator(mode="after")
    def _one(self) -> StorageSpec:
        chosen = [n for n, v in (("claimName", self.claim_name), ("hostPath", self.host_path),
                                  ("emptyDir", self.empty_dir or None)) if v]
        if len(chosen) != 1:
            raise ValueError(f"claimName: exactly one of claimName, hostPath, emptyDir must be set (got {chosen or 'none'})")
        if self.claim_name is not None:
            check_dns1123_label(self.claim_name, "claimName:")
        for p in (self.host_path, self.mount_path):
            if p is not None and not p.startswith("/"):
                raise ValueError(f"mountPath: path {p!r} must be absolute")
        return self


class VolumesSpec(TrexModel):
    """Volumes mounted into every pod of the job."""

    data: StorageSpec | None = None
    """Input data (mounted at /data)."""
    checkpoints: StorageSpec | None = None
    """Checkpoints (mounted at /checkpoints); must be shared by all replicas for resume."""
    output: StorageSpec | None = None
    """Outputs (mounted at /output)."""


class EnvVar(TrexModel):
    """An extra environment variable."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Variable name."""
    value: str
    """Value."""


class CommonSpec(TrexModel):
    """Fields every job kind shares: image, replicas, devices, placement, scheduling, run policy."""

    image: str | None = None
    """Workload container image; unset = the operator's default workload image for deviceType."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Image pull policy."""
    replicas: int = Field(default=1, gt=0, le=4096)
    """Pods (one per node for multi-device jobs)."""
    devices_per_replica: int = Field(default=1, gt=0, le=64)
    """Accelerators per pod (npu: 1, 2, 4, 8 or 16); one worker process per device."""
    device_type: Literal["npu", "gpu", "cpu"] = "cpu"
    """npu or gpu (the cluster's device resource, default huawei.com/Ascend910 / nvidia.com/gpu) or cpu."""
    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    """Extra CPU/memory requests and limits per pod."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node selector."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Tolerations."""
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    """Gang scheduling and priority."""
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    """Restarts, deadlines, suspension, cleanup."""
    volumes: VolumesSpec = Field(default_factory=VolumesSpec)
    """Data, checkpoint and output volumes."""
    metrics_port: int = Field(default=9400, ge=1024, le=65_535)
    """Prometheus port each pod serves."""
    env: list[EnvVar] = Field(default_factory=list)
    """Extra environment variables."""
    service_account_name: str | None = None
    """ServiceAccount of the pods (workloads need no RBAC)."""

    @model_validator(mode="after")
    def _devices(self) -> CommonSpec:
        if self.device_type == "npu" and self.devices_per_replica not in NPU_DEVICES_PER_REPLICA:
            raise ValueError(
                f"devicesPerReplica: {self.devices_per_replica} is not allowed for deviceType npu; "
                f"allowed: {', '.join(map(str, NPU_DEVICES_PER_REPLICA))}"
            )
        return self


class JobRef(TrexModel):
    """A reference to another trex job in the same namespace."""

    name: str = Field(json_schema_extra=_DNS_SCHEMA)
    """Name of the referenced job (DNS-1123 label)."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_dns1123_label(v, "")


class CheckpointRef(JobRef):
    """A TrainJob checkpoint."""

    step: int | None = Field(default=None, ge=0)
    """Checkpoint step (unset = the latest verified one)."""


def memory_bytes(quantity: int | str) -> int:
    """Bytes of a Kubernetes memory quantity (64Gi, 500M, 1e9, 1024)."""
    if isinstance(quantity, int):
        return quantity
    m = re.fullmatch(r"([0-9.]+(?:[eE][+-]?[0-9]+)?)([kMGTP]i?|m)?", quantity.strip())
    if m is None:
        raise ValueError(f"{quantity!r} is not a memory quantity (e.g. 64Gi)")
    return int(float(m.group(1)) * _SUFFIX[m.group(2) or ""])


class RolloutServerSpec(TrexModel):
    """vLLM servers the operator runs beside the training gang (one Deployment per replica, one headless Service):
    modes grpo and opd generate on them and push each step's weights to them."""

    image: str | None = None
    """Server image; unset = vLLM (vllm/vllm-openai) on gpu, vllm-ascend on npu (cpu needs one)."""
    args: list[str] = Field(default_factory=list)
    """Extra `vllm serve` arguments (after the model folder, port and tensor-parallel size the operator sets)."""
    replicas: int = Field(default=1, gt=0, le=256)
    """Server replicas; each is one URL in trainer.rollout.servers and receives every weight push."""
    devices_per_replica: int = Field(default=1, ge=0, le=64)
    """Accelerators per server replica (of the job's deviceType; vLLM's tensor-parallel size); counted apart from
    the trainer's devices."""
    port: int = Field(default=8000, ge=1024, le=65_535)
    """Port of the OpenAI-compatible API."""
    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    """Extra CPU/memory requests and limits per server pod."""
    ready_timeout_seconds: int = Field(default=1800, gt=0, le=86400)
    """A server not ready for this long (loading, crashing) fails the job instead of leaving it waiting (s)."""

    def memory_utilization(self) -> float:
        """The share of each device vLLM uses: --gpu-memory-utilization in args, else vLLM's default."""
        from trex.trainer.engine_plan import VLLM_MEMORY_UTILIZATION

        value = self._arg("--gpu-memory-utilization")
        return VLLM_MEMORY_UTILIZATION if value is None else self._number(value, "--gpu-memory-utilization", float)

    def max_model_len(self) -> int | None:
        """The longest sequence a server takes: --max-model-len in args (None: the model's own)."""
        value = self._arg("--max-model-len")
        return None if value is None else int(self._number(value, "--max-model-len", int))

    def _arg(self, name: str) -> str | None:
        """The value of ``name`` in args (``--name value`` or ``--name=value``; the last one wins, as in argparse)."""
        found = None
        for i, a in enumerate(self.args):
            if a.startswith(name + "="):
                found = a.partition("=")[2]
            elif a == name and i + 1 < len(self.args):
                found = self.args[i + 1]
        return found

    @staticmethod
    def _number(value: str, name: str, kind: type[float] | type[int]) -> float:
        try:
            return kind(value)
        except ValueError:
            raise ValueError(f"args: {name} {value!r} is not {'a number' if kind is float else 'an integer'}") from None

    @model_validator(mode="after")
    def _args(self) -> RolloutServerSpec:
        util = self.memory_utilization()
        if not 0 < util <= 1:
            raise ValueError(f"args: --gpu-memory-utilization {util} must be in (0, 1]")
        n = self.max_model_len()
        if n is not None and n <= 0:
            raise ValueError(f"args: --max-model-len {n} must be positive")
        return self


class RolloutSpec(TrexModel):
    """Rollout infrastructure of modes grpo and opd."""

    server: RolloutServerSpec | None = None
    """Run vLLM servers for the job's lifetime (sets trainer.rollout.engine vllm and trainer.rollout.servers)."""


DeviceModel = Literal["910b", "910c", "h100", "h200", "h800", "a100"]


class TrainJobSpec(CommonSpec):
    """A TrainJob: `replicas` pods x `devicesPerReplica` trainer processes."""

    trainer: TrainerConfig
    """The trainer configuration (same schema as `trex train --config`)."""
    data_from: JobRef | None = None
    """Train on the output of this ORDataJob (sets trainer.data.train)."""
    kernels_from: JobRef | None = None
    """Use the tuned kernels of this KernelTuneJob (sets trainer.kernels.registry to the registry it mounts)."""
    model_from: CheckpointRef | None = None
    """Start from this TrainJob's Hugging Face export (its final one, or step's with its exportHfEvery): sets
    trainer.checkpoint.initFromHf and, when unset, trainer.data.tokenizer.path to its tokenizer (SFT, then GRPO)."""
    device_model: DeviceModel | None = None
    """Accelerator model the memory plan is checked against (`trex plan`): 910b, 910c (one die), h100, h200,
    h800 or a100; unset = 910b for npu, h100 for gpu. cpu jobs are checked against resources.limits.memory
    (else requests.memory) / devicesPerReplica, and not at all when neither is set."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """Rollout servers (modes grpo and opd): vLLM Deployments + a Service the operator runs beside the gang."""

    def device(self) -> DeviceSku:
        """The catalog entry of the devices this job runs on."""
        return DEVICES[self.device_model or DEFAULT_DEVICE_MODEL[self.device_type]]

    def rollout_trainer(self, servers: list[str] | None = None) -> TrainerConfig:
        """The trainer config the pods run: with rollout.server, engine vllm on ``servers`` (the operator passes the
        servers' URLs; validation, which knows no job name, one URL per replica on the Service's port)."""
        srv = self.rollout.server
        if srv is None:
            return self.trainer
        urls = servers if servers is not None else [f"http://rollout-{i}:{srv.port}" for i in range(srv.replicas)]
        rollout = self.trainer.rollout.model_copy(update={"engine": "vllm", "servers": urls})
        return self.trainer.model_copy(update={"rollout": rollout})

    def rollout_image(self) -> str:
        """The rollout servers' image: rollout.server.image, else the default for the job's devices."""
        srv = self.rollout.server
        if srv is not None and srv.image is not None:
            return srv.image
        image = DEFAULT_ROLLOUT_IMAGES[self.device_type]
        return f"{image}-a3" if self.device_model == "910c" else image

    def rollout_problem(self) -> str | None:
        """Why spec.rollout.server cannot run as asked (``field: message``), else None."""
        srv, trainer = self.rollout.server, self.trainer
        if srv is None:
            return None
        if trainer.mode not in ("grpo", "opd"):
            return f"rollout.server: only modes grpo and opd roll out; trainer.mode is {trainer.mode!r}"
        if trainer.rollout.servers:
            return "trainer.rollout.servers: rollout.server fills it with its servers' URLs; set one of the two"
        if "engine" in trainer.rollout.model_fields_set and trainer.rollout.engine != "vllm":
            return "trainer.rollout.engine: rollout.server runs vLLM servers; set vllm or leave it unset"
        if srv.image is None and self.device_type not in DEFAULT_ROLLOUT_IMAGES:
            return (f"rollout.server.image: no default server image for deviceType {self.device_type!r} (vLLM on gpu, "
                    "vllm-ascend on npu); set one")
        if self.device_type != "cpu" and srv.devices_per_replica == 0:
            return f"rollout.server.devicesPerReplica: a deviceType {self.device_type} server needs at least 1"
        if self.device_type == "npu" and srv.devices_per_replica not in NPU_DEVICES_PER_REPLICA:
            return (f"rollout.server.devicesPerReplica: {srv.devices_per_replica} is not allowed for deviceType npu; "
                    f"allowed: {', '.join(map(str, NPU_DEVICES_PER_REPLICA))}")
        ckpt = self.volumes.checkpoints
        if ckpt is None or ckpt.empty_dir:
            return ("volumes.checkpoints: rollout.server loads the weight folders the trainer writes to its checkpoint "
                    "volume; set a claimName or hostPath both can mount")
        if self.model_from is None and trainer.checkpoint.init_from_hf is None:
            return ("rollout.server: vLLM starts from a Hugging Face folder; set modelFrom or "
                    "trainer.checkpoint.initFromHf")
        return None

    def server_memory_problem(self) -> str | None:
        """The rollout server's devices, planned apart from the trainer's: refused when one replica's weights
        shard and KV cache exceed a device's memory x vLLM's memory utilization."""
        srv = self.rollout.server
        if srv is None or self.device_type == "cpu":
            return None
        from trex.trainer.engine_plan import server_plan
        from trex.trainer.plan import gib

        plan = server_plan(self.trainer, srv.devices_per_replica, srv.replicas, self.device(), srv.memory_utilization(),
                           srv.max_model_len())
        if plan.fits is not False:
            return None
        return (f"rollout.server.devicesPerReplica: a server replica needs {gib(plan.total)} per device (weights "
                f"{gib(plan.weights)} over {plan.devices} devices + KV cache {gib(plan.kv_cache)}); {plan.device.name} "
                f"allows {gib(plan.capacity or 0)} (x {srv.memory_utilization()} memory utilization): raise "
                "devicesPerReplica or replicas")

    def device_capacity(self) -> int | None:
        """Bytes one trainer process may use: the device's memory; on cpu the pod's memory / devicesPerReplica."""
        if self.device_type != "cpu":
            return self.device().memory_bytes
        section = "limits" if "memory" in self.resources.limits else "requests"
        value = getattr(self.resources, section).get("memory")
        if value is None:
            return None
        try:
            return memory_bytes(value) // self.devices_per_replica
        except ValueError as e:
            raise ValueError(f"resources.{section}.memory: {e}") from None

    def host_capacity(self) -> int | None:
        """Host bytes one trainer process may use: resources.limits.memory / devicesPerReplica (None: no limit)."""
        value = self.resources.limits.get("memory")
        if value is None:
            return None
        try:
            return memory_bytes(value) // self.devices_per_replica
        except ValueError as e:
            raise ValueError(f"resources.limits.memory: {e}") from None

    @model_validator(mode="after")
    def _fits(self, info: ValidationInfo) -> TrainJobSpec:
        if self.device_model is not None and DEVICES[self.device_model].device_type != self.device_type:
            raise ValueError(f"deviceModel: {self.device_model!r} is a {DEVICES[self.device_model].device_type} "
                             f"device; deviceType is {self.device_type!r}")
        if self.trainer.mode == "grpo" and self.data_from is None and self.trainer.data.train is None:
            raise ValueError(f"trainer.data.train: {GRPO_NEEDS_PROMPTS}")
        if self.model_from is not None and self.trainer.checkpoint.init_from_hf is not None:
            raise ValueError("trainer.checkpoint.initFromHf: modelFrom sets it to the referenced TrainJob's export; "
                             "set one of the two")
        if self.kernels_from is not None and self.trainer.kernels.registry is not None:
            raise ValueError("trainer.kernels.registry: kernelsFrom sets it to the referenced KernelTuneJob's "
                             "registry; set one of the two")
        if self.trainer.model.dtype == "fp64" and self.device_type != "cpu":
            raise ValueError(f"trainer.model.dtype: fp64 is for CPU reference runs; deviceType {self.device_type!r} "
                             "trains in fp32 or bf16")
        # `trex plan` reads a job that may break the trainer rules (context rules=False) to show its plan.
        problem = self.rollout_problem()
        if problem is not None:
            raise ValueError(problem)
        if not (isinstance(info.context, dict) and info.context.get("rules") is False):
            capacity = self.device_capacity()
            problems = job_problems(self.rollout_trainer(), self.replicas * self.devices_per_replica,
                                    self.device() if capacity is not None else None, capacity,
                                    host_capacity=self.host_capacity(), load=self.model_from is not None or None)
            if problems:  # resources.limits.memory (the host rule) is the job's own field, the rest the trainer's
                raise ValueError("\n".join(f"{'' if path.startswith('resources.') else 'trainer.'}{path}: {msg}"
                                            for path, msg in problems))
            problem = self.server_memory_problem()
            if problem is not None:
                raise ValueError(problem)
        if self.data_from is not None and self.trainer.data.train is not None:
            raise ValueError("dataFrom: set either dataFrom or trainer.data.train, not both")
        return self


_BACKEND_DEVICE = {"cpu-c": "cpu", "cuda-triton": "gpu", "npu-ascendc": "npu"}


class KernelTuneJobSpec(CommonSpec):
    """A KernelTuneJob: one pod per backend/device target."""

    kernels: KernelTuneConfig
    """The tuning configuration (same schema as `trex kernels tune --config`)."""

    @model_validator(mode="after")
    def _backend(self) -> KernelTuneJobSpec:
        want = _BACKEND_DEVICE[self.kernels.backend]
        if want != self.device_type:
            raise ValueError(f"deviceType: kernels.backend {self.kernels.backend!r} needs deviceType {want!r}, got {self.device_type!r}")
        return self


class SandboxedPods(TrexModel):
    """Pods that run untrusted programs (generated solver code, model answers) may use a sandboxing runtime."""

    runtime_class_name: str | None = Field(default=None, json_schema_extra=_DNS_SCHEMA)
    """RuntimeClass of these pods (e.g. gVisor or Kata nodes); unset: the cluster's default runtime."""

    @field_validator("runtime_class_name")
    @classmethod
    def _runtime_class(cls, v: str | None) -> str | None:
        return None if v is None else check_dns1123_label(v, "runtimeClassName:")


class ORDataJobSpec(CommonSpec, SandboxedPods):
    """An ORDataJob: an Indexed Job with one completion per shard, then a merge Job."""

    ordata: ORDataConfig
    """The pipeline configuration (same schema as `trex ordata generate --config`)."""
    parallelism: int = Field(default=4, gt=0, le=10_000)
    """Shard pods running at once."""
    backoff_limit_per_index: int = Field(default=2, ge=0, le=100)
    """Retries per shard."""


class ServerSpec(TrexModel):
    """A model server (vLLM-compatible) the operator runs for the job's lifetime."""

    image: str
    """Server image (e.g. a vLLM image)."""
    args: list[str] = Field(default_factory=list)
    """Container arguments (the model path is appended when modelFrom is set)."""
    port: int = Field(default=8000, ge=1, le=65_535)
    """Port of the OpenAI-compatible API."""
    devices: int = Field(default=1, ge=0, le=64)
    """Accelerators for the server pod (of the job's deviceType)."""
    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    """Extra requests/limits."""


class EvalJobSpec(CommonSpec, SandboxedPods):
    """An EvalJob: evaluation pod(s), optionally with an operator-managed model server."""

    evaluation: EvalConfig
    """The evaluation configuration (same schema as `trex eval --config`)."""
    model_from: CheckpointRef | None = None
    """Evaluate this TrainJob's checkpoint."""
    server: ServerSpec | None = None
    """Serve the model with this server (Deployment + Service) for the job's lifetime."""
    pod_per_benchmark: bool = False
    """One pod per benchmark instead of one pod for all."""

    @model_validator(mode="after")
    def _model_source(self) -> EvalJobSpec:
        kind = self.evaluation.model.kind
        if kind == "openai" and self.server is None and not self.evaluation.model.url:
            raise ValueError("evaluation.model.url: required for kind 'openai' unless server is set")
        if self.model_from is not None and kind not in ("trex-checkpoint", "openai"):
            raise ValueError(f"evaluation.model.kind: modelFrom needs 'trex-checkpoint' or 'openai' with a server, got {kind!r}")
        if self.model_from is not None and kind == "openai" and self.server is None:
            raise ValueError("server: modelFrom with evaluation.model.kind 'openai' needs a server (the operator serves the checkpoint)")
        return self


class Condition(TrexModel):
    """A status condition (Kubernetes API conventions)."""

    type: str
    """Condition type, e.g. Ready, Running, Succeeded, Failed, Stalled, WaitingForDependency."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    reason: str = ""
    """CamelCase reason."""
    message: str = ""
    """Human-readable detail."""
    last_transition_time: str | None = None
    """RFC 3339 time of the last status change."""
    observed_generation: int | None = None
    """Generation the condition was computed from."""


class LineageEntry(TrexModel):
    """A job this job took inputs from."""

    kind: str
    """Kind of the referenced job."""
    name: str
    """Name of the referenced job."""
    uid: str | None = None
    """UID at the time it was used."""
    detail: str | None = None
    """What was taken (output path, checkpoint step, kernel registry)."""


class Progress(TrexModel):
    """Live progress (status.progress): a TrainJob's counters scraped from rank 0's metrics, the progress ratio
    of the other pod kinds, an ORDataJob's shard counts. Only the fields a job has reached are written."""

    step: int | None = None
    """Optimizer steps done (TrainJob)."""
    max_steps: int | None = None
    """Steps the run takes (TrainJob)."""
    loss: float | None = None
    """Latest training loss (TrainJob)."""
    mfu: float | None = None
    """Model FLOPs utilisation, 0..1 (TrainJob)."""
    tokens_per_second: float | None = None
    """Training throughput (TrainJob)."""
    last_checkpoint_step: int | None = None
    """Step of the last checkpoint written (TrainJob)."""
    resume_step: int | None = None
    """Checkpoint step a restarted attempt resumes from (TrainJob)."""
    ratio: float | None = None
    """Fraction done, 0..1 (EvalJob, KernelTuneJob)."""
    shards_done: int | None = None
    """Shards generated (ORDataJob)."""
    shards: int | None = None
    """Shards to generate (ORDataJob)."""
    percent: str | None = None
    """Percent done, e.g. 42.0%."""
    updated_at: str | None = None
    """When progress was last scraped (RFC 3339)."""
    step_changed_at: str | None = None
    """When the step last advanced (RFC 3339; the stall check reads it)."""


class BenchmarkResult(TrexModel):
    """One benchmark's result from its eval pod (further keys of the pod's summary are kept)."""

    model_config = ConfigDict(strict=False, extra="allow")

    pass_at1: float | None = Field(default=None, alias="passAt1")
    """Pass@1 on the benchmark, 0..1 (None when no sample was scored)."""
    samples: int | None = None
    """Samples scored."""
    structural_accuracy: float | None = None
    """Share of the samples whose model structure matched the reference."""


class Results(TrexModel):
    """Final results (status.results) from the pods' termination messages: typed where the operator reads or
    prints them; every other key of the summaries is kept as the workload wrote it."""

    model_config = ConfigDict(strict=False, extra="allow")

    pass_at1: float | None = Field(default=None, alias="passAt1")
    """Mean Pass@1 over the benchmarks (EvalJob)."""
    benchmarks: dict[str, BenchmarkResult] | None = None
    """Result per benchmark (EvalJob)."""
    accepted: int | None = None
    """Samples accepted (ORDataJob)."""
    speedup: str | None = None
    """Geomean speedups over eager and over torch.compile, as text (KernelTuneJob)."""


class JobStatus(TrexModel):
    """Observed state, written only by the operator."""

    model_config = ConfigDict(strict=False)

    phase: Phase | None = None
    """Pending, Starting, Running, Restarting, Suspended, Succeeded or Failed."""
    reason: str | None = None
    """Reason of the current phase (e.g. InvalidSpec, BackoffLimitExceeded)."""
    message: str | None = None
    """Detail of the current phase."""
    conditions: list[Condition] = Field(default_factory=list)
    """Conditions."""
    observed_generation: int | None = None
    """Spec generation last reconciled."""
    attempt: int = 0
    """Gang attempt (incremented on every whole-job restart)."""
    restarts: dict[str, int] = Field(default_factory=dict)
    """Restarts by cause (failure, oomKilled, preempted, nodeLost, ...)."""
    start_time: str | None = None
    """When the job started running (RFC 3339)."""
    completion_time: str | None = None
    """When the job finished (RFC 3339)."""
    progress: Progress = Field(default_factory=Progress)
    """Live progress (step, maxSteps, loss, mfu, tokensPerSecond, percent, ...)."""
    results: Results = Field(default_factory=Results)
    """Final results from the pods' termination messages."""
    lineage: list[LineageEntry] = Field(default_factory=list)
    """Jobs this job took inputs from."""


class _Envelope(TrexModel):
    api_version: Literal["trex.dev/v1alpha1"]
    """API group/version."""
    metadata: ObjectMeta
    """Object metadata."""
    status: JobStatus | None = None
    """Status (operator-owned)."""


class TrainJob(_Envelope):
    """A training run of the parallel MoE trainer."""

    kind: Literal["TrainJob"]
    """Kind."""
    spec: TrainJobSpec
    """Desired state."""


class KernelTuneJob(_Envelope):
    """An AuraKernel tuning run."""

    kind: Literal["KernelTuneJob"]
    """Kind."""
    spec: KernelTuneJobSpec
    """Desired state."""


class ORDataJob(_Envelope):
    """A solver-verified OR data generation run."""

    kind: Literal["ORDataJob"]
    """Kind."""
    spec: ORDataJobSpec
    """Desired state."""


class EvalJob(_Envelope):
    """An OR benchmark evaluation run."""

    kind: Literal["EvalJob"]
    """Kind."""
    spec: EvalJobSpec
    """Desired state."""


JobModel = TrainJob | KernelTuneJob | ORDataJob | EvalJob

KINDS: dict[str, type[TrainJob] | type[KernelTuneJob] | type[ORDataJob] | type[EvalJob]] = {
    "TrainJob": TrainJob, "KernelTuneJob": KernelTuneJob, "ORDataJob": ORDataJob, "EvalJob": EvalJob,
}


class KindInfo(TrexModel):
    """Naming and presentation of one kind in the CRD."""

    kind: str
    plural: str
    singular: str
    short_names: list[str]
    section: str
    printer_columns: list[dict[str, str]]


_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
_PHASE = {"name": "Phase", "type": "string", "jsonPath": ".status.phase"}
_PCT = {"name": "Progress", "type": "string", "jsonPath": ".status.progress.percent"}

KIND_INFO: dict[str, KindInfo] = {
    "TrainJob": KindInfo(
        kind="TrainJob", plural="trainjobs", singular="trainjob", short_names=["tj"], section="trainer",
        printer_columns=[
            _PHASE,
            {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
            {"name": "MFU", "type": "number", "jsonPath": ".status.progress.mfu"},
            {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss"},
            {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt", "priority": "1"},
            _AGE,
        ],
    ),
    "KernelTuneJob": KindInfo(
        kind="KernelTuneJob", plural="kerneltunejobs", singular="kerneltunejob", short_names=["ktj"],
        section="kernels",
        printer_columns=[
            _PHASE, _PCT,
            {"name": "Speedup", "type": "string", "jsonPath": ".status.results.speedup"},
            {"name": "Backend", "type": "string", "jsonPath": ".spec.kernels.backend", "priority": "1"},
            _AGE,
        ],
    ),
    "ORDataJob": KindInfo(
        kind="ORDataJob", plural="ordatajobs", singular="ordatajob", short_names=["odj"], section="ordata",
        printer_columns=[
            _PHASE, _PCT,
            {"name": "Accepted", "type": "integer", "jsonPath": ".status.results.accepted"},
            _AGE,
        ],
    ),
    "EvalJob": KindInfo(
        kind="EvalJob", plural="evaljobs", singular="evaljob", short_names=["ej"], section="evaluation",
        printer_columns=[
            _PHASE, _PCT,
            {"name": "Pass@1", "type": "number", "jsonPath": ".status.results.passAt1"},
            _AGE,
        ],
    ),
}
