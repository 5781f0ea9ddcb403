"""CEL `x-kubernetes-validations` for the CRDs: the cross-field rules of `trex validate` that CEL can express.

The API server then refuses such a job at `kubectl apply` even without the admission webhook. Rules that
need the model shape (experts, heads), the memory plan or the cluster's settings stay with `trex validate`
and the webhook. Each rule reads a field through :func:`value`, which falls back to the model's default
when the field is unset (the CRDs carry no defaults), so CEL and pydantic judge the same effective values.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, get_args

from pydantic import BaseModel
from trex.evaluation.config import EvalConfig, ModelSpec
from trex.kernels.config import KernelTuneConfig
from trex.ordata.config import ReconstructionConfig, SizeRange
from trex.trainer.config import TeacherConfig, TrainerConfig
from trex.trainer.mfu import DEVICES

from trex_operator.api import (
    _BACKEND_DEVICE,
    NPU_DEVICES_PER_REPLICA,
    CommonSpec,
    EvalJobSpec,
    KernelTuneJobSpec,
    StorageSpec,
    TrainJobSpec,
)


@dataclass(frozen=True)
class CelRule:
    """One rule on the objects of one model: ``rule`` must hold; ``message`` names the field, as validate does."""

    rule: str
    message: str

    def schema(self) -> dict[str, str]:
        """The x-kubernetes-validations entry."""
        return {"rule": self.rule, "message": self.message}


def _field(model: type[BaseModel], alias: str) -> tuple[Any, Any]:
    """(annotation, default) of the field spelt ``alias`` in ``model``; KeyError when there is none."""
    for name, f in model.model_fields.items():
        if (f.alias or name) == alias:
            return f.annotation, f.get_default(call_default_factory=True)
    raise KeyError(f"{model.__name__} has no field {alias!r}")


def literal(v: Any) -> str:
    """A Python value as a CEL literal (floats keep a decimal point: CEL does not compare 0 with 0.0)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (int, str)):
        return json.dumps(v).replace('"', "'") if isinstance(v, str) else str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(literal(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(x)}" for k, x in v.items()) + "}"
    if v is None:
        return "null"
    raise TypeError(f"no CEL literal for {type(v).__name__}")


def present(model: type[BaseModel], path: str) -> str:
    """CEL: every field on the camelCase ``path`` below ``self`` is set (checked against ``model``)."""
    keys = path.split(".")
    tp: Any = model
    for k in keys:
        tp = _model_of(_field(tp, k)[0]) or tp
    return " && ".join(f"has(self.{'.'.join(keys[:i + 1])})" for i in range(len(keys)))


