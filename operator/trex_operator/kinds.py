"""Kind-specific planning: what children each kind needs and how its workers' outcomes become status."""

from __future__ import annotations

import hashlib
import math
import posixpath
from collections.abc import Mapping
from typing import Any

from trex.kernels.config import KernelTuneConfig
from trex.vllm_cpu import MOE_REPACK, NATIVE_ROPE

from trex_operator import ranktable
from trex_operator.api import LineageEntry, Progress, Results
from trex_operator.children import (
    CONFIG_DIR,
    DEFAULT_MOUNTS,
    KERNELS_DIR,
    LABEL_INDEX,
    LABEL_ROLE,
    JobCtx,
    RefMount,
    child_labels,
    config_map,
    config_map_name,
    container_security_context,
    contract_env,
    headless_service,
    kernels_config_map_name,
    metadata,
    pod,
    pod_resources,
    pod_security_context,
    ref_volume_source,
    render_yaml,
    selector_labels,
    service_name,
    storage_mounts,
    to_json,
    volcano_pod_group,
    volume_source,
)
from trex_operator.engine import (
    SERVER_ROLE,
    Ctx,
    KindImpl,
    current_pods,
    finish,
    gang_pods,
    pod_index,
    pod_refs,
    run_gang,
)
from trex_operator.lifecycle import PodState, classify_pod, condition, iso, parse_time, set_condition
from trex_operator.plan import ChildRef, Manifest
from trex_operator.progress import EVAL_RATIO, ratio_progress, stalled, train_progress

LAUNCHER = ["python", "-m", "trex.runtime.launch", "--"]
SERVED_MODEL_NAME = "policy"
"""The model name a rollout server serves the policy under (what the trainer's vLLM engine requests)."""
WEIGHT_TRANSFER_ARGS = ["--weight-transfer-config", '{"backend": "nccl"}']
"""Servers of a job with trainer.rollout.weightPush transfer take its weights over vLLM's nccl weight-transfer
engine (trex.trainer.rollout.weight_transfer)."""
VLLM_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}
"""vLLM's --dtype for trainer.model.dtype: the servers compute in the trainer's dtype."""
CPU_NATIVE_ROPE = ["--compilation-config", NATIVE_ROPE]
"""CPU servers run RoPE as vLLM's PyTorch code: vllm-cpu 0.32's rotary kernel rotates MLA's multi-head query at
the wrong positions (trex.vllm_cpu.NATIVE_ROPE, which local servers pass too)."""
CPU_SITE_KEY = "vllm-sitecustomize.py"
"""The key of trex.vllm_cpu.MOE_REPACK in the job's ConfigMap (CPU rollout servers)."""
CPU_SITE_DIR = "/etc/trex-vllm-site"
"""Where a CPU rollout server mounts it as ``sitecustomize.py`` (its PYTHONPATH): every process of the server
re-prepacks the MoE experts after a weight push (vllm-cpu 0.32 prepacks them on the first load only), as the
trainer's local servers do."""


def bounded_name(base: str, suffix: str, limit: int = 63) -> str:
    """``<base>-<suffix>`` within ``limit`` characters (a hash keeps truncated names unique)."""
    name = f"{base}-{suffix}"
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(base.encode()).hexdigest()[:6]
    keep = limit - len(suffix) - len(digest) - 2
    return f"{base[:keep].rstrip('-')}-{digest}-{suffix}"


def _resolve(path: str, mount: str | None) -> str:
    """A relative workload path placed under a volume mount (absolute paths are kept)."""
    if path.startswith("/") or mount is None:
        return path
    return posixpath.join(mount, path)


def _ref_spec(body: dict[str, Any]) -> dict[str, Any]:
    spec = body.get("spec")
    return spec if isinstance(spec, dict) else {}


def _mount_of(spec: dict[str, Any], key: str, default: str) -> str | None:
    vols = spec.get("volumes") if isinstance(spec.get("volumes"), dict) else {}
    storage = vols.get(key) if isinstance(vols, dict) else None
    if not isinstance(storage, dict):
        return None
    return str(storage.get("mountPath") or default)


def _name_of(body: dict[str, Any]) -> str:
    meta = body.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, dict) else ""


def _ref_path(body: dict[str, Any], volume: str, default_mount: str, path: str) -> tuple[RefMount | None, str]:
    """How a referenced job's ``path`` on its ``volume`` appears in a consumer pod.

    With a shareable volume (PVC or hostPath) the consumer mounts it read-only at /refs/<job> and the
    path is re-rooted there; otherwise (no volume, emptyDir, a path outside the volume) the path is
    returned as it is, which only works when both jobs see the same shared filesystem at that path.
    """
    spec = _ref_spec(body)
    vols = spec.get("volumes") if isinstance(spec.get("volumes"), dict) else {}
    storage = vols.get(volume) if isinstance(vols, dict) else None
    source = ref_volume_source(storage)
    mount = _mount_of(spec, volume, default_mount)
    if source is None or mount is None:
        return None, _resolve(path, mount)
    if path.startswith("/"):
        if path != mount and not path.startswith(mount.rstrip("/") + "/"):
            return None, path
        rel = path[len(mount):].lstrip("/")
    else:
        rel = path
    ref = RefMount(_name_of(body), source)
    return ref, posixpath.join(ref.mount_path, rel) if rel else ref.mount_path


def ordata_output_path(body: dict[str, Any]) -> str:
    """Where an ORDataJob's corpus lives in a consumer pod (under /refs/<job> when its volume is shareable)."""
    return ordata_output_ref(body)[1]


def ordata_output_ref(body: dict[str, Any]) -> tuple[RefMount | None, str]:
    """The ORDataJob's output volume as a consumer mount, and its output directory in the consumer pod."""
    spec = _ref_spec(body)
    out = str((spec.get("ordata") or {}).get("output") or "ordata-out")
    return _ref_path(body, "output", "/output", out)


def train_checkpoint_path(body: dict[str, Any], step: int | None) -> str:
    """A TrainJob's checkpoint directory in a consumer pod, optionally one step."""
    return train_checkpoint_ref(body, step)[1]


def train_checkpoint_ref(body: dict[str, Any], step: int | None) -> tuple[RefMount | None, str]:
    """The TrainJob's checkpoint volume as a consumer mount, and its checkpoint directory (or step) there."""
    spec = _ref_spec(body)
    ckpt = str(((spec.get("trainer") or {}).get("checkpoint") or {}).get("dir") or "checkpoints")
    ref, path = _ref_path(body, "checkpoints", "/checkpoints", ckpt)
    return ref, posixpath.join(path, f"step-{step:08d}") if step is not None else path


def training_files(corpus_dir: str, mode: str) -> str:
    """The ORData files a trainer mode reads: chat samples for SFT, prompts with their solver-verified truths
    for GRPO and OPD (the student answers them; OPD needs no truths), text documents otherwise."""
    if mode in ("grpo", "opd"):
        return posixpath.join(corpus_dir, "prompts", "prompts-*.jsonl")
    rendering = "sft" if mode == "sft" else "cpt"
    return posixpath.join(corpus_dir, "merged", f"{rendering}-*.jsonl")


