"""Device memory by rollout engine: the trainer's plan without the decoding replica when vLLM servers roll out,
the whole replica the in-process engine needs per rank, and the per-device plan of a vLLM server.

The in-process engine (trex.trainer.parallel.decode.DecodeReplica) decodes on a whole unsharded copy of the model
on every rank; with ``rollout.engine: vllm`` the trainer holds no decoding copy and no KV cache, and the servers
hold the model sharded over their own devices (tensor parallel), counted here separately from the trainer's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trex.trainer.config import TrainerConfig, resolved_model_values
from trex.trainer.mfu import DeviceSku
from trex.trainer.plan import (
    Layout,
    MemoryPlan,
    ParamInfo,
    census,
    kv_cache_bytes,
    plan_memory,
    reference_bytes,
)

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp64": 8}
VLLM_MEMORY_UTILIZATION = 0.9
"""vLLM's default --gpu-memory-utilization: the share of a device it plans to use."""


def whole_model_bytes(cfg: TrainerConfig) -> int:
    """Bytes of one whole unsharded copy of the model in model.dtype (parameters and buffers): what the
    in-process engine's decoding replica holds per rank, and what a vLLM server spreads over its devices."""
    c = census(resolved_model_values(cfg.model))
    return c.total * DTYPE_BYTES[cfg.model.dtype] + c.buffer_bytes


def trainer_plan(cfg: TrainerConfig, world: int, device: DeviceSku, capacity: int | None = None) -> MemoryPlan:
    """The trainer's per-device plan (trex.trainer.plan.plan_memory); with ``rollout.engine: vllm`` the sampling
    modes keep only grpo's sharded reference policy (klCoef > 0) and, as the rollout transient, no replica and no
    KV cache: only a transfer push's bucket (:func:`transfer_push_bytes`)."""
    plan = plan_memory(cfg, world, device, capacity)
    if cfg.mode not in ("grpo", "opd") or cfg.rollout.engine != "vllm":
        return plan
    lay = Layout.of(cfg, world)
    c = census(resolved_model_values(cfg.model))
    return replace(plan, sampling=reference_bytes(cfg, c, lay, world), rollout=transfer_push_bytes(cfg, c.params))


def transfer_push_bytes(cfg: TrainerConfig, params: tuple[ParamInfo, ...]) -> int:
    """What trainer rank 0 holds on its device beyond its shards while a ``rollout.weightPush: transfer`` push runs:
    the bucket being broadcast and the one output tensor being assembled (vLLM's nccl backend has one source, so
    the bytes meet there: trex.trainer.rollout.weight_transfer.plan_to_rank0); nothing with the disk push."""
    if cfg.rollout.weight_push != "transfer":
        return 0
    largest = max((math.prod(p.shape) for p in params), default=0) * DTYPE_BYTES[cfg.model.dtype]
    return cfg.rollout.transfer_bucket_bytes + largest


def rollout_rows(cfg: TrainerConfig) -> tuple[int, int]:
    """(responses sampled per optimizer step, their context in tokens) of mode grpo or opd."""
    if cfg.mode == "opd":
        rows, new = cfg.opd.prompts_per_step * cfg.opd.samples_per_prompt, cfg.opd.sampling.max_new_tokens
    else:
        rows, new = cfg.grpo.prompts_per_step * cfg.grpo.group_size, cfg.grpo.max_new_tokens
    return rows, min(cfg.model.args.max_seq_len, cfg.data.seq_len + new)


@dataclass(frozen=True)
class ServerPlan:
    """Bytes per device of one vLLM server replica: the weights sharded over its devices, and the KV cache of the
    responses it serves per step (MLA's latent cache is whole on every tensor-parallel rank)."""

    weights: int
    kv_cache: int
    devices: int
    replicas: int
    device: DeviceSku
    capacity: int | None
    """Bytes vLLM may use per device (the device's memory x --gpu-memory-utilization; None: unknown)."""

    @property
    def total(self) -> int:
        """Weights + KV cache per device."""
        return self.weights + self.kv_cache

    @property
    def fits(self) -> bool | None:
        """total <= capacity (None when the capacity is unknown)."""
        return None if self.capacity is None else self.total <= self.capacity


def server_plan(cfg: TrainerConfig, devices: int, replicas: int, device: DeviceSku,
                utilization: float = VLLM_MEMORY_UTILIZATION, max_model_len: int | None = None) -> ServerPlan:
    """The per-device plan of a vLLM server replica on ``devices`` devices (tensor parallel) serving 1/``replicas``
    of the step's rollouts of ``cfg``, each at most ``max_model_len`` tokens (the server's --max-model-len) when
    given; ``devices`` 0 (a CPU server) holds the whole model."""
    shards = max(devices, 1)
    rows, context = rollout_rows(cfg)
    if max_model_len is not None:
        context = min(context, max_model_len)
    kv = kv_cache_bytes(cfg.model.args, math.ceil(rows / replicas), context, DTYPE_BYTES[cfg.model.dtype])
    capacity = None if device.memory_bytes is None else int(device.memory_bytes * utilization)
    return ServerPlan(weights=math.ceil(whole_model_bytes(cfg) / shards), kv_cache=kv, devices=devices,
                      replicas=replicas, device=device, capacity=capacity)
