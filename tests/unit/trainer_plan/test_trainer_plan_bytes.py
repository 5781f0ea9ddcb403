"""The memory plan against independent references: the closed-form parameter counts, hand-computed local
shards, bytes measured on real runs (world 1), and tensors autograd actually saves."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig, resolved_model_values
from trex.trainer.mfu import DEVICES, param_breakdown
from trex.trainer.plan import Layout, activation_bytes, census, local_shape, measured_state_bytes, plan_memory

V4_TINY = {"attention": "csa", "hcMult": 4, "nHashLayers": 1, "qLoraRank": 16, "vHeadDim": 24, "nDenseLayers": 1, "numLayers": 3,
           "scoring": "sqrt-softplus"}


def _cfg(tmp: Path | None = None, overrides: dict[str, Any] | None = None, preset: str = "tiny", **over: Any
         ) -> TrainerConfig:
    data: dict[str, Any] = {
        "model": {"preset": preset, "overrides": overrides or {}}, "maxSteps": 2,
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 2},
        "optimizer": {"schedule": {"warmupSteps": 1}}, "stability": {"enabled": False},
        "checkpoint": {"dir": str(tmp or "ckpt"), "intervalSteps": 100},
    }
    data.update(over)
    return load_section(TrainerConfig, data)


@pytest.mark.parametrize("preset", ["v4-flash", "v4-pro"])
def test_census_of_the_large_presets_matches_the_closed_form_counts(preset: str) -> None:
    v = resolved_model_values(load_section(TrainerConfig, {"model": {"preset": preset}}).model)
    c = census(v)
    b = param_breakdown(v)
    assert c.total == b.total
    experts = sum(math.prod(p.shape) for p in c.params if p.placement == "experts")
    assert experts == b.routed_experts


def test_census_classes_follow_the_sharding_spec() -> None:
    c = census(resolved_model_values(_cfg(overrides=V4_TINY).model))
    by = {p.name: p for p in c.params}
    assert by["layers.0.mlp.gate_proj.weight"].placement == "tp_col"  # dense MLP (n_dense_layers 1)
    assert by["layers.0.mlp.down_proj.weight"].placement == "tp_row"
    assert by["layers.1.self_attn.q_b_proj.weight"].placement == "tp_col"
    assert by["layers.1.self_attn.o_a_proj.weight"].placement == "tp_col"  # V4: whole output groups per rank
    assert by["layers.1.self_attn.sinks"].placement == "tp_col"
    assert by["layers.1.self_attn.o_b_proj.weight"].placement == "tp_row"
    for name in ("layers.1.self_attn.q_a_proj.weight", "layers.1.self_attn.kv_proj.weight",
                 "layers.1.self_attn.compressor.kv_proj.weight", "layers.1.hc_attn.fn", "mtp.0.e_proj.weight",
                 "embed_tokens.weight", "lm_head.weight", "norm.weight"):
        assert by[name].placement == "replicated", name
    assert by["layers.1.mlp.gate.weight"].placement == "moe"
    assert by["layers.1.mlp.shared_experts.up_proj.weight"].placement == "moe"
    assert by["mtp.0.block.mlp.experts.down_proj"].placement == "experts"
    assert by["layers.2.mlp.experts.gate_proj"].unit == "layers.2"
    assert by["mtp.0.block.mlp.experts.gate_proj"].unit == "mtp.0"
    assert by["lm_head.weight"].unit == "root"


def test_local_shards_at_world_4() -> None:
    c = census(resolved_model_values(_cfg().model))  # tiny: D 64, 8 experts of I 32, vocab 512, 4 heads
    by = {p.name: p for p in c.params}
    ep_etp = Layout(world=4, dp=4, tp=1, ep=2, etp=2, dp_replicate=1)  # edp 1, dpShard 4
    assert local_shape(by["layers.0.mlp.experts.gate_proj"], ep_etp) == (4, 16, 64)
    assert local_shape(by["layers.0.mlp.experts.down_proj"], ep_etp) == (4, 64, 16)
    assert local_shape(by["embed_tokens.weight"], ep_etp) == (128, 64)
    assert local_shape(by["layers.0.self_attn.kv_a_proj_with_mqa.weight"], ep_etp) == (10, 64)  # 40 rows / 4
    tp_ep = Layout(world=4, dp=2, tp=2, ep=2, etp=1, dp_replicate=1)  # dpShard 2, edp 2
    assert local_shape(by["layers.0.self_attn.q_proj.weight"], tp_ep) == (24, 64)  # 96 / tp 2 / dp 2
    assert local_shape(by["layers.0.self_attn.o_proj.weight"], tp_ep) == (32, 32)
    assert local_shape(by["layers.0.mlp.gate.weight"], tp_ep) == (2, 64)  # dpShard x tp = 4
    assert local_shape(by["layers.0.mlp.experts.up_proj"], tp_ep) == (2, 32, 64)  # 8 / ep 2 / edp 2
    assert local_shape(by["layers.0.input_layernorm.weight"], tp_ep) == (32,)
    hsdp = Layout(world=4, dp=4, tp=1, ep=1, etp=1, dp_replicate=2)  # dense sharded over 2, replicated over 2
    assert local_shape(by["embed_tokens.weight"], hsdp) == (256, 64)
    odd = Layout(world=3, dp=3, tp=1, ep=1, etp=1, dp_replicate=1)
    assert local_shape(by["embed_tokens.weight"], odd) == (171, 64)  # ceil(512 / 3): the most loaded rank


def test_sharded_plan_is_an_nth_of_world_1_in_fp32() -> None:
    one = plan_memory(_cfg(), 1, DEVICES["cpu"], capacity=1 << 40)
    four = plan_memory(_cfg(parallelism={"ep": 2, "etp": 2}), 4, DEVICES["cpu"], capacity=1 << 40)
    for part in ("params", "grads", "muon_state", "adamw_state"):
        assert getattr(one, part) / 4 <= getattr(four, part) <= getattr(one, part) / 4 * 1.05, part
    bf16 = plan_memory(_cfg(model={"preset": "tiny", "dtype": "bf16"}), 1, DEVICES["cpu"], capacity=1 << 40)
    assert bf16.params * 2 == one.params  # one process keeps bf16 parameters; sharded runs fp32 masters
    bf16_4 = plan_memory(_cfg(model={"preset": "tiny", "dtype": "bf16"}, parallelism={"ep": 2, "etp": 2}), 4,
                         DEVICES["cpu"], capacity=1 << 40)
    assert bf16_4.params == four.params and bf16_4.fsdp_gather * 2 == four.fsdp_gather


@pytest.mark.parametrize(("overrides", "dtype"), [({}, "fp32"), (V4_TINY, "fp32"), (V4_TINY, "bf16")])
def test_plan_equals_measured_state_bytes_of_a_real_run(tmp_path: Path, overrides: dict[str, Any],
                                                        dtype: str) -> None:
    from trex.trainer.loop import Trainer

    cfg = _cfg(tmp_path, overrides, model={"preset": "tiny", "dtype": dtype, "overrides": overrides})
    tr = Trainer(cfg, tmp_path, measure_peak=False, log=lambda _m: None)
    tr.train_step()  # optimizer states exist after the first step
    tr.opts.zero_grad = lambda: None  # type: ignore[method-assign]  # keep the second step's gradients
    tr.train_step()
    got = measured_state_bytes(tr.model, tr.opts)
    plan = plan_memory(cfg, 1, DEVICES["cpu"])
    for part in ("params", "grads", "muon_state", "adamw_state"):
        assert got[part] == pytest.approx(getattr(plan, part), rel=0.05), part
    assert got["params"] > 0 and got["muon_state"] > 0 and got["adamw_state"] > 0


def _saved_bytes(cfg: TrainerConfig, seq: int, batch: int, recompute: str = "none") -> int:
    """Bytes of the distinct storages autograd saves for one forward + loss (parameters excluded)."""
    from trex.trainer.model import build_model, compute_loss
    from trex.trainer.parallel.recompute import apply_recompute

    model = build_model(cfg.model)
    apply_recompute(model, recompute)
    ids = torch.randint(0, 512, (batch, seq), generator=torch.Generator().manual_seed(0))
    sizes: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        sizes[st.data_ptr()] = max(sizes.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(ids, None, torch.zeros_like(ids), logits=False)
        compute_loss(out, ids, torch.ones_like(ids, dtype=torch.bool), cfg.routing, 0)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in sizes.items() if ptr not in params)


@pytest.mark.parametrize("overrides", [{}, {"attention": "csa", "hcMult": 4, "hiddenSize": 128, "qLoraRank": 16, "vHeadDim": 24}])
def test_activation_estimate_tracks_what_autograd_saves(overrides: dict[str, Any]) -> None:
    cfg = _cfg(overrides=overrides)
    measured = _saved_bytes(cfg, seq=256, batch=2)
    est = activation_bytes(resolved_model_values(cfg.model), Layout(1, 1, 1, 1, 1, 1), 2, 256, 4,
                           attention_probs=True)
    assert 0.75 <= est / measured <= 1.33, (est, measured)


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recompute_estimate_bounds_what_autograd_keeps(recompute: str) -> None:
    """With recompute the plan adds one layer's (block's) recompute to what the forward keeps, so it is an
    upper bound on the storages saved at the end of the forward, and below the plan without recompute."""
    cfg = _cfg(overrides={"attention": "csa", "hcMult": 4, "hiddenSize": 128, "qLoraRank": 16, "vHeadDim": 24})
    measured = _saved_bytes(cfg, seq=256, batch=2, recompute=recompute)
    values, lay = resolved_model_values(cfg.model), Layout(1, 1, 1, 1, 1, 1)
    est = activation_bytes(values, lay, 2, 256, 4, attention_probs=True, recompute=recompute)
    assert measured <= est < activation_bytes(values, lay, 2, 256, 4, attention_probs=True), (est, measured)