def pod_group(ctx: Ctx, min_member: int) -> list[Manifest]:
    """The job's Volcano PodGroup when its effective gang is volcano (its pods name it), else nothing.

    npu jobs pass their MindCluster annotations (sp-block, schedule policy) to Volcano's huawei-npu plugin."""
    if ctx.gang.gang != "volcano":
        return []
    hints = ranktable.job_annotations(ctx.body) if ctx.spec.device_type == "npu" else {}
    return [volcano_pod_group(ctx.job, ctx.spec, min_member, ctx.gang, hints or None)]


def _summary_results(states: list[PodState]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in states:
        for k, v in s.summary.items():
            out.setdefault(k, v)
    return out


def _scalar_progress(progress: Progress) -> Progress:
    return progress.model_copy(update={"percent": "100.0%"})


def results_of(values: Mapping[str, Any]) -> Results:
    """status.results from the camelCase mapping the pods' summaries give (typed fields validated)."""
    return Results.model_validate(values, by_alias=True, by_name=False)


class _PodKind:
    """Shared parts of the pod-based kinds."""

    def workers(self, ctx: Ctx, running_only: bool) -> list[ChildRef]:
        return pod_refs(gang_pods(ctx.observed.pods), running_only)

    def suspended(self, ctx: Ctx) -> bool:
        return not gang_pods(ctx.observed.pods)

    def finished(self, ctx: Ctx) -> None:
        return None

    def ref_problem(self, ctx: Ctx) -> str | None:
        return None


def server_deployment(ctx: Ctx, name: str, container: dict[str, Any], devices: int, requests: dict[str, Any],
                      limits: dict[str, Any], vols: list[dict[str, Any]], mounts: list[dict[str, Any]],
                      pod_fields: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> Manifest:
    """A one-replica Deployment of a model server (role server, outside the gang): ``container`` with the job's
    devices, placement and tolerations, a third-party image's own user but no token or privileges."""
    spec, job = ctx.model.spec, ctx.job
    extra = {LABEL_ROLE: SERVER_ROLE, **(labels or {})}
    pod_labels = child_labels(job, **extra)
    container["securityContext"] = container_security_context()
    res = pod_resources(spec, devices if spec.device_type != "cpu" else 0, ctx.observed.defaults, requests, limits)
    if res:
        container["resources"] = res
    pod_spec: dict[str, Any] = {"containers": [container], "automountServiceAccountToken": False,
                                "securityContext": pod_security_context(image_user=False), **(pod_fields or {})}
    if vols:
        pod_spec["volumes"] = vols
        container["volumeMounts"] = mounts
    selector = ranktable.node_selector(spec, ctx.observed.defaults)
    if selector:
        pod_spec["nodeSelector"] = selector
    if spec.device_type == "npu" and devices and ctx.gang.gang == "volcano":
        pod_spec["schedulerName"] = "volcano"  # MindCluster's device plugin serves only Volcano-placed pods
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    sel = {**selector_labels(job), **extra}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata(job, name, pod_labels),
            "spec": {"replicas": 1, "selector": {"matchLabels": sel},
                     "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec}}}


# ---- modelFrom (TrainJob and EvalJob) -----------------------------------------------------------


def model_mount(ctx: Ctx, ref: Any) -> RefMount | None:
    """The checkpoint volume of the TrainJob ``ref`` names, as a read-only consumer mount (None: no ref, or the
    volume is the consumer's own)."""
    body = ctx.deps.bodies.get(("TrainJob", ref.name)) if ref is not None else None
    return train_checkpoint_ref(body, None)[0] if body is not None else None


def hf_export_path(ctx: Ctx, ref: Any) -> str | None:
    """The Hugging Face export of the TrainJob ``ref`` names, in the consumer pod (<dir>/hf, the final one, or
    <dir>/step-N/hf with its exportHfEvery), recorded in the lineage; None without a ref."""
    body = ctx.deps.bodies.get(("TrainJob", ref.name)) if ref is not None else None
    if ref is None or body is None:
        return None
    path = posixpath.join(train_checkpoint_path(body, ref.step), "hf")
    for entry in ctx.status.lineage:
        if entry.kind == "TrainJob" and entry.name == ref.name:
            entry.detail = f"checkpoint {path}"
    return path


def model_step_problem(ctx: Ctx, ref: Any) -> str | None:
    """Why modelFrom.step cannot be loaded: the TrainJob exports only its final model, or never saves that step
    (checkpoints are taken every intervalSteps and at maxSteps)."""
    body = ctx.deps.bodies.get(("TrainJob", ref.name)) if ref is not None else None
    if ref is None or ref.step is None or body is None:
        return None
    trainer = _ref_spec(body).get("trainer") or {}
    ckpt = trainer.get("checkpoint") or {}
    if ckpt.get("exportHfEvery") is not True:
        return (f"modelFrom.step {ref.step}: TrainJob {ref.name} exports only its final model; set its "
                "trainer.checkpoint.exportHfEvery: true to use one step, or leave step unset")
    interval, last = ckpt.get("intervalSteps", 100), trainer.get("maxSteps")
    if isinstance(interval, int) and interval > 0 and ref.step % interval and ref.step != last:
        return (f"modelFrom.step {ref.step}: TrainJob {ref.name} saves a checkpoint every {interval} steps "
                f"and at maxSteps ({last}); step {ref.step} is never saved")
    return None


def kernels_problem(ctx: Ctx) -> str | None:
    """kernelsFrom's KernelTuneJob tuned kernels, none at a shape class this TrainJob's run calls: one line naming
    kernelsFrom (a registry attached that activates nothing is refused, not run)."""
    ref = ctx.model.spec.kernels_from
    body = ctx.deps.bodies.get(("KernelTuneJob", ref.name)) if ref is not None else None
    if ref is None or body is None:
        return None
    from trex.trainer.kernels import registry_covers, uncovered_message

    doc = registry_doc((body.get("status") or {}).get("results") or {})
    trainer = ctx.model.spec.trainer
    if not doc["kernels"] or registry_covers(doc, trainer):  # an empty registry: the run's coverage line says so
        return None
    return f"kernelsFrom: KernelTuneJob {ref.name}'s registry {uncovered_message(doc, trainer)}"


# ---- TrainJob ----------------------------------------------------------------------------------


class TrainImpl(_PodKind):
    """TrainJob: headless Service, config ConfigMap (+ HCCL rank table), optional PodGroup, one pod per node."""

    def refs(self, ctx: Ctx) -> list[tuple[str, str, str]]:
        spec = ctx.model.spec
        out = []
        if spec.data_from is not None:
            out.append(("ORDataJob", spec.data_from.name, "training data"))
        if spec.kernels_from is not None:
            out.append(("KernelTuneJob", spec.kernels_from.name, "tuned kernel configs"))
        if spec.model_from is not None:
            out.append(("TrainJob", spec.model_from.name, "initial weights"))
        out.extend(("TrainJob", name, "distillation teacher") for name in self._teachers(ctx))
        return out

    @staticmethod
    def _teachers(ctx: Ctx) -> list[str]:
        """TrainJobs named as distillation teachers (mode opd) whose path the operator fills in."""
        trainer = ctx.model.spec.trainer
        if trainer.mode != "opd":
            return []
        return list(dict.fromkeys(t.name for t in trainer.opd.teachers if t.name is not None and t.path is None))

    def ref_problem(self, ctx: Ctx) -> str | None:
        """Why modelFrom's step cannot be loaded (see :func:`model_step_problem`), or why kernelsFrom's registry
        would activate nothing (see :func:`kernels_problem`)."""
        return model_step_problem(ctx, ctx.model.spec.model_from) or kernels_problem(ctx)

    def trainer_config(self, ctx: Ctx) -> dict[str, Any]:
        """The rendered TrainerConfig: data from the referenced ORDataJob, initial weights (and tokenizer) from the
        referenced TrainJob's Hugging Face export, the tuned-kernel registry the referenced KernelTuneJob's
        ConfigMap mounts, checkpoints on the volume."""
        spec = ctx.model.spec
        cfg: dict[str, Any] = spec.trainer.model_dump(mode="json", by_alias=True)
        if spec.data_from is not None:
            body = ctx.deps.bodies.get(("ORDataJob", spec.data_from.name))
            if body is not None:
                cfg["data"]["train"] = training_files(ordata_output_path(body), spec.trainer.mode)
                for entry in ctx.status.lineage:
                    if entry.kind == "ORDataJob":
                        entry.detail = f"training data {cfg['data']['train']}"
        teachers = set(self._teachers(ctx))
        for t in cfg["opd"]["teachers"]:
            body = ctx.deps.bodies.get(("TrainJob", t["name"])) if t["name"] in teachers else None
            if body is not None:  # its checkpoint folder: the final export in <dir>/hf, else a step's
                t["path"] = train_checkpoint_path(body, None)
                for entry in ctx.status.lineage:
                    if entry.kind == "TrainJob" and entry.name == t["name"]:
                        entry.detail = f"distillation teacher {t['path']}"
        if spec.kernels_from is not None:
            cfg["kernels"]["registry"] = f"{KERNELS_DIR}/kernels.json"
            body = ctx.deps.bodies.get(("KernelTuneJob", spec.kernels_from.name)) or {}
            shapes_from = ((body.get("spec") or {}).get("kernels") or {}).get("shapesFrom") or {}
            mine = " tuned at this TrainJob's shapes" if shapes_from.get("trainJob") == ctx.job.name else ""
            for entry in ctx.status.lineage:
                if entry.kind == "KernelTuneJob":
                    entry.detail = f"kernel registry {cfg['kernels']['registry']}{mine}"
        path = hf_export_path(ctx, spec.model_from)
        if path is not None:
            cfg["checkpoint"]["initFromHf"] = path
            if cfg["data"]["tokenizer"].get("path") is None:
                cfg["data"]["tokenizer"]["path"] = posixpath.join(path, "tokenizer.json")
        mounts = storage_mounts(spec)
        cfg["checkpoint"]["dir"] = _resolve(cfg["checkpoint"]["dir"], mounts.get("checkpoints"))
        if spec.rollout.server is not None:
            cfg["rollout"] = {**cfg["rollout"], "engine": "vllm", "servers": self.rollout_urls(ctx)}
        return cfg

    # ---- rollout servers (spec.rollout.server) ----

    @staticmethod
    def rollout_service(job: JobCtx) -> str:
        """The headless Service the rollout servers' hostnames resolve under."""
        return bounded_name(service_name(job), "rollout")

    @staticmethod
    def rollout_deployments(ctx: Ctx) -> list[str]:
        """One Deployment per server replica, so every URL names one server (each takes every weight push)."""
        srv = ctx.model.spec.rollout.server
        return [bounded_name(ctx.job.name, f"rollout-{i}") for i in range(srv.replicas if srv is not None else 0)]

    def rollout_urls(self, ctx: Ctx) -> list[str]:
        """trainer.rollout.servers: http://rollout-<i>.<service>.<namespace>.svc:<port>, one per server."""
        srv = ctx.model.spec.rollout.server
        assert srv is not None
        svc = self.rollout_service(ctx.job)
        return [f"http://rollout-{i}.{svc}.{ctx.job.namespace}.svc:{srv.port}" for i in range(srv.replicas)]

    def rollout_servers(self, ctx: Ctx, model_path: str) -> list[Manifest]:
        """The vLLM Deployments (one replica each, hostname rollout-<i>) and their headless Service. Each server
        starts from ``model_path`` (the initial Hugging Face export) and mounts the job's checkpoint volume read-only
        at the trainer's mount path, where the trainer writes the weight folders it asks them to reload."""
        spec, job = ctx.model.spec, ctx.job
        srv = spec.rollout.server
        assert srv is not None and spec.volumes.checkpoints is not None  # validated (rollout_problem)
        ckpt = spec.volumes.checkpoints
        vols: list[dict[str, Any]] = [{"name": "checkpoints", **volume_source(ckpt)}]
        mounts: list[dict[str, Any]] = [{"name": "checkpoints", "readOnly": True,
                                         "mountPath": ckpt.mount_path or DEFAULT_MOUNTS["checkpoints"]}]
        ref = model_mount(ctx, spec.model_from)
        if ref is not None:
            vols.append({"name": "ref-0", **ref.source})
            mounts.append({"name": "ref-0", "mountPath": ref.mount_path, "readOnly": True})
        env = [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]
        if spec.device_type != "cpu":  # tensor-parallel workers share tensors through /dev/shm
            vols.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
            mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        else:  # the MoE repack as the server's sitecustomize, from the job's ConfigMap
            vols.append({"name": "vllm-site", "configMap": {
                "name": config_map_name(job), "items": [{"key": CPU_SITE_KEY, "path": "sitecustomize.py"}]}})
            mounts.append({"name": "vllm-site", "mountPath": CPU_SITE_DIR, "readOnly": True})
            env.append({"name": "PYTHONPATH", "value": CPU_SITE_DIR})
        svc = self.rollout_service(job)
        out: list[Manifest] = []
        for i, name in enumerate(self.rollout_deployments(ctx)):
            container: dict[str, Any] = {
                "name": "server", "image": srv.image or ctx.observed.defaults.rollout_images.get(spec.device_type)
                or spec.rollout_image(),
                "imagePullPolicy": spec.image_pull_policy, "command": ["vllm", "serve"],
                "args": [model_path, "--host", "0.0.0.0", "--port", str(srv.port),
                         "--tensor-parallel-size", str(max(srv.devices_per_replica, 1)),
                         "--dtype", VLLM_DTYPES[spec.trainer.model.dtype],
                         # the name the trainer's requests use, and log-probs after temperature (its behaviour
                         # log-probs); args after these override them
                         "--served-model-name", SERVED_MODEL_NAME, "--logprobs-mode", "processed_logprobs",
                         *(CPU_NATIVE_ROPE if spec.device_type == "cpu" else []),
                         *(WEIGHT_TRANSFER_ARGS if spec.trainer.rollout.weight_push == "transfer" else []), *srv.args],
                # the weight-update endpoints (/collective_rpc reload_weights, /pause, /resume) are dev-mode only
                "env": env,
                "ports": [{"name": "http", "containerPort": srv.port, "protocol": "TCP"}],
                "readinessProbe": {"httpGet": {"path": "/health", "port": srv.port}, "periodSeconds": 10},
            }
            out.append(server_deployment(ctx, name, container, srv.devices_per_replica, srv.resources.requests,
                                         srv.resources.limits, vols, mounts,
                                         {"hostname": f"rollout-{i}", "subdomain": svc}, {LABEL_INDEX: str(i)}))
        labels = child_labels(job, **{LABEL_ROLE: SERVER_ROLE})
        out.append({"apiVersion": "v1", "kind": "Service", "metadata": metadata(job, svc, labels),
                    "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                             "selector": {**selector_labels(job), LABEL_ROLE: SERVER_ROLE},
                             "ports": [{"name": "http", "port": srv.port, "targetPort": srv.port, "protocol": "TCP"}]}})
        return out

    def rollout_gate(self, ctx: Ctx) -> bool:
        """Whether the gang may run: every rollout server is ready (condition RolloutServerReady). A server pod that
        crash-loops or cannot pull its image, or servers not ready for readyTimeoutSeconds, fail the job (a
        condition and a Warning Event, not a wait without end); servers that drop out under a running gang are a
        condition and an Event while the trainer's client waits for them."""
        st, srv = ctx.status, ctx.model.spec.rollout.server
        if srv is None:
            return True
        names = self.rollout_deployments(ctx)
        ready = sum(1 for n in names if _ready_replicas(ctx.observed.deployments.get(n)) >= 1)
        broken = _broken_server(ctx.observed.pods)
        if broken is not None:
            reason, message = broken
            set_condition(st, "RolloutServerReady", "False", reason, message, ctx.now, ctx.generation)
            finish(ctx, self, "Failed", "RolloutServerFailed", f"rollout server {message}")
            return False
        before = condition(st, "RolloutServerReady")
        was_ready = before is not None and before.status == "True"
        if ready == len(names):
            if set_condition(st, "RolloutServerReady", "True", "ServersReady", f"{ready}/{len(names)} rollout "
                             "server(s) ready", ctx.now, ctx.generation) and not was_ready:
                ctx.event("Normal", "RolloutServerReady", f"{ready} rollout server(s) ready")
            return True
        message = f"{ready}/{len(names)} rollout server(s) ready"
        set_condition(st, "RolloutServerReady", "False", "ServersNotReady", message, ctx.now, ctx.generation)
        since = parse_time(condition(st, "RolloutServerReady").last_transition_time)
        if since is not None and (ctx.now - since).total_seconds() > srv.ready_timeout_seconds:
            finish(ctx, self, "Failed", "RolloutServerNotReady", f"{message} after "
                   f"rollout.server.readyTimeoutSeconds={srv.ready_timeout_seconds}s")
            return False
        if current_pods(ctx):  # a running gang keeps running: its client waits and resumes from the token log
            if was_ready:
                ctx.event("Warning", "RolloutServerNotReady", message)
            return True
        if st.start_time is None:
            st.start_time = iso(ctx.now)
        if st.phase != "Starting" or st.reason != "WaitingForRolloutServer":
            ctx.move("Starting", "WaitingForRolloutServer", f"waiting for the rollout servers: {message}")
        return False

    def children(self, ctx: Ctx) -> list[Manifest]:
        spec, job = ctx.model.spec, ctx.job
        data = {"trainer.yaml": render_yaml("trainer", self.trainer_config(ctx))}
        if spec.rollout.server is not None and spec.device_type == "cpu":
            data[CPU_SITE_KEY] = MOE_REPACK
        if spec.device_type == "npu":
            data[ctx.observed.defaults.rank_table_file_name] = to_json(self._rank_table(ctx))
        out: list[Manifest] = [config_map(job, config_map_name(job), data),
                               headless_service(job, [("dist", 29500), ("metrics", spec.metrics_port)])]
        if spec.rollout.server is not None and not spec.run_policy.suspend:
            initial = self.trainer_config(ctx)["checkpoint"]["initFromHf"]
            if not isinstance(initial, str):  # validation requires modelFrom or initFromHf; modelFrom resolved it
                raise ValueError("rollout.server: no initial Hugging Face folder for the servers")
            out += self.rollout_servers(ctx, initial)
        return out + pod_group(ctx, spec.replicas)

    def _layout(self, ctx: Ctx) -> ranktable.Layout:
        shape = ranktable.ascend_layout(ctx.body, ctx.model.spec, ctx.observed.defaults)
        assert shape is not None  # npu TrainJob; a bad layout already failed the job with InvalidSpec
        return shape

    def _rank_table(self, ctx: Ctx) -> dict[str, Any]:
        pods = sorted(current_pods(ctx), key=pod_index)
        if len(pods) != ctx.model.spec.replicas:
            table = ranktable.initializing()
        else:
            try:
                table = ranktable.render(pods, self._layout(ctx))
            except ranktable.RankTableError as exc:
                reason = "DeviceIPMissing" if isinstance(exc, ranktable.DeviceIPError) else "InvalidDeviceAnnotation"
                set_condition(ctx.status, "RankTableReady", "False", reason, str(exc), ctx.now, ctx.generation)
                return ranktable.initializing()
        if table["status"] == "completed":
            set_condition(ctx.status, "RankTableReady", "True", "RankTableCompleted",
                          f"hccl.json version {table['version']} with {len(pods)} server(s)", ctx.now, ctx.generation)
        else:
            set_condition(ctx.status, "RankTableReady", "False", "WaitingForDevices",
                          "waiting for every pod to be scheduled with its NPUs and its IP", ctx.now, ctx.generation)
        return table

    def refs_mounts(self, ctx: Ctx) -> tuple[RefMount, ...]:
        """The referenced ORDataJob's output volume, the TrainJob's checkpoint volume (modelFrom) and the teacher
        TrainJobs' checkpoint volumes, mounted read-only."""
        spec = ctx.model.spec
        body = ctx.deps.bodies.get(("ORDataJob", spec.data_from.name)) if spec.data_from is not None else None
        refs = [ordata_output_ref(body)[0] if body is not None else None, model_mount(ctx, spec.model_from)]
        for name in self._teachers(ctx):
            teacher = ctx.deps.bodies.get(("TrainJob", name))
            refs.append(train_checkpoint_ref(teacher, None)[0] if teacher is not None else None)
        by_job = {r.job_name: r for r in refs if r is not None}  # a TrainJob both modelFrom and teacher: one mount
        return tuple(by_job.values())

    def pods(self, ctx: Ctx) -> list[Manifest]:
        """The worker pods of the current attempt."""
        spec, job, attempt = ctx.model.spec, ctx.job, ctx.status.attempt
        nproc, nnodes = spec.devices_per_replica, spec.replicas
        master = f"worker-0.{service_name(job)}.{job.namespace}.svc"
        config_text = render_yaml("trainer", self.trainer_config(ctx))
        out = []
        for i in range(nnodes):
            env = contract_env(job, spec, attempt=attempt, config_path=f"{CONFIG_DIR}/trainer.yaml",
                               master_addr=master, nnodes=nnodes, node_rank=i, nproc=nproc)
            if spec.device_type == "npu":
                env["RANK_TABLE_FILE"] = ctx.observed.defaults.rank_table_file
                env.update(ranktable.pod_env(self._layout(ctx), i, ctx.observed.defaults.hccl_connect_timeout_s,
                                             spec.trainer.deterministic))
            out.append(pod(job, spec, name=f"{job.name}-worker-{i}-a{attempt}", role="worker", attempt=attempt,
                           command=[*LAUNCHER, "trex", "train", "--config", f"{CONFIG_DIR}/trainer.yaml"],
                           env=env, devices=nproc if spec.device_type != "cpu" else 0, index=i,
                           defaults=ctx.observed.defaults, hostname=f"worker-{i}", config=config_map_name(job),
                           kernels_from=spec.kernels_from.name if spec.kernels_from else None, gang_size=nnodes,
                           config_text=config_text, refs=self.refs_mounts(ctx),
                           rank_table=spec.device_type == "npu"))
        return out

    def run(self, ctx: Ctx) -> None:
        st = ctx.status
        missing_ip = condition(st, "RankTableReady")
        if missing_ip is not None and missing_ip.reason == "DeviceIPMissing":
            # a node's NPU NIC has no address: HCCL cannot connect, and no restart changes the annotation
            finish(ctx, self, "Failed", "DeviceIPMissing", missing_ip.message or "a device has no IP")
            return
        if not self.rollout_gate(ctx):
            return
        states = run_gang(ctx, self, self.pods(ctx), st.progress.resume_step)
        if states is None:
            return
        if ctx.observed.metrics:
            st.progress = train_progress(ctx.observed.metrics, st.progress, ctx.now)
        if all(s.phase == "Succeeded" for s in states.values()):
            rank0 = [classify_pod(p) for p in current_pods(ctx) if pod_index(p) == 0]
            st.results = results_of(_summary_results(rank0 + list(states.values())))
            st.progress = _scalar_progress(st.progress)
            finish(ctx, self, "Succeeded", "Completed", f"all {len(states)} pod(s) succeeded")
            return
        if all(s.phase in ("Running", "Succeeded") for s in states.values()):
            if st.phase != "Running":
                ctx.move("Running", "AllPodsRunning", f"attempt {st.attempt}: {len(states)} pod(s) running")
            stall = ctx.model.spec.run_policy.stall_seconds
            if stalled(st.progress, stall, ctx.now):
                set_condition(st, "Stalled", "True", "NoProgress",
                              f"step {st.progress.step} has not advanced for {stall}s", ctx.now, ctx.generation)
            elif any(c.type == "Stalled" and c.status == "True" for c in st.conditions):
                set_condition(st, "Stalled", "False", "Progressing", "the step advances again", ctx.now,
                              ctx.generation)

    def workers(self, ctx: Ctx, running_only: bool) -> list[ChildRef]:
        """The gang's pods, and on suspend (all workers) the rollout servers' Deployments, which hold devices."""
        out = pod_refs(gang_pods(ctx.observed.pods), running_only)
        if not running_only:
            out += [ChildRef("apps/v1", "Deployment", n) for n in ctx.observed.deployments]
        return out

    def suspended(self, ctx: Ctx) -> bool:
        return not ctx.observed.pods

    def finished(self, ctx: Ctx) -> None:
        """Release the rollout servers (Deployments and their Service) once the job is done."""
        refs = [ChildRef("apps/v1", "Deployment", n) for n in ctx.observed.deployments]
        if refs:
            refs.append(ChildRef("v1", "Service", self.rollout_service(ctx.job)))
        ctx.plan.delete.extend(r for r in refs if r not in ctx.plan.delete)


def _ready_replicas(deployment: Manifest | None) -> int:
    """status.availableReplicas of a Deployment (ready for minReadySeconds, 0 here: ready), as the EvalJob reads it."""
    value = ((deployment or {}).get("status") or {}).get("availableReplicas")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


_SERVER_FAILURES = ("CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                    "CreateContainerConfigError", "CreateContainerError")


def _broken_server(pods: list[Manifest]) -> tuple[str, str] | None:
    """(reason, message) of the first model-server pod that cannot become ready without a change: its container
    crash-loops or its image or container config is refused."""
    for p in pods:
        meta = p.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL_ROLE) != SERVER_ROLE:
            continue
        for c in (p.get("status") or {}).get("containerStatuses") or []:
            waiting = ((c.get("state") or {}) if isinstance(c, dict) else {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason in _SERVER_FAILURES:
                restarts = c.get("restartCount", 0)
                detail = f"; last exit: {_last_exit(c)}" if reason == "CrashLoopBackOff" else ""
                return str(reason), (f"pod {meta.get('name', '?')}: {reason} (restarts {restarts}){detail}: "
                                     f"{waiting.get('message', '')}".rstrip(": "))
    return None


def _last_exit(container_status: dict[str, Any]) -> str:
    term = (container_status.get("lastState") or {}).get("terminated") or {}
    return f"exit code {term.get('exitCode', '?')} ({term.get('reason') or 'Error'})"


# ---- KernelTuneJob -----------------------------------------------------------------------------


def geomean(values: list[float]) -> float | None:
    """Geometric mean of positive values (None when there are none)."""
    vals = [v for v in values if isinstance(v, int | float) and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def registry_doc(results: Mapping[str, Any]) -> dict[str, Any]:
    """The kernel registry (trex.kernels.registry's format) a TrainJob's kernelsFrom mounts as kernels.json, from a
    KernelTuneJob's status.results: every ``kernel/dtype/shape class`` entry that carries its tuned params."""
    from trex.kernels.registry import REGISTRY_VERSION

    out: dict[str, Any] = {"version": REGISTRY_VERSION, "backend": results.get("backend"),
                           "device": results.get("device", ""), "kernels": {}}
    for key, v in (results.get("kernels") or {}).items():
        parts = str(key).split("/")
        if len(parts) != 3 or not isinstance(v, Mapping) or not isinstance(v.get("params"), Mapping):
            continue
        kernel, dtype, bucket = parts
        out["kernels"].setdefault(kernel, {}).setdefault(bucket, {})[dtype] = {
            "params": dict(v["params"]), "speedup_eager": v.get("speedup"), "speedup_compile": v.get("speedupCompile")}
    return out


def speedup_results(summaries: list[Mapping[str, Any]], kernels: Mapping[str, Any]) -> dict[str, Any]:
    """Both geomean ratios (over eager: geomeanSpeedup, over torch.compile: geomeanSpeedupCompile), each the
    single pod's own figure or the geomean over every kernel, and the Speedup column's text showing both."""
    out: dict[str, Any] = {}
    for total, per_kernel in (("geomeanSpeedup", "speedup"), ("geomeanSpeedupCompile", "speedupCompile")):
        reported = [float(s[total]) for s in summaries if isinstance(s.get(total), int | float)]
        values = [float(v[per_kernel]) for v in kernels.values()
                  if isinstance(v, Mapping) and isinstance(v.get(per_kernel), int | float)]
        g = reported[0] if len(reported) == 1 and len(summaries) == 1 else geomean(values)
        if g is not None:
            out[total] = round(g, 4)
    if "geomeanSpeedup" in out:
        text = f"{out['geomeanSpeedup']:.2f}x eager"
        if "geomeanSpeedupCompile" in out:
            text += f", {out['geomeanSpeedupCompile']:.2f}x compile"
        out["speedup"] = text + (" (slower than eager)" if out["geomeanSpeedup"] < 1.0 else "")
    return out


class KernelTuneImpl(_PodKind):
    """KernelTuneJob: one pod per backend/device target; results into status and <name>-kernels."""

    def refs(self, ctx: Ctx) -> list[tuple[str, str, str]]:
        return []

    def tune_config(self, ctx: Ctx) -> KernelTuneConfig | None:
        """spec.kernels with shapesFrom resolved from the named TrainJob's spec (read as it is: the TrainJob need
        not have run); None while that TrainJob does not exist. ValueError when its run calls nothing to tune."""
        cfg: KernelTuneConfig = ctx.model.spec.kernels
        if cfg.shapes_from is None:
            return cfg
        from trex_operator.kernel_shapes import trainer_of, with_shapes

        body = ctx.observed.refs.get(("TrainJob", cfg.shapes_from.train_job))
        if body is None:
            return None
        return with_shapes(cfg, trainer_of(body), f"TrainJob {cfg.shapes_from.train_job}")

    def config_text(self, ctx: Ctx) -> str:
        tuned = self.tune_config(ctx)
        assert tuned is not None  # children and pods are rendered once the TrainJob is read
        cfg = tuned.model_dump(mode="json", by_alias=True)
        cfg["output"] = _resolve(cfg["output"], storage_mounts(ctx.model.spec).get("output"))
        return render_yaml("kernels", cfg)

    def children(self, ctx: Ctx) -> list[Manifest]:
        if self._shapes_pending(ctx):
            return []
        return [config_map(ctx.job, config_map_name(ctx.job), {"kernels.yaml": self.config_text(ctx)}),
                *pod_group(ctx, 1)]

    def _shapes_pending(self, ctx: Ctx) -> bool:
        """True while shapesFrom's TrainJob cannot be read yet or gives nothing to tune (run() reports which)."""
        try:
            return self.tune_config(ctx) is None
        except ValueError:
            return True

    def _shapes_lineage(self, ctx: Ctx) -> bool:
        """Resolve shapesFrom for run(): record the TrainJob in the lineage (what was taken: the shape classes), or
        wait (Pending) while it does not exist, or fail the job when its run calls nothing to tune; True to go on."""
        ref = ctx.model.spec.kernels.shapes_from
        if ref is None:
            return True
        try:
            tuned = self.tune_config(ctx)
        except ValueError as e:
            finish(ctx, self, "Failed", "InvalidSpec", str(e))
            return False
        if tuned is None:
            if ctx.status.phase != "Pending" or ctx.status.reason != "WaitingForShapes":
                ctx.move("Pending", "WaitingForShapes", f"shapesFrom: TrainJob {ref.train_job} does not exist yet")
            return False
        from trex_operator.kernel_shapes import summary

        body = ctx.observed.refs.get(("TrainJob", ref.train_job)) or {}
        entry = LineageEntry(kind="TrainJob", name=ref.train_job, uid=(body.get("metadata") or {}).get("uid"),
                             detail=f"shapes from: {summary(tuned)}")
        ctx.status.lineage = [e for e in ctx.status.lineage if not (e.kind == "TrainJob" and e.name == ref.train_job)]
        ctx.status.lineage.append(entry)
        return True

    def pods(self, ctx: Ctx) -> list[Manifest]:
        spec, job, attempt = ctx.model.spec, ctx.job, ctx.status.attempt
        backend = spec.kernels.backend
        env = contract_env(job, spec, attempt=attempt, config_path=f"{CONFIG_DIR}/kernels.yaml",
                           master_addr="127.0.0.1", nnodes=1, node_rank=0, nproc=1)
        return [pod(job, spec, name=f"{job.name}-{backend}-a{attempt}", role=f"tune-{backend}", attempt=attempt,
                    command=["trex", "kernels", "tune", "--config", f"{CONFIG_DIR}/kernels.yaml"], env=env,
                    devices=spec.devices_per_replica if spec.device_type != "cpu" else 0, index=0,
                    defaults=ctx.observed.defaults, config=config_map_name(job), config_text=self.config_text(ctx))]

    def run(self, ctx: Ctx) -> None:
        st = ctx.status
        if not self._shapes_lineage(ctx):
            return
        states = run_gang(ctx, self, self.pods(ctx), None)
        if states is None:
            return
        if all(s.phase == "Succeeded" for s in states.values()):
            kernels: dict[str, Any] = {}
            for s in states.values():
                k = s.summary.get("kernels")
                if isinstance(k, dict):
                    kernels.update(k)
            results: dict[str, Any] = {"backend": ctx.model.spec.kernels.backend, "kernels": kernels,
                                       "kernelsConfigMap": kernels_config_map_name(ctx.job.name)}
            devices = {s.summary.get("device") for s in states.values()} - {None}
            if len(devices) == 1:
                results["device"] = devices.pop()
            results.update(speedup_results([s.summary for s in states.values()], kernels))
            st.results = results_of(results)
            st.progress = _scalar_progress(st.progress)
            finish(ctx, self, "Succeeded", "Completed", f"tuned {len(kernels)} kernel(s)")
            return
        if all(s.phase in ("Running", "Succeeded") for s in states.values()) and st.phase != "Running":
            ctx.move("Running", "AllPodsRunning", "tuning")

    def finished(self, ctx: Ctx) -> None:
        if ctx.status.phase == "Succeeded":
            results = ctx.status.results.model_dump(mode="json", by_alias=True, exclude_unset=True)
            ctx.plan.ensure.append(config_map(ctx.job, kernels_config_map_name(ctx.job.name),
                                              {"kernels.json": to_json(registry_doc(results)),
                                               "results.json": to_json(results)}))


# ---- EvalJob -----------------------------------------------------------------------------------


class EvalImpl(_PodKind):
    """EvalJob: eval pod(s), optionally a model server Deployment + Service for the job's lifetime."""

    def refs(self, ctx: Ctx) -> list[tuple[str, str, str]]:
        ref = ctx.model.spec.model_from
        return [("TrainJob", ref.name, "model checkpoint")] if ref is not None else []

    def server_name(self, job: JobCtx) -> str:
        return bounded_name(service_name(job), "server")

    def refs_mounts(self, ctx: Ctx) -> tuple[RefMount, ...]:
        """The referenced TrainJob's checkpoint volume, mounted read-only in the eval pods."""
        mount = model_mount(ctx, ctx.model.spec.model_from)
        return (mount,) if mount is not None else ()

    def ref_problem(self, ctx: Ctx) -> str | None:
        return model_step_problem(ctx, ctx.model.spec.model_from)

    def model_path(self, ctx: Ctx) -> str | None:
        # What a model server loads and what the trex-checkpoint model reads.
        return hf_export_path(ctx, ctx.model.spec.model_from)

    def eval_config(self, ctx: Ctx) -> dict[str, Any]:
        spec = ctx.model.spec
        cfg: dict[str, Any] = spec.evaluation.model_dump(mode="json", by_alias=True)
        cfg["output"] = _resolve(cfg["output"], storage_mounts(spec).get("output"))
        if spec.server is not None:
            cfg["model"]["url"] = f"http://{self.server_name(ctx.job)}.{ctx.job.namespace}.svc:{spec.server.port}/v1"
        path = self.model_path(ctx)
        if path is not None and cfg["model"]["kind"] == "trex-checkpoint":
            cfg["model"]["path"] = path
        return cfg

    def children(self, ctx: Ctx) -> list[Manifest]:
        spec, job = ctx.model.spec, ctx.job
        cfg = self.eval_config(ctx)
        data = {"eval.yaml": render_yaml("evaluation", cfg)}
        if spec.pod_per_benchmark:
            for i, b in enumerate(cfg["benchmarks"]):
                data[f"eval-{i}.yaml"] = render_yaml("evaluation", {**cfg, "benchmarks": [b]})
        out: list[Manifest] = [config_map(job, config_map_name(job), data),
                               *pod_group(ctx, len(spec.evaluation.benchmarks) if spec.pod_per_benchmark else 1)]
        if spec.server is not None:
            out.extend(self.server(ctx))
        return out

    def server(self, ctx: Ctx) -> list[Manifest]:
        """Deployment + Service of the model server."""
        spec, job = ctx.model.spec, ctx.job
        srv = spec.server
        name = self.server_name(job)
        args = list(srv.args)
        path = self.model_path(ctx)
        if path is not None:
            args.append(path)
        container: dict[str, Any] = {
            "name": "server", "image": srv.image, "imagePullPolicy": spec.image_pull_policy, "args": args,
            "ports": [{"name": "http", "containerPort": srv.port, "protocol": "TCP"}],
            "readinessProbe": {"tcpSocket": {"port": srv.port}, "periodSeconds": 10},
        }
        vols: list[dict[str, Any]] = []
        mounts: list[dict[str, Any]] = []
        refs = self.refs_mounts(ctx)
        checkpoints = spec.volumes.checkpoints
        if path is not None and refs:
            vols = [{"name": f"ref-{i}", **r.source} for i, r in enumerate(refs)]
            mounts = [{"name": f"ref-{i}", "mountPath": r.mount_path, "readOnly": True} for i, r in enumerate(refs)]
        elif path is not None and checkpoints is not None:
            vols = [{"name": "checkpoints", **volume_source(checkpoints)}]
            mounts = [{"name": "checkpoints", "mountPath": checkpoints.mount_path or "/checkpoints", "readOnly": True}]
        deployment = server_deployment(ctx, name, container, srv.devices, srv.resources.requests,
                                       srv.resources.limits, vols, mounts)
        labels = child_labels(job, **{LABEL_ROLE: SERVER_ROLE})
        sel = {**selector_labels(job), LABEL_ROLE: SERVER_ROLE}
        service = {"apiVersion": "v1", "kind": "Service", "metadata": metadata(job, name, labels),
                   "spec": {"selector": sel, "ports": [{"name": "http", "port": srv.port, "targetPort": srv.port,
                                                        "protocol": "TCP"}]}}
        return [deployment, service]

    def pods(self, ctx: Ctx) -> list[Manifest]:
        spec, job, attempt = ctx.model.spec, ctx.job, ctx.status.attempt
        n = len(spec.evaluation.benchmarks) if spec.pod_per_benchmark else 1
        config_text = render_yaml("evaluation", self.eval_config(ctx))
        out = []
        for i in range(n):
            cfg_file = f"{CONFIG_DIR}/eval-{i}.yaml" if spec.pod_per_benchmark else f"{CONFIG_DIR}/eval.yaml"
            env = contract_env(job, spec, attempt=attempt, config_path=cfg_file, master_addr="127.0.0.1",
                               nnodes=1, node_rank=0, nproc=1)
            suffix = f"eval-{i}" if spec.pod_per_benchmark else "eval"
            out.append(pod(job, spec, name=f"{job.name}-{suffix}-a{attempt}", role="eval", attempt=attempt,
                           command=["trex", "eval", "--config", cfg_file], env=env, index=i,
                           defaults=ctx.observed.defaults,
                           devices=spec.devices_per_replica if spec.device_type != "cpu" and spec.server is None
                           and spec.evaluation.model.kind != "openai" else 0, config=config_map_name(job),
                           config_text=config_text, refs=self.refs_mounts(ctx)))
        return out

    def run(self, ctx: Ctx) -> None:
        st, spec = ctx.status, ctx.model.spec
        if spec.server is not None:
            dep = ctx.observed.deployments.get(self.server_name(ctx.job)) or {}
            available = (dep.get("status") or {}).get("availableReplicas") or 0
            if not isinstance(available, int) or available < 1:
                if st.start_time is None:
                    st.start_time = iso(ctx.now)
                if st.phase != "Starting" or st.reason != "WaitingForServer":
                    ctx.move("Starting", "WaitingForServer", f"waiting for the model server {self.server_name(ctx.job)}")
                return
        states = run_gang(ctx, self, self.pods(ctx), None)
        if states is None:
            return
        if ctx.observed.metrics:
            st.progress = ratio_progress(ctx.observed.metrics, EVAL_RATIO, st.progress, ctx.now)
        if all(s.phase == "Succeeded" for s in states.values()):
            st.results = results_of(eval_results(list(states.values())))
            st.progress = _scalar_progress(st.progress)
            finish(ctx, self, "Succeeded", "Completed", f"evaluated {len(st.results.benchmarks or {})} benchmark(s)")
            return
        if all(s.phase in ("Running", "Succeeded") for s in states.values()) and st.phase != "Running":
            ctx.move("Running", "AllPodsRunning", "evaluating")

    def finished(self, ctx: Ctx) -> None:
        name = self.server_name(ctx.job)
        if name in ctx.observed.deployments:
            ctx.plan.delete.append(ChildRef("apps/v1", "Deployment", name))
            ctx.plan.delete.append(ChildRef("v1", "Service", name))


def eval_results(states: list[PodState]) -> dict[str, Any]:
    """Pass@1 per benchmark from the eval pods' summaries ({benchmarks: {name: {passAt1, ...}}} or flat)."""
    benchmarks: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for s in states:
        b = s.summary.get("benchmarks")
        if isinstance(b, dict):
            benchmarks.update({str(k): v for k, v in b.items() if isinstance(v, dict)})
        elif isinstance(s.summary.get("benchmark"), str):
            benchmarks[s.summary["benchmark"]] = {k: v for k, v in s.summary.items() if k != "benchmark"}
        for k, v in s.summary.items():
            if k not in ("benchmarks", "benchmark", "passAt1"):
                extra.setdefault(k, v)
    scores = [float(v["passAt1"]) for v in benchmarks.values() if isinstance(v.get("passAt1"), int | float)]
    out: dict[str, Any] = {**extra, "benchmarks": benchmarks}
    if scores:
        out["passAt1"] = round(sum(scores) / len(scores), 4)
    return out


# ---- ORDataJob ---------------------------------------------------------------------------------


def _job_condition(job: Manifest, type_: str) -> bool:
    return any(isinstance(c, dict) and c.get("type") == type_ and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


class ORDataImpl:
    """ORDataJob: an Indexed batch Job (one completion per shard), then a merge Job."""

    def ref_problem(self, ctx: Ctx) -> str | None:
        return None

    def refs(self, ctx: Ctx) -> list[tuple[str, str, str]]:
        return []

    def names(self, job: JobCtx) -> tuple[str, str]:
        # batch Job names feed the batch.kubernetes.io/job-name pod label: at most 63 characters.
        return bounded_name(job.name, "generate"), bounded_name(job.name, "merge")

    def output(self, ctx: Ctx) -> str:
        return _resolve(ctx.model.spec.ordata.output, storage_mounts(ctx.model.spec).get("output"))

    def children(self, ctx: Ctx) -> list[Manifest]:
        cfg = ctx.model.spec.ordata.model_dump(mode="json", by_alias=True)
        cfg["output"] = self.output(ctx)
        return [config_map(ctx.job, config_map_name(ctx.job), {"ordata.yaml": render_yaml("ordata", cfg)}),
                *pod_group(ctx, 1)]

    def batch_job(self, ctx: Ctx, name: str, role: str, command: list[str], completions: int) -> Manifest:
        spec, job = ctx.model.spec, ctx.job
        env = contract_env(job, spec, attempt=ctx.status.attempt, config_path=f"{CONFIG_DIR}/ordata.yaml",
                           master_addr="127.0.0.1", nnodes=1, node_rank=0, nproc=1)
        template = pod(job, spec, name=name, role=role, attempt=ctx.status.attempt, command=command, env=env,
                       devices=0, defaults=ctx.observed.defaults, config=config_map_name(job))
        tmeta = {k: v for k, v in template["metadata"].items() if k in ("labels", "annotations")}
        job_spec: dict[str, Any] = {"completions": completions, "template": {"metadata": tmeta,
                                                                            "spec": template["spec"]}}
        if role == "generate":
            job_spec.update({"completionMode": "Indexed", "parallelism": min(spec.parallelism, completions),
                             "backoffLimitPerIndex": spec.backoff_limit_per_index})
        else:
            job_spec.update({"parallelism": 1, "backoffLimit": spec.run_policy.backoff_limit})
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": metadata(job, name, child_labels(job, **{LABEL_ROLE: role})), "spec": job_spec}

    def run(self, ctx: Ctx) -> None:
        st, spec = ctx.status, ctx.model.spec
        gen_name, merge_name = self.names(ctx.job)
        shards = spec.ordata.shards.num_shards
        gen = ctx.observed.batch_jobs.get(gen_name)
        if gen is None:
            ctx.plan.ensure.append(self.batch_job(
                ctx, gen_name, "generate",
                ["trex", "ordata", "generate", "--config", f"{CONFIG_DIR}/ordata.yaml",
                 "--shard-index", "$(JOB_COMPLETION_INDEX)", "--num-shards", str(shards)], shards))
            if st.start_time is None:
                st.start_time = iso(ctx.now)
            if st.phase in ("Pending", None):
                ctx.move("Starting", "GenerateJobCreated", f"generating {shards} shard(s)")
            return
        gstatus = gen.get("status") or {}
        done: int = gstatus["succeeded"] if isinstance(gstatus.get("succeeded"), int) else 0
        if _job_condition(gen, "Failed"):
            failed = gstatus.get("failedIndexes") or gstatus.get("failed") or "?"
            finish(ctx, self, "Failed", "ShardsFailed", f"shard generation failed (failed indexes: {failed})")
            return
        if not (_job_condition(gen, "Complete") or done >= shards):
            st.progress = st.progress.model_copy(update={
                "shards_done": done, "shards": shards, "percent": f"{90.0 * done / shards:.1f}%",
                "updated_at": iso(ctx.now)})
            if (gstatus.get("active") or 0) > 0 and st.phase != "Running":
                ctx.move("Running", "Generating", f"{shards} shard(s), parallelism {min(spec.parallelism, shards)}")
            return
        merge = ctx.observed.batch_jobs.get(merge_name)
        if merge is None:
            ctx.plan.ensure.append(self.batch_job(ctx, merge_name, "merge",
                                                  ["trex", "ordata", "merge", self.output(ctx)], 1))
            st.progress = st.progress.model_copy(update={"shards_done": shards, "shards": shards, "percent": "90.0%",
                                                         "updated_at": iso(ctx.now)})
            if st.phase != "Running":
                ctx.move("Running", "Merging", "all shards generated; merging")
            return
        if _job_condition(merge, "Failed"):
            finish(ctx, self, "Failed", "MergeFailed", "the merge Job failed")
            return
        if _job_condition(merge, "Complete") or ((merge.get("status") or {}).get("succeeded") or 0) >= 1:
            merge_pods = [classify_pod(p) for p in ctx.observed.pods
                          if ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE) == "merge"]
            st.results = results_of(ordata_results([s for s in merge_pods if s.phase == "Succeeded"] or merge_pods))
            st.progress = _scalar_progress(st.progress)
            finish(ctx, self, "Succeeded", "Completed", f"{st.results.accepted or 0} sample(s) accepted")

    def workers(self, ctx: Ctx, running_only: bool) -> list[ChildRef]:
        out = []
        for name, job in ctx.observed.batch_jobs.items():
            if running_only and (_job_condition(job, "Complete") or _job_condition(job, "Failed")):
                continue
            out.append(ChildRef("batch/v1", "Job", name))
        return out

    def suspended(self, ctx: Ctx) -> bool:
        return not ctx.observed.batch_jobs and not [p for p in ctx.observed.pods
                                                    if (p.get("status") or {}).get("phase") in ("Pending", "Running")]

    def finished(self, ctx: Ctx) -> None:
        return None


ORDATA_COUNTS = ("generated", "solved", "verified", "accepted", "duplicates")


def ordata_results(states: list[PodState]) -> dict[str, Any]:
    """Counts {generated, solved, verified, accepted, rejected by reason, duplicates} from the merge summary."""
    summary = _summary_results(states)
    counts: dict[str, Any] = summary["counts"] if isinstance(summary.get("counts"), dict) else summary
    out: dict[str, Any] = {k: v for k, v in summary.items() if k not in ("counts",)}
    for key in ORDATA_COUNTS:
        v = counts.get(key)
        out[key] = int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0
    rejected = counts.get("rejected")
    out["rejected"] = {str(k): int(v) for k, v in rejected.items() if isinstance(v, int | float)} \
        if isinstance(rejected, dict) else {}
    return out


IMPLS: dict[str, KindImpl] = {
    "TrainJob": TrainImpl(), "KernelTuneJob": KernelTuneImpl(), "EvalJob": EvalImpl(), "ORDataJob": ORDataImpl(),
}
