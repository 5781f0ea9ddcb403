"""trainer.recompute: the same loss and gradients as keeping every activation (MLA and DeepSeek-V4 attention,
MoE with hash routing, mHC, MTP), and fewer bytes saved for the backward, measured with saved-tensor hooks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from trex.config_base import load_section
from trex.trainer.config import ModelConfig, RoutingConfig
from trex.trainer.model import build_model, compute_loss
from trex.trainer.parallel.recompute import apply_recompute

MODELS = {
    "mla": {"preset": "tiny", "overrides": {"mtpDepth": 1, "nHashLayers": 1}},
    "csa": {"preset": "tiny", "overrides": {"attention": "csa", "hcMult": 2, "mtpDepth": 1, "qLoraRank": 16,
                                            "vHeadDim": 24, "layerTypes": ["csa", "hca"]}},
}


def _step(model_cfg: dict[str, Any], mode: str) -> tuple[float, dict[str, torch.Tensor], int]:
    """(loss, gradients, bytes saved for the backward at the end of the forward) under ``mode``."""
    torch.manual_seed(0)
    cfg = load_section(ModelConfig, model_cfg)
    model = build_model(cfg, seed=0)
    apply_recompute(model, mode)
    ids = torch.randint(0, 512, (2, 33))
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        seen[key] = max(seen.get(key, 0), t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(ids[:, :-1], logits=False)
        loss, _ = compute_loss(out, ids[:, 1:], None, RoutingConfig(), 0)
    saved = sum(seen.values())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads, saved


@pytest.mark.parametrize("model", sorted(MODELS))
def test_recompute_matches_and_saves_fewer_bytes(model: str) -> None:
    torch.set_num_threads(1)
    runs = {mode: _step(MODELS[model], mode) for mode in ("none", "selective", "full")}
    loss, grads, saved = runs["none"]
    assert grads and saved > 0
    for mode in ("selective", "full"):
        got_loss, got_grads, _ = runs[mode]
        assert got_loss == loss, mode
        assert sorted(got_grads) == sorted(grads)
        for name, g in grads.items():
            assert torch.equal(got_grads[name], g), (mode, name)
    assert runs["full"][2] < runs["selective"][2] < saved, {m: r[2] for m, r in runs.items()}


def test_unknown_recompute_mode_names_the_field() -> None:
    model = build_model(load_section(ModelConfig, {"preset": "tiny"}), device="meta")
    with pytest.raises(ValueError, match=r"trainer\.recompute"):
        apply_recompute(model, "some")
