"""GRPO's fused per-token log-probs (head + log-softmax chunked over rows, no [T, V] tensor) against the full-logits
float64 reference: values, gradients, the GRPO loss through a model with MTP modules, and what the backward keeps."""

from __future__ import annotations

import pytest
import torch
from trex.trainer.config import ModelConfig
from trex.trainer.model import build_model
from trex.trainer.rl.grpo import grpo_loss, linear_token_logprobs
from trex.trainer.rl.step import sampled_logprobs


def _full(h: torch.Tensor, w: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """The unfused reference: whole logits, log_softmax, gather."""
    z = (h @ w.T) / temperature
    return torch.log_softmax(z, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_logprobs_and_gradients_equal_the_full_logits(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    b, t, d, v = 3, 7, 6, 50
    h = torch.randn(b, t, d, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(v, d, generator=g, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, v, (b, t), generator=g)
    coef = torch.randn(b, t, generator=g, dtype=torch.float64)
    got = linear_token_logprobs(h, w, tokens, 1.3, chunk_rows=chunk)
    want = _full(h, w, tokens, 1.3)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    gh, gw = torch.autograd.grad((got * coef).sum(), (h, w))
    rh, rw = torch.autograd.grad((want * coef).sum(), (h, w))
    torch.testing.assert_close(gh, rh, atol=1e-10, rtol=0)
    torch.testing.assert_close(gw, rw, atol=1e-10, rtol=0)


def test_no_saved_tensor_holds_t_times_v() -> None:
    """What autograd keeps for the backward is the inputs and [N] log-sum-exps; the unfused op keeps [N, V]."""
    b, t, d, v = 2, 16, 8, 96
    h = torch.randn(b, t, d, dtype=torch.float64, requires_grad=True)
    w = torch.randn(v, d, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, v, (b, t))

    def largest(fn: object) -> int:
        sizes: list[int] = []

        def pack(x: torch.Tensor) -> torch.Tensor:
            sizes.append(x.numel())
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            fn()  # type: ignore[operator]
        return max(sizes)

    assert largest(lambda: linear_token_logprobs(h, w, tokens, 0.7, chunk_rows=4)) < t * v
    assert largest(lambda: _full(h, w, tokens, 0.7)) >= b * t * v  # the check can fail


def test_grpo_loss_gradient_through_a_model_equals_the_full_logits_forward() -> None:
    """A float64 model with an MTP module: the fused, MTP-less forward gives the same log-probs and GRPO parameter
    gradients as the whole forward's logits; the MTP modules get no gradient and their expert-count rows are 0."""
    model = build_model(ModelConfig(preset="tiny", dtype="fp64"), device="cpu", dtype=torch.float64, seed=3)
    assert model.args.mtp_depth == 1
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.args.vocab_size, (3, 9), generator=g)
    targets = torch.roll(ids, -1, dims=1)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[:, :3] = False
    mask[2, 7:] = False
    old = -torch.rand(3, 9, generator=g, dtype=torch.float64) * 6
    ref = -torch.rand(3, 9, generator=g, dtype=torch.float64) * 6
    adv = torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64)
    params = dict(model.named_parameters())

    def grads(logp: torch.Tensor) -> dict[str, torch.Tensor | None]:
        model.zero_grad(set_to_none=True)
        loss = grpo_loss(logp, old, ref, adv, mask, clip_eps=0.2, kl_coef=0.05).loss
        loss.backward()
        return {k: None if p.grad is None else p.grad.clone() for k, p in params.items()}

    full = model(ids)
    assert full.logits is not None
    want_lp = _full(full.logits, torch.eye(full.logits.shape[-1], dtype=torch.float64), targets, 0.9)
    want = grads(want_lp)
    out = model(ids, logits=False, mtp=False)
    assert out.expert_counts.shape[0] == model.args.n_moe_layers
    assert int(out.expert_counts[-1].sum()) == 0 and int(out.expert_counts[0].sum()) > 0
    got_lp = linear_token_logprobs(out.hidden, out.head_weight, targets, 0.9)  # type: ignore[arg-type]
    torch.testing.assert_close(got_lp, want_lp, atol=1e-10, rtol=0)
    got = grads(sampled_logprobs(model, ids, targets, 0.9))
    for k, v in want.items():
        if k.startswith("mtp."):
            assert got[k] is None, k
            continue
        assert v is not None and got[k] is not None, k
        torch.testing.assert_close(got[k], v, atol=1e-10, rtol=0, msg=k)


def test_bad_input_names_the_problem() -> None:
    h, w = torch.zeros(2, 3, 4), torch.zeros(10, 4)
    with pytest.raises(ValueError, match="do not fit"):
        linear_token_logprobs(h, torch.zeros(10, 5), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="do not fit"):
        linear_token_logprobs(h, w, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        linear_token_logprobs(h, w, torch.zeros(2, 3, dtype=torch.long), 0.0)
