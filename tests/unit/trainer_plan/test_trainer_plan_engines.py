"""Memory by rollout engine: the in-process engine's whole replica against a built model's bytes, the trainer's plan
without it under vLLM, the server's plan (weights over its devices + the KV cache the engine's cache allocates), and
the validity rules that refuse an in-process replica that cannot fit or a vLLM engine with nowhere to roll out."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.engine_plan import server_plan, trainer_plan, whole_model_bytes
from trex.trainer.mfu import DEVICES
from trex.trainer.model import build_model
from trex.trainer.plan import plan_memory
from trex.trainer.rollout.cache import DecodeCache
from trex.trainer.rules import job_problems


def _cfg(**extra: Any) -> TrainerConfig:
    return load_section(TrainerConfig, {"model": {"preset": "tiny"}, **extra})


def _built_bytes(cfg: TrainerConfig) -> int:
    model = build_model(cfg.model, seed=0)
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def _tensor_bytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if dataclasses.is_dataclass(state):
        return sum(_tensor_bytes(getattr(state, f.name)) for f in dataclasses.fields(state))
    return 0


def test_whole_replica_is_the_built_models_bytes() -> None:
    cfg = _cfg(mode="grpo")
    assert whole_model_bytes(cfg) == _built_bytes(cfg)


@pytest.mark.parametrize(("mode", "kl"), [("grpo", 0.05), ("grpo", 0.0), ("opd", 0.0)])
def test_vllm_engine_plans_no_replica_and_no_kv_cache(mode: str, kl: float) -> None:
    extra = {"mode": mode, "parallelism": {"tp": 2}, "data": {"microBatchSize": 2, "seqLen": 64},
             "grpo": {"klCoef": kl}, "opd": {"teachers": [{"path": "/t"}]}}
    inprocess = plan_memory(_cfg(**extra), 2, DEVICES["cpu"], capacity=1 << 40)
    vllm_cfg = _cfg(**extra, rollout={"engine": "vllm", "servers": ["http://s:8000"]})
    vllm = trainer_plan(vllm_cfg, 2, DEVICES["cpu"], capacity=1 << 40)
    whole = _built_bytes(vllm_cfg)
    assert inprocess.rollout > 0 and vllm.rollout == 0
    # only grpo's reference policy stays (sharded over tp: less than a whole copy)
    assert (0 < vllm.sampling < whole) if mode == "grpo" and kl > 0 else vllm.sampling == 0
    assert inprocess.sampling - vllm.sampling == whole  # the decoding replica under tp
    assert (vllm.params, vllm.grads, vllm.activations) == (inprocess.params, inprocess.grads, inprocess.activations)


def test_transfer_push_plans_one_bucket_and_the_largest_built_tensor_on_rank_zero() -> None:
    extra = {"mode": "grpo", "parallelism": {"tp": 2}, "data": {"microBatchSize": 2, "seqLen": 64}}
    rollout = {"engine": "vllm", "servers": ["http://s:8000"], "weightPush": "transfer", "transferBucketBytes": 4096}
    cfg = _cfg(**extra, rollout=rollout)
    plan = trainer_plan(cfg, 2, DEVICES["cpu"], capacity=1 << 40)
    model = build_model(cfg.model)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    assert plan.rollout == 4096 + largest
    disk = trainer_plan(_cfg(**extra, rollout={**rollout, "weightPush": "disk"}), 2, DEVICES["cpu"], capacity=1 << 40)
    assert disk.rollout == 0


def test_server_plan_is_weights_over_devices_plus_the_engines_kv_cache() -> None:
    cfg = _cfg(mode="grpo", data={"seqLen": 24}, grpo={"promptsPerStep": 3, "groupSize": 4, "maxNewTokens": 16})
    plan = server_plan(cfg, devices=4, replicas=2, device=DEVICES["h100"], utilization=0.5)
    assert plan.weights == math.ceil(_built_bytes(cfg) / 4)
    rows, context = 6, 40  # 3 x 4 responses over 2 servers; seqLen + maxNewTokens tokens
    model = build_model(cfg.model, seed=0).eval()
    cache = DecodeCache.empty(rows, context)
    with torch.no_grad():
        model(torch.randint(0, 512, (rows, 12)), cache=cache)
    assert plan.kv_cache == sum(_tensor_bytes(s) for s in cache.states.values())
    assert plan.capacity == DEVICES["h100"].memory_bytes // 2 and plan.fits
    # --max-model-len caps every response's context: 6 rows of 20 tokens
    capped = server_plan(cfg, devices=4, replicas=2, device=DEVICES["h100"], max_model_len=20)
    assert capped.kv_cache * 2 == plan.kv_cache and capped.weights == plan.weights


def test_inprocess_replica_that_cannot_fit_is_refused_naming_the_engine() -> None:
    flash = {"model": {"preset": "v4-flash", "dtype": "bf16"}, "parallelism": {"ep": 64}, "mode": "grpo",
             "data": {"seqLen": 512, "microBatchSize": 1}, "grpo": {"promptsPerStep": 512, "klCoef": 0.0}}
    cfg = load_section(TrainerConfig, flash)
    [(path, message)] = job_problems(cfg, 512, DEVICES["910c"])
    assert path == "rollout.engine"
    gib = whole_model_bytes(cfg) / 2**30
    assert 500 < gib < 600  # 290B parameters in bf16
    assert f"({gib:.1f} GiB in model.dtype)" in message
    assert "set trainer.rollout.engine: vllm and spec.rollout.server" in message
    # the same job rolling out on vLLM servers: no replica on the trainer's devices, it fits
    served = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"engine": "vllm",
                                                                               "servers": ["http://s:8000"]})})
    assert job_problems(served, 512, DEVICES["910c"]) == []
    # a small model decodes in process as before
    assert job_problems(_cfg(mode="grpo"), 1, DEVICES["h100"]) == []


def test_vllm_engine_without_servers_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"servers: engine vllm needs at least one server URL"):
        _cfg(mode="grpo", rollout={"engine": "vllm"})
    with pytest.raises(ValueError, match=r"servers\.0: 'localhost:8000' is not an http"):
        _cfg(rollout={"engine": "vllm", "servers": ["localhost:8000"]})


def test_router_gather_is_every_built_routers_whole_weight() -> None:
    """Anticipatory routing gathers every router's whole Δt-old weight on the sharded layouts: the plan's term is
    the built model's router weights (0 in one process, where a snapshot is already whole)."""
    from trex.trainer.model import build_model

    cfg = _cfg(mode="pretrain")
    gates = sum(g.weight.numel() * g.weight.element_size() for _, g in build_model(cfg.model, seed=0).moe_gates())
    assert gates > 0
    assert plan_memory(cfg, 2, DEVICES["cpu"], capacity=1 << 40).router_gather == gates
    assert plan_memory(cfg, 1, DEVICES["cpu"], capacity=1 << 40).router_gather == 0