def value(model: type[BaseModel], path: str) -> str:
    """CEL for the field at ``path`` below ``self``, or the model's default for it when it (or a section above
    it) is unset."""
    keys = path.split(".")
    tp: Any = model
    default: Any = None
    for k in keys:
        ann, default = _field(tp, k)
        tp = _model_of(ann) or tp
    return f"({present(model, path)} ? self.{path} : {literal(default)})"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation names (``X | None`` included), if any."""
    for t in (annotation, *get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def _world() -> str:
    return f"({value(TrainJobSpec, 'replicas')} * {value(TrainJobSpec, 'devicesPerReplica')})"


def _par(degree: str) -> str:
    return value(TrainJobSpec, f"trainer.parallelism.{degree}")


def _train_rules() -> list[CelRule]:
    w, tp, pp, ep, etp = _world(), _par("tp"), _par("pp"), _par("ep"), _par("etp")
    dp = f"({present(TrainJobSpec, 'trainer.parallelism.dp')} ? self.trainer.parallelism.dp : {w} / ({tp} * {pp}))"
    device_of = {name: sku.device_type for name, sku in DEVICES.items()}
    return [
        CelRule(f"{w} % {pp} == 0", "trainer.parallelism.pp: pp does not divide the world size "
                "(replicas x devicesPerReplica)"),
        CelRule(f"{w} % ({tp} * {pp}) == 0", "trainer.parallelism.tp: tp x pp does not divide the world size "
                "(replicas x devicesPerReplica)"),
        CelRule(f"!({present(TrainJobSpec, 'trainer.parallelism.dp')}) || {dp} * {tp} * {pp} == {w}",
                "trainer.parallelism.dp: dp x tp x pp must equal the world size (replicas x devicesPerReplica)"),
        CelRule(f"{w} % ({ep} * {etp} * {pp}) == 0", "trainer.parallelism.ep: ep x etp x pp does not divide the "
                "world size (MoE parallel folding needs edp = world / (ep x etp x pp) to be whole)"),
        CelRule(f"{w} % ({tp} * {pp}) != 0 || {dp} % {_par('dpReplicate')} == 0",
                "trainer.parallelism.dpReplicate: dpReplicate does not divide dp"),
        CelRule(f"!has(self.deviceModel) || {literal(device_of)}[self.deviceModel] == {value(TrainJobSpec, 'deviceType')}",
                "deviceModel: the device model is not of deviceType"),
        CelRule(f"{value(TrainJobSpec, 'trainer.model.dtype')} != 'fp64' || {value(TrainJobSpec, 'deviceType')} == 'cpu'",
                "trainer.model.dtype: fp64 is for CPU reference runs"),
        CelRule(f"!has(self.dataFrom) || !({present(TrainJobSpec, 'trainer.data.train')})",
                "dataFrom: set either dataFrom or trainer.data.train, not both"),
    ]


def _rollout_rules() -> list[CelRule]:
    """spec.rollout.server's cross-field rules (its memory plan stays with validate)."""
    srv = f"!({present(TrainJobSpec, 'rollout.server')})"
    servers = present(TrainJobSpec, "trainer.rollout.servers")
    engine = present(TrainJobSpec, "trainer.rollout.engine")
    return [
        CelRule(f"{srv} || {value(TrainJobSpec, 'trainer.mode')} in ['grpo', 'opd']",
                "rollout.server: only modes grpo and opd roll out"),
        CelRule(f"{srv} || !({servers}) || size(self.trainer.rollout.servers) == 0",
                "trainer.rollout.servers: rollout.server fills it with its servers' URLs; set one of the two"),
        CelRule(f"{srv} || !({engine}) || self.trainer.rollout.engine == 'vllm'",
                "trainer.rollout.engine: rollout.server runs vLLM servers; set vllm or leave it unset"),
        CelRule(f"{srv} || {value(TrainJobSpec, 'deviceType')} != 'npu' || "
                f"{value(TrainJobSpec, 'rollout.server.devicesPerReplica')} in {literal(list(NPU_DEVICES_PER_REPLICA))}",
                "rollout.server.devicesPerReplica: not allowed for deviceType npu; allowed: "
                + ", ".join(map(str, NPU_DEVICES_PER_REPLICA))),
        CelRule(f"{srv} || ({present(TrainJobSpec, 'volumes.checkpoints')} && "
                "!(has(self.volumes.checkpoints.emptyDir) && self.volumes.checkpoints.emptyDir))",
                "volumes.checkpoints: rollout.server loads the weight folders the trainer writes to its checkpoint "
                "volume; set a claimName or hostPath both can mount"),
        CelRule(f"{srv} || has(self.modelFrom) || ({present(TrainJobSpec, 'trainer.checkpoint.initFromHf')})",
                "rollout.server: vLLM starts from a Hugging Face folder; set modelFrom or trainer.checkpoint.initFromHf"),
    ]


def _eval_spec_rules() -> list[CelRule]:
    kind = value(EvalJobSpec, "evaluation.model.kind")
    return [
        CelRule(f"{kind} != 'openai' || has(self.server) || ({present(EvalJobSpec, 'evaluation.model.url')})",
                "evaluation.model.url: required for kind 'openai' unless server is set"),
        CelRule(f"!has(self.modelFrom) || {kind} in ['trex-checkpoint', 'openai']",
                "evaluation.model.kind: modelFrom needs 'trex-checkpoint' or 'openai' with a server"),
        CelRule(f"!has(self.modelFrom) || {kind} != 'openai' || has(self.server)",
                "server: modelFrom with evaluation.model.kind 'openai' needs a server"),
    ]


