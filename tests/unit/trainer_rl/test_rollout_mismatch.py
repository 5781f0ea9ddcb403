"""The rollout section's fields, the engine-vs-trainer mismatch metrics and truncated importance sampling, against
independent references (numpy statistics, the GRPO loss written out by hand); the tiny-vllm preset's HF export is the
shape vLLM's CPU MLA kernel takes. The vLLM server itself is exercised in tests/integration/trainer/test_rollout_vllm.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.rl.grpo import grpo_loss
from trex.trainer.rl.mismatch import Mismatch, tis_correction


def _cfg(rollout: dict[str, Any]) -> TrainerConfig:
    return load_section(TrainerConfig, {"model": {"preset": "tiny"}, "rollout": rollout})


def test_rollout_section_defaults_to_the_in_process_engine() -> None:
    cfg = _cfg({})
    assert cfg.rollout.engine == "inprocess" and cfg.rollout.tis_cap is None


@pytest.mark.parametrize(("rollout", "field"), [
    ({"engine": "vllm"}, "servers"),
    ({"engine": "vllm", "servers": ["127.0.0.1:8000"]}, "servers.0"),
    ({"engine": "sglang", "servers": ["http://x:1"]}, "engine"),
    ({"tisCap": 0}, "tisCap"),
])
def test_bad_rollout_fields_are_named(rollout: dict[str, Any], field: str) -> None:
    with pytest.raises((ValidationError, ValueError)) as e:
        _cfg(rollout)
    assert field in str(e.value)


def test_mismatch_metrics_equal_numpy_statistics() -> None:
    g = torch.Generator().manual_seed(0)
    x = -torch.rand(4, 10, generator=g, dtype=torch.float64) * 3
    y = x + torch.randn(4, 10, generator=g, dtype=torch.float64) * 0.05
    valid = torch.rand(4, 10, generator=g) > 0.3
    m = Mismatch()
    m.add(x[:2], y[:2], valid[:2])  # two micro-batches
    m.add(x[2:], y[2:], valid[2:])
    got = m.metrics(alert=0.01)
    xs, ys = x[valid].numpy(), y[valid].numpy()
    assert got["rollout_logprob_mismatch_mean"] == pytest.approx(np.abs(xs - ys).mean(), rel=1e-12)
    assert got["rollout_logprob_mismatch_max"] == pytest.approx(np.abs(xs - ys).max(), rel=1e-12)
    assert got["rollout_logprob_mismatch_corr"] == pytest.approx(np.corrcoef(xs, ys)[0, 1], rel=1e-9)
    assert got["rollout_logprob_mismatch_alert"] == 1.0
    assert m.metrics(alert=1.0)["rollout_logprob_mismatch_alert"] == 0.0
    assert Mismatch().metrics(alert=0.1) == {}


def test_truncated_importance_sampling_weights_each_token_by_the_capped_ratio() -> None:
    g = torch.Generator().manual_seed(1)
    rollout = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 2
    logp = (rollout + torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.bool)
    cap = 1.5
    old, w = tis_correction(logp, rollout, cap)
    out = grpo_loss(logp, old, None, adv, mask, clip_eps=0.2, token_weights=w)
    out.loss.backward()
    # By hand: ratio to the trainer's own (detached) log-probs is 1 in value, its gradient d ratio / d logp = 1; the
    # loss is -mean(min(exp(lp - rollout), cap) * adv), its gradient -min(...) * adv / n per token.
    weight = np.minimum(np.exp(logp.detach().numpy() - rollout.numpy()), cap)
    ref_loss = -(weight * adv.numpy()[:, None]).mean()
    assert float(out.loss) == pytest.approx(ref_loss, rel=1e-12)
    assert logp.grad is not None
    np.testing.assert_allclose(logp.grad.numpy(), -weight * adv.numpy()[:, None] / 15, rtol=1e-12)
    with pytest.raises(ValueError, match="tisCap"):
        tis_correction(logp, rollout, 0.0)


def test_without_token_weights_the_loss_is_unchanged() -> None:
    g = torch.Generator().manual_seed(2)
    logp, old = torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 4, dtype=torch.bool)
    a = grpo_loss(logp, old, None, adv, mask)
    b = grpo_loss(logp, old, None, adv, mask, token_weights=torch.ones(2, 4))
    assert float(a.loss) == float(b.loss)


def test_tiny_vllm_export_has_the_shape_vllm_cpu_mla_serves(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models
    from trex.prompt_contract import BOS, END, EOS, PAD
    from trex.trainer.export import export_hf
    from trex.trainer.model import build_model

    cfg = load_section(TrainerConfig, {"model": {"preset": "tiny-vllm"}, "device": "cpu"})
    model = build_model(cfg.model, device="cpu", dtype=torch.float32, seed=0)
    vocab = {f"t{i}": i for i in range(508)} | {t: 508 + j for j, t in enumerate((BOS, EOS, END, PAD))}
    folder = export_hf(model, Tokenizer(models.WordLevel(vocab, unk_token="t0")), tmp_path / "hf")
    conf = json.loads((folder / "config.json").read_text())
    assert conf["architectures"] == ["DeepseekV3ForCausalLM"] and conf["topk_method"] == "noaux_tc"
    assert conf["kv_lora_rank"] + conf["qk_rope_head_dim"] == 576  # vLLM's CPU MLA kernel's only head size
    assert conf["swiglu_limit"] == 0 and conf["num_nextn_predict_layers"] == 0
    assert conf["first_k_dense_replace"] == conf["num_hidden_layers"]  # dense: vLLM's CPU reload is exact for it
