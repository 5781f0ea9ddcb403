"""GRPO's loss and gradients on fixed rollouts against a float64 reference written here token by token."""

from __future__ import annotations

import math

import pytest
import torch
from trex.trainer.rl.grpo import group_advantages, grpo_loss, k3_kl, step_metrics, token_logprobs

EPS, EPS_HIGH, BETA = 0.2, 0.28, 0.05


def _rollouts() -> dict[str, torch.Tensor]:
    """2 prompts x G=3 responses of up to 5 tokens: ragged masks, one stale token, ratios inside and
    outside the clip range on both signs of the advantage."""
    g = torch.Generator().manual_seed(3)
    b, t = 6, 5
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    logp = old + (torch.rand(b, t, generator=g, dtype=torch.float64) - 0.5) * 0.9  # ratios ~ [0.64, 1.57]
    ref = old + (torch.rand(b, t, generator=g, dtype=torch.float64) - 0.5) * 0.5
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0],
                         [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.float64)
    stale = torch.zeros(b, t, dtype=torch.float64)
    stale[4, 3] = 1
    rewards = torch.tensor([[2.5, 0.5, 0.0], [1.0, 2.5, 1.5]], dtype=torch.float64)
    return {"logp": logp, "old": old, "ref": ref, "mask": mask, "stale": stale, "rewards": rewards}


def _reference(r: dict[str, torch.Tensor]) -> tuple[float, list[list[float]], float, float]:
    """Plain-float GRPO: group-normalised advantages (unbiased std), min(ratio * A, clip(ratio) * A), k3 KL,
    token mean over valid tokens; analytic d loss / d logp per token."""
    rewards = r["rewards"].tolist()
    adv = []
    for grp in rewards:
        mean = sum(grp) / len(grp)
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (len(grp) - 1))
        adv += [(x - mean) / (std + 1e-6) for x in grp]
    lp, old, ref = r["logp"].tolist(), r["old"].tolist(), r["ref"].tolist()
    valid = [[m == 1 and s == 0 for m, s in zip(mr, sr, strict=True)]
             for mr, sr in zip(r["mask"].tolist(), r["stale"].tolist(), strict=True)]
    n = sum(v for row in valid for v in row)
    total, kl_sum, clipped = 0.0, 0.0, 0
    grad = [[0.0] * len(row) for row in lp]
    for i, row in enumerate(lp):
        for j, x in enumerate(row):
            if not valid[i][j]:
                continue
            ratio = math.exp(x - old[i][j])
            a = adv[i]
            lo_hi = min(max(ratio, 1 - EPS), 1 + EPS_HIGH)
            un, cl = ratio * a, lo_hi * a
            d = ref[i][j] - x
            kl = math.exp(d) - d - 1
            total += -min(un, cl) + BETA * kl
            kl_sum += kl
            took_clip = cl < un
            clipped += took_clip
            dsurr = 0.0 if took_clip else ratio * a  # the clipped branch is constant in logp
            grad[i][j] = (-dsurr + BETA * (1 - math.exp(d))) / n
    return total / n, grad, kl_sum / n, clipped / n


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_loss_and_gradients_equal_the_float64_reference(dtype: torch.dtype) -> None:
    r = _rollouts()
    loss_ref, grad_ref, kl_ref, clip_ref = _reference(r)
    assert 0 < clip_ref < 1  # the fixture exercises both branches
    logp = r["logp"].to(dtype).requires_grad_(True)
    adv = group_advantages(r["rewards"].to(dtype)).reshape(-1)
    out = grpo_loss(logp, r["old"].to(dtype), r["ref"].to(dtype), adv, r["mask"].to(dtype), stale=r["stale"],
                    clip_eps=EPS, clip_eps_high=EPS_HIGH, kl_coef=BETA)
    out.loss.backward()
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    assert out.tokens == 19  # 20 response tokens, one stale
    assert float(out.loss.detach()) == pytest.approx(loss_ref, abs=tol)
    assert float(out.kl) == pytest.approx(kl_ref, abs=tol) and float(out.clip_fraction) == pytest.approx(clip_ref)
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad.double(), torch.tensor(grad_ref, dtype=torch.float64), atol=tol, rtol=0)
    assert float(logp.grad[4, 3]) == 0.0 and float(logp.grad[1, 4]) == 0.0  # stale and padding carry no gradient
    m = step_metrics(r["rewards"], r["mask"], out)
    assert m["response_length"] == pytest.approx(20 / 6) and m["reward_mean"] == pytest.approx(8 / 6)
    assert m["reward_std"] == pytest.approx(math.sqrt(sum((x - 8 / 6) ** 2 for x in [2.5, .5, 0, 1, 2.5, 1.5]) / 6))
    assert m["kl"] == pytest.approx(kl_ref, abs=tol) and m["clip_fraction"] == pytest.approx(clip_ref)


def test_gradients_reach_the_policy_through_token_logprobs() -> None:
    """Through log_softmax to a linear policy's weights: autograd equals central differences of the loss."""
    r = _rollouts()
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(6, 5, 4, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 7, (6, 5), generator=g)
    w = torch.randn(4, 7, generator=g, dtype=torch.float64, requires_grad=True)
    adv = group_advantages(r["rewards"]).reshape(-1)

    def loss_of(weights: torch.Tensor) -> torch.Tensor:
        lp = token_logprobs(feats @ weights, tokens)
        return grpo_loss(lp, r["old"], r["ref"], adv, r["mask"], stale=r["stale"], clip_eps=EPS, kl_coef=BETA).loss

    loss_of(w).backward()
    assert w.grad is not None
    num = torch.zeros_like(w)
    h = 1e-6
    with torch.no_grad():
        for idx in range(w.numel()):
            e = torch.zeros(w.numel(), dtype=torch.float64)
            e[idx] = h
            e = e.reshape(w.shape)
            num.view(-1)[idx] = (loss_of(w + e) - loss_of(w - e)) / (2 * h)
    torch.testing.assert_close(w.grad, num, atol=1e-7, rtol=1e-6)


def test_advantages_kl_and_bad_input() -> None:
    adv = group_advantages(torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 2.0]], dtype=torch.float64))
    assert adv[0].tolist() == [0.0, 0.0, 0.0]  # equal rewards teach nothing
    assert adv[1].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-5)
    assert float(k3_kl(torch.tensor(-1.0), torch.tensor(-1.0))) == 0.0 and float(k3_kl(torch.tensor(-2.0),
                                                                                         torch.tensor(-1.0))) > 0
    with pytest.raises(ValueError, match="G >= 2"):
        group_advantages(torch.ones(4, 1))
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="no valid response tokens"):
        grpo_loss(z, z, None, torch.zeros(2), z)
    with pytest.raises(ValueError, match="ref_logp: required when kl_coef > 0"):
        grpo_loss(z, z, None, torch.zeros(2), torch.ones(2, 3), kl_coef=0.1)
    with pytest.raises(ValueError, match=r"advantages must have shape \[2\]"):
        grpo_loss(z, z, None, torch.zeros(3), torch.ones(2, 3))
