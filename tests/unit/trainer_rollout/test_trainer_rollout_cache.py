"""KV-cache decoding equals the full forward: for every attention kind (mla's latent cache, V4's sliding
ring, hca / csa compressed entries and the csa indexer), with mHC, dense, hash-routed and MTP layers, the
greedy tokens are the argmax of a full forward over prompt + response at every position, and every
behaviour log-prob is the full forward's (float64)."""

from __future__ import annotations

import pytest
import torch
from rollout_models import KINDS, tiny_model
from trex.trainer.model import DeepSeekModel
from trex.trainer.rollout import DecodeCache, Rollout, SamplingParams, generate

# different lengths, one repeated (shared prefill), long enough to wrap the sliding ring and fill
# several compression windows (the csa indexer then keeps 2 of up to 15 entries)
PROMPTS = [[3, 4, 5, 6, 7, 8, 9, 10, 11], [20, 21], [3, 4, 5, 6, 7, 8, 9, 10, 11], [30, 31, 32, 33, 34]]


def _full_logits(model: DeepSeekModel, r: Rollout) -> torch.Tensor:
    """Full-forward logits at the positions that predicted each response token: [n, V]."""
    with torch.no_grad():
        out = model(torch.tensor([r.prompt + r.tokens]))
    assert out.logits is not None
    return out.logits[0, len(r.prompt) - 1: -1]


@pytest.mark.parametrize("kind", list(KINDS))
def test_greedy_with_cache_is_full_forward_argmax(kind: str) -> None:
    model = tiny_model(kind)
    rollouts = generate(model, PROMPTS, SamplingParams(temperature=0, max_new_tokens=36), seed=0)
    for r in rollouts:
        assert len(r.tokens) == 36 and r.finish_reason == "length"
        logits = _full_logits(model, r)
        assert logits.argmax(-1).tolist() == r.tokens
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(r.tokens)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(r.logprobs, dtype=torch.float64), ref, rtol=0, atol=1e-10)
    assert rollouts[0].tokens == rollouts[2].tokens  # one prompt, prefilled once, decoded twice


@pytest.mark.parametrize("kind", ["mla", "csa-mhc-hash"])
def test_sampled_logprobs_are_the_tempered_policy(kind: str) -> None:
    model = tiny_model(kind)
    params = SamplingParams(temperature=0.7, top_k=10, top_p=0.9, max_new_tokens=20)
    for r in generate(model, PROMPTS, params, seed=5):
        ref = torch.log_softmax(_full_logits(model, r) / 0.7, -1)
        torch.testing.assert_close(torch.tensor(r.logprobs, dtype=torch.float64),
                                   ref.gather(1, torch.tensor(r.tokens)[:, None])[:, 0], rtol=0, atol=1e-10)
        # every token is inside the top-k of its step
        assert all(ref[i].topk(10).indices.tolist().count(t) for i, t in enumerate(r.tokens))


def test_cache_step_logits_equal_full_forward_without_the_engine() -> None:
    model = tiny_model("csa-hca")
    ids = torch.randint(0, 48, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids).logits
        cache = DecodeCache.empty(2, 30)
        pre = model(ids[:, :7], cache=cache).logits
        steps = [model(ids[:, i: i + 1], cache=cache).logits for i in range(7, 30)]
    assert full is not None and pre is not None
    torch.testing.assert_close(pre, full[:, :7], rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.cat([s for s in steps if s is not None], 1), full[:, 7:], rtol=0, atol=1e-10)
    assert cache.lengths.tolist() == [30, 30]


def test_cache_rejects_multi_token_steps_and_overflow() -> None:
    model = tiny_model("mla")
    cache = DecodeCache.empty(1, 6)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), cache=cache)
        with pytest.raises(ValueError, match="one token per row"):
            model(torch.tensor([[1, 2]]), cache=cache)
        with pytest.raises(ValueError, match="holds 6 tokens"):
            model(torch.tensor([[1, 2, 3, 4, 5, 6, 7]]), cache=DecodeCache.empty(1, 6))


def test_training_forward_unchanged_by_the_cache_argument() -> None:
    model = tiny_model("csa-mhc-hash")
    ids = torch.randint(0, 48, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = model(ids), model(ids, cache=None)
    assert a.logits is not None and b.logits is not None
    assert torch.equal(a.logits, b.logits) and len(a.mtp_logits) == 1


def test_cached_csa_selection_breaks_score_ties_as_the_full_forward() -> None:
    """One index head: many compressed entries tie at score 0 at the top-k boundary; decoding step by step
    must pick the same entries (the later window) as the full forward."""
    from trex.trainer.model.v4attention import Indexer

    model = tiny_model("csa-ties")
    ids = torch.randint(0, 48, (2, 31), generator=torch.Generator().manual_seed(2))
    seen: list[torch.Tensor] = []
    orig = Indexer.score_keys

    def score_keys(self: Indexer, *args: object) -> torch.Tensor:
        out = orig(self, *args)  # type: ignore[arg-type]
        seen.append(out.detach())
        return out

    Indexer.score_keys = score_keys  # type: ignore[method-assign]
    try:
        with torch.no_grad():
            full = model(ids).logits
    finally:
        Indexer.score_keys = orig  # type: ignore[method-assign]
    ties = 0
    for scores in seen:
        for row in scores:
            for t, q in enumerate(row):
                vis = sorted(q[: (t + 1) // 2].tolist(), reverse=True)
                ties += len(vis) > 3 and vis[2] == vis[3]
    assert ties > 5
    with torch.no_grad():
        cache = DecodeCache.empty(2, 31)
        pre = model(ids[:, :5], cache=cache).logits
        steps = [model(ids[:, i: i + 1], cache=cache).logits for i in range(5, 31)]
    assert full is not None and pre is not None
    torch.testing.assert_close(torch.cat([pre, *[s for s in steps if s is not None]], 1), full, rtol=0, atol=1e-10)
