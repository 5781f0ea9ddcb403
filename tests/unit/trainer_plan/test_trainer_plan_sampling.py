"""The memory plan of the sampling modes (grpo, opd): the KV cache term against the bytes the rollout engine's
DecodeCache really allocates, and the whole-model copies (reference policy, decoding replica, FSDP2 units gathered
for the rollout) against a built model's own bytes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.mfu import DEVICES
from trex.trainer.model import ModelArgs, build_model
from trex.trainer.plan import kv_cache_bytes, plan_memory
from trex.trainer.rollout.cache import DecodeCache


def _tensor_bytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if dataclasses.is_dataclass(state):
        return sum(_tensor_bytes(getattr(state, f.name)) for f in dataclasses.fields(state))
    return 0


def _cache_bytes(cfg: TrainerConfig, rows: int, context: int) -> int:
    model = build_model(cfg.model, seed=0).eval()
    cache = DecodeCache.empty(rows, context)
    with torch.no_grad():
        model(torch.randint(0, 512, (rows, 12)), cache=cache)
    return sum(_tensor_bytes(s) for s in cache.states.values())


def _cfg(**extra: Any) -> TrainerConfig:
    return load_section(TrainerConfig, {"model": {"preset": "tiny"}, **extra})


def test_kv_cache_term_equals_the_mla_cache_and_bounds_the_v4_cache() -> None:
    mla = _cfg()
    assert kv_cache_bytes(ModelArgs.from_config(mla.model), 3, 40, 4) == _cache_bytes(mla, 3, 40)
    v4 = _cfg(model={"preset": "tiny", "overrides": {"attention": "csa", "qLoraRank": 16, "vHeadDim": 24, "numLayers": 3, "mtpDepth": 0}})
    real, bound = _cache_bytes(v4, 3, 64), kv_cache_bytes(ModelArgs.from_config(v4.model), 3, 64, 4)
    assert real <= bound <= 3 * real


def _whole(cfg: TrainerConfig) -> int:
    model = build_model(cfg.model, seed=0)
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def _buffers(cfg: TrainerConfig) -> int:
    return sum(t.numel() * t.element_size() for t in build_model(cfg.model, seed=0).buffers())


@pytest.mark.parametrize(("mode", "layout", "kl", "copies", "gathered"), [
    ("grpo", {"tp": 2}, 0.05, 1, False),  # the replica, and the reference sharded over tp
    ("grpo", {"tp": 2}, 0.0, 1, False),  # replica
    ("grpo", {}, 0.05, 0, True),  # dp2: the reference sharded over dp; FSDP2 units gathered for the rollout
    ("opd", {"ep": 2}, 0.0, 1, False),  # replica
    ("opd", {}, 0.0, 0, True),
])
def test_whole_model_copies_of_the_sampling_modes(mode: str, layout: dict[str, int], kl: float, copies: int,
                                                  gathered: bool) -> None:
    cfg = _cfg(mode=mode, parallelism=layout, data={"microBatchSize": 2, "seqLen": 64}, grpo={"klCoef": kl},
               opd={"teachers": [{"path": "/t"}]})
    plan = plan_memory(cfg, 2, DEVICES["cpu"], capacity=1 << 40)
    whole = _whole(cfg)
    reference = plan.sampling - copies * whole
    buffers = _buffers(cfg)
    if mode == "grpo" and kl > 0 and not layout:  # FSDP2 over 2 ranks: half of every parameter, whole buffers
        assert reference == (whole - buffers) // 2 + buffers
    elif mode == "grpo" and kl > 0:  # tp shards the attention and MLP matrices; the rest stays whole
        assert buffers < reference < whole
    else:
        assert reference == 0
    # the KV cache term (checked against the engine's cache above): this rank's samples, split over tp
    tp = layout.get("tp", 1)
    samples, new = (8, 512) if mode == "grpo" else (2, 64)  # the modes' defaults: group size, new tokens
    rows = 4 // (2 // tp) * samples // tp  # promptsPerStep 4 over dp = 2 / tp ranks, samples split over tp
    kv = kv_cache_bytes(ModelArgs.from_config(cfg.model), rows, min(1024, 64 + new), 4)
    assert plan.rollout == (whole if gathered else 0) + kv
    base = plan_memory(cfg.model_copy(update={"mode": "pretrain"}), 2, DEVICES["cpu"], capacity=1 << 40)
    assert (base.sampling, base.rollout) == (0, 0)
    assert plan.total == base.total + plan.sampling + max(0, plan.rollout - (base.total - base.persistent))