def rules() -> dict[type[BaseModel], list[CelRule]]:
    """Model -> the rules on its objects (a spec model also gets those of the models it extends)."""
    dev, per = value(CommonSpec, "deviceType"), value(CommonSpec, "devicesPerReplica")
    storage = " + ".join(f"({c} ? 1 : 0)" for c in (
        "has(self.claimName) && self.claimName != ''", "has(self.hostPath) && self.hostPath != ''",
        "has(self.emptyDir) && self.emptyDir"))
    return {
        CommonSpec: [CelRule(f"{dev} != 'npu' || {per} in {literal(list(NPU_DEVICES_PER_REPLICA))}",
                             "devicesPerReplica: not allowed for deviceType npu; allowed: "
                             + ", ".join(map(str, NPU_DEVICES_PER_REPLICA)))],
        StorageSpec: [
            CelRule(f"{storage} == 1", "claimName: exactly one of claimName, hostPath, emptyDir must be set"),
            CelRule("(!has(self.hostPath) || self.hostPath.startsWith('/')) && "
                    "(!has(self.mountPath) || self.mountPath.startsWith('/'))", "mountPath: paths must be absolute"),
        ],
        TrainJobSpec: _train_rules() + _rollout_rules(),
        TrainerConfig: [
            CelRule(f"{value(TrainerConfig, 'data.globalBatchSize')} % {value(TrainerConfig, 'data.microBatchSize')} == 0",
                    "data.globalBatchSize: must be a multiple of data.microBatchSize"),
            CelRule(f"{value(TrainerConfig, 'mode')} != 'opd' || "
                    "(has(self.opd) && has(self.opd.teachers) && size(self.opd.teachers) > 0)",
                    "opd.teachers: at least one teacher is required when mode is 'opd'"),
        ],
        KernelTuneJobSpec: [CelRule(f"{literal(_BACKEND_DEVICE)}[{value(KernelTuneJobSpec, 'kernels.backend')}] == "
                                    f"{value(KernelTuneJobSpec, 'deviceType')}",
                                    "deviceType: kernels.backend needs its device type (cpu-c: cpu, cuda-triton: gpu, "
                                    "npu-ascendc: npu)")],
        KernelTuneConfig: [CelRule(f"{value(KernelTuneConfig, 'suite')} != 'none' || "
                                   "(has(self.kernels) && size(self.kernels) > 0)",
                                   "kernels: must name at least one kernel when suite is 'none'")],
        TeacherConfig: [CelRule("has(self.name) || has(self.path)",
                                "name: give name (a TrainJob) or path (a model folder)")],
        SizeRange: [CelRule(f"{value(SizeRange, 'min')} <= {value(SizeRange, 'max')}", "min: must be <= max")],
        ReconstructionConfig: [CelRule(f"{value(ReconstructionConfig, 'mode')} != 'llm' || has(self.endpoint)",
                                       "endpoint: required when mode is 'llm'")],
        ModelSpec: [
            CelRule(f"{value(ModelSpec, 'kind')} != 'openai' || has(self.name)", "name: required when kind is 'openai'"),
            CelRule(f"!({value(ModelSpec, 'kind')} in ['transformers', 'trex-checkpoint']) || has(self.path)",
                    "path: required when kind is 'transformers' or 'trex-checkpoint'"),
        ],
        EvalConfig: [CelRule(f"{value(EvalConfig, 'protocol')} != 'strict' || !{value(EvalConfig, 'k')}.exists(k, k > 1)"
                             f" || {value(EvalConfig, 'model.sampling.temperature')} > 0.0",
                             "model.sampling.temperature: k > 1 needs temperature > 0 (greedy samples are identical)")],
        EvalJobSpec: _eval_spec_rules(),
    }


def reachable(model: type[BaseModel]) -> Iterator[type[BaseModel]]:
    """``model`` and every model its fields name, at any depth (each once)."""
    seen: set[type[BaseModel]] = set()
    stack = [model]
    while stack:
        m = stack.pop()
        if m in seen:
            continue
        seen.add(m)
        yield m
        for f in m.model_fields.values():
            todo = [f.annotation]
            while todo:
                t = todo.pop()
                if isinstance(t, type) and issubclass(t, BaseModel):
                    stack.append(t)
                todo.extend(get_args(t))


def rules_for(model: type[BaseModel]) -> list[dict[str, str]]:
    """The x-kubernetes-validations of ``model``'s schema node (its own rules and its bases')."""
    table = rules()
    return [r.schema() for base in model.__mro__ for r in table.get(base, [])]
