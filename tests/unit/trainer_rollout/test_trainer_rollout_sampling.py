"""The sampler: top-k / top-p against a brute-force reference, draws that depend only on (seed, sample,
position), empirical frequencies that match the filtered distribution, and precise errors on bad params."""

from __future__ import annotations

import pytest
import torch
from trex.trainer.rollout.sampling import SamplingParams, filter_logits, sample, uniform


def _reference_keep(logits: list[float], top_k: int, top_p: float) -> set[int]:
    """Tokens kept: rank < top_k, and the more likely tokens' mass < top_p (ties: lower id first)."""
    order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))
    z = sum(torch.tensor(logits, dtype=torch.float64).exp().tolist())
    keep, mass = set(), 0.0
    for rank, i in enumerate(order):
        if (top_k == 0 or rank < top_k) and (rank == 0 or mass < top_p):
            keep.add(i)
        mass += float(torch.tensor(logits[i], dtype=torch.float64).exp()) / z
    return keep


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (3, 1.0), (0, 0.5), (4, 0.7), (1, 0.01), (0, 0.001)])
def test_filter_matches_reference(top_k: int, top_p: float) -> None:
    logits = torch.randn(6, 11, generator=torch.Generator().manual_seed(top_k), dtype=torch.float64)
    out = filter_logits(logits, top_k, top_p)
    for row, filtered in zip(logits.tolist(), out, strict=True):
        assert set(torch.isfinite(filtered).nonzero()[:, 0].tolist()) == _reference_keep(row, top_k, top_p)


def test_draws_depend_only_on_seed_sample_position() -> None:
    a = [uniform(7, s, p) for s in range(20) for p in range(50)]
    assert a == [uniform(7, s, p) for s in range(20) for p in range(50)]
    assert all(0 <= x < 1 for x in a) and len(set(a)) == len(a)
    assert uniform(8, 0, 0) != uniform(7, 0, 0) and uniform(7, 1, 0) != uniform(7, 0, 1)
    mean = sum(a) / len(a)
    assert abs(mean - 0.5) < 0.03


def test_sampled_frequencies_follow_the_filtered_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]], dtype=torch.float64)
    params = SamplingParams(temperature=0.8, top_k=4)
    n = 4000
    tokens, logps = sample(logits.expand(n, -1), params, [uniform(0, i, 3) for i in range(n)])
    probs = torch.softmax(filter_logits(logits / 0.8, 4, 1.0), -1)[0]
    freq = torch.bincount(tokens, minlength=6).double() / n
    assert torch.all((freq - probs).abs() < 4 * (probs * (1 - probs) / n).sqrt() + 1e-9)
    torch.testing.assert_close(logps, torch.log_softmax(logits / 0.8, -1)[0, tokens])


def test_greedy_takes_the_first_maximum() -> None:
    tokens, logps = sample(torch.tensor([[0.0, 3.0, 3.0], [1.0, 0.0, 1.0]]), SamplingParams(temperature=0), [0.9, 0.1])
    assert tokens.tolist() == [1, 0]
    torch.testing.assert_close(logps, torch.log(torch.tensor([1 / (2 + torch.e**-3), 1 / (2 + torch.e**-1)], dtype=torch.float64)))


@pytest.mark.parametrize(("field", "value"), [("temperature", -1.0), ("top_p", 0.0), ("top_p", 1.5),
                                              ("top_k", -1), ("max_new_tokens", 0), ("stop_tokens", (-2,))])
def test_bad_params_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]
