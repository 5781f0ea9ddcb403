"""Routers: V3 group-limited sigmoid, V4 sqrt-softplus + hash layers, bias semantics, anticipatory routing,
aux-loss-free bias updates and the sequence balance loss, against hand-computed references."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from trex.trainer.config import ModelConfig, ModelOverrides
from trex.trainer.model import ModelArgs, build_model, update_expert_bias
from trex.trainer.model.moe import Gate, sequence_balance_loss


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _identity_gate(**kw: Any) -> Gate:
    """A gate whose logits equal the input (weight = identity)."""
    args = ModelArgs(hidden_size=8, n_routed_experts=8, **kw)
    gate = Gate(args)
    with torch.no_grad():
        gate.weight.copy_(torch.eye(8))
    return gate


PROBS = [0.9, 0.1, 0.6, 0.55, 0.85, 0.05, 0.3, 0.2]  # group sums (pairs): 1.0, 1.15, 0.9, 0.5


def test_v3_group_limited_routing_matches_hand_case() -> None:
    gate = _identity_gate(experts_per_token=2, n_groups=4, topk_groups=2, routed_scaling_factor=2.0)
    x = torch.tensor([[_logit(p) for p in PROBS]])
    w, idx, _ = gate(x, torch.zeros(1, dtype=torch.long))
    order = idx[0].argsort()
    # plain top-2 would be experts 0 and 4; groups 1 and 0 win, so 0 (0.9) and 2 (0.6)
    assert idx[0][order].tolist() == [0, 2]
    assert w[0][order].tolist() == pytest.approx([2 * 0.9 / 1.5, 2 * 0.6 / 1.5], rel=1e-5)


def test_plain_topk_without_groups() -> None:
    gate = _identity_gate(experts_per_token=2)
    x = torch.tensor([[_logit(p) for p in PROBS]])
    w, idx, _ = gate(x, torch.zeros(1, dtype=torch.long))
    order = idx[0].argsort()
    assert idx[0][order].tolist() == [0, 4]
    assert w[0][order].tolist() == pytest.approx([0.9 / 1.75, 0.85 / 1.75], rel=1e-5)


def test_bias_changes_selection_only() -> None:
    gate = _identity_gate(experts_per_token=2, n_groups=4, topk_groups=2, routed_scaling_factor=2.0)
    gate.e_score_correction_bias[3] = 0.5  # biased 1.05: group 1 sum 1.65
    x = torch.tensor([[_logit(p) for p in PROBS]])
    w, idx, _ = gate(x, torch.zeros(1, dtype=torch.long))
    order = idx[0].argsort()
    assert idx[0][order].tolist() == [0, 3]
    # weights from the unbiased scores 0.9 and 0.55
    assert w[0][order].tolist() == pytest.approx([2 * 0.9 / 1.45, 2 * 0.55 / 1.45], rel=1e-5)
    assert not gate.e_score_correction_bias.requires_grad
    assert "e_score_correction_bias" not in dict(gate.named_parameters())


def _sqrt_softplus(x: float) -> float:
    return math.sqrt(math.log1p(math.exp(x)))


def test_v4_sqrt_softplus_scores_and_topk() -> None:
    gate = _identity_gate(experts_per_token=3, scoring="sqrt-softplus", routed_scaling_factor=1.5)
    logits = [0.3, -1.0, 2.0, 0.1, -0.5, 1.2, -2.0, 0.0]
    w, idx, scores = gate(torch.tensor([logits]), torch.zeros(1, dtype=torch.long))
    ref = [_sqrt_softplus(v) for v in logits]
    assert scores[0].tolist() == pytest.approx(ref, rel=1e-5)
    order = idx[0].argsort()
    assert idx[0][order].tolist() == [0, 2, 5]
    tot = ref[0] + ref[2] + ref[5]
    assert w[0][order].tolist() == pytest.approx([1.5 * ref[i] / tot for i in (0, 2, 5)], rel=1e-5)


def test_hash_layers_route_by_token_id_with_score_weights() -> None:
    args = ModelArgs(vocab_size=64, hidden_size=8, n_routed_experts=8, experts_per_token=2,
                     scoring="sqrt-softplus", routed_scaling_factor=1.0)
    gate = Gate(args, hash_routed=True, seed=3, layer=0)
    with torch.no_grad():
        gate.weight.copy_(torch.eye(8))
    table = gate.tid2eid
    assert table.shape == (64, 2)
    assert all(len(set(row)) == 2 for row in table.tolist())
    assert torch.equal(table, Gate(args, hash_routed=True, seed=3, layer=0).tid2eid)
    assert not torch.equal(table, Gate(args, hash_routed=True, seed=4, layer=0).tid2eid)
    tokens = torch.tensor([5, 17, 5])
    x = torch.randn(3, 8)
    gate.e_score_correction_bias.fill_(100.0)  # the bias must not matter for hash layers
    w, idx, _ = gate(x, tokens)
    assert torch.equal(idx, table[tokens])
    for r in range(3):
        s = [_sqrt_softplus(float(x[r, e])) for e in idx[r].tolist()]
        assert w[r].tolist() == pytest.approx([v / sum(s) for v in s], rel=1e-5)


def test_model_hash_layers_are_the_first_moe_layers() -> None:
    cfg = ModelConfig(overrides=ModelOverrides(num_layers=3, n_dense_layers=1, n_hash_layers=1,
                                               scoring="sqrt-softplus"))
    model = build_model(cfg)
    flags = [g.hash_routed for _, g in model.moe_gates()]
    assert flags == [True, False, False]  # layer 1 (first MoE), layer 2, then the MTP block
    out = model(torch.randint(0, 512, (2, 16)))
    assert out.expert_counts.shape == (3, 8)
    assert out.expert_counts.sum(1).tolist() == [2 * 16 * 2] * 3


def test_anticipatory_routing_uses_old_indices_and_current_weights() -> None:
    torch.manual_seed(0)
    args = ModelArgs(hidden_size=8, n_routed_experts=8, experts_per_token=2)
    gate = Gate(args)
    with torch.no_grad():
        gate.weight.normal_()
    old = torch.randn(8, 8)
    x = torch.randn(16, 8)
    gate.anticipatory_weight = old
    w, idx, _ = gate(x, torch.zeros(16, dtype=torch.long))
    old_scores = torch.sigmoid(x.double() @ old.double().t())
    assert torch.equal(idx.sort(-1).values, old_scores.topk(2, -1).indices.sort(-1).values)
    cur = torch.sigmoid(x.double() @ gate.weight.detach().double().t()).gather(1, idx)
    assert torch.allclose(w.double(), cur / cur.sum(-1, keepdim=True), atol=1e-6)
    w.pow(2).sum().backward()
    assert gate.weight.grad is not None and gate.weight.grad.abs().sum() > 0
    gate.anticipatory_weight = None
    _, idx2, _ = gate(x, torch.zeros(16, dtype=torch.long))
    cur_all = torch.sigmoid(x.double() @ gate.weight.detach().double().t())
    assert torch.equal(idx2.sort(-1).values, cur_all.topk(2, -1).indices.sort(-1).values)


def test_model_set_anticipatory_router_weights() -> None:
    model = build_model(ModelConfig())
    gates = model.moe_gates()
    names = [n for n, _ in gates]
    ids = torch.randint(0, 512, (2, 16))
    olds = {f"{n}.weight": torch.randn_like(g.weight) for n, g in gates}
    model.set_anticipatory_router_weights(olds)
    assert all(g.anticipatory_weight is not None for _, g in gates)
    out = model(ids)
    (out.logits.float().pow(2).mean() + sum(m.float().pow(2).mean() for m in out.mtp_logits)).backward()
    assert all(g.weight.grad is not None and g.weight.grad.abs().sum() > 0 for _, g in gates)
    model.set_anticipatory_router_weights(None)
    assert all(g.anticipatory_weight is None for _, g in gates)
    with pytest.raises(ValueError, match="unknown router"):
        model.set_anticipatory_router_weights({"nope": olds[f"{names[0]}.weight"]})


def test_sequence_balance_loss_matches_formula() -> None:
    torch.manual_seed(1)
    b, t, e, k = 2, 5, 4, 2
    scores = torch.rand(b, t, e, dtype=torch.float64)
    idx = torch.stack([torch.randperm(e)[:k] for _ in range(b * t)]).view(b, t, k)
    ref = 0.0
    for r in range(b):
        tot = 0.0
        for i in range(e):
            f = e / (k * t) * sum(int(i in idx[r, s].tolist()) for s in range(t))
            p = sum(float(scores[r, s, i] / scores[r, s].sum()) for s in range(t)) / t
            tot += f * p
        ref += tot / b
    assert float(sequence_balance_loss(scores, idx, e)) == pytest.approx(ref, rel=1e-9)


def test_aux_free_bias_update_reduces_imbalance() -> None:
    model = build_model(ModelConfig(overrides=ModelOverrides(mtp_depth=0)), seed=0)
    ids = torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(0))
    inputs: dict[str, torch.Tensor] = {}
    hooks = [g.register_forward_pre_hook(lambda m, a, n=n: inputs.__setitem__(n, a[0].detach()))
             for n, g in model.moe_gates()]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    with torch.no_grad():
        for name, gate in model.moe_gates():
            direction = inputs[name].mean(0)
            gate.weight[:2] += 4.0 * direction / direction.pow(2).sum()  # experts 0 and 1 favoured

    def imbalance() -> float:
        with torch.no_grad():
            counts = model(ids).expert_counts.float()
        return float((counts.max(1).values / counts.mean(1)).mean())

    before = imbalance()
    for _ in range(60):
        with torch.no_grad():
            counts = model(ids).expert_counts
        update_expert_bias(model, counts, speed=0.01)
    after = imbalance()
    assert before > 2.5
    assert after < before / 2  # the residual imbalance (about 1.4 to 1.6) depends on the init draw
    with pytest.raises(ValueError, match="rows"):
        update_expert_bias(model, counts[:1], speed=0.01)
