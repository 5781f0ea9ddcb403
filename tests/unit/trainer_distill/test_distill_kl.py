"""The chunked reverse KL against a float64 reference that materialises both models' full logits: value and
both student gradients, several vocabularies (up to 32k), chunk sizes and masks; the sampled-token estimator's
value and its gradient's mean; the gradient variance of both estimators; peak memory vs chunk size."""

from __future__ import annotations

import pytest
import torch
from trex.trainer.distill.kl import reverse_kl, token_coefficients
from trex.trainer.distill.peak import peak_cpu_bytes


def _inputs(n: int, vocab: int, d_s: int = 16, d_t: int = 24, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(n, d_s, generator=g, dtype=torch.float64)
    ws = torch.randn(vocab, d_s, generator=g, dtype=torch.float64) * 0.5
    ht = torch.randn(n, d_t, generator=g, dtype=torch.float64)
    wt = torch.randn(vocab, d_t, generator=g, dtype=torch.float64) * 0.5
    return hs, ws, ht, wt


def reference(hs: torch.Tensor, ws: torch.Tensor, ht: torch.Tensor, wt: torch.Tensor,
              coef: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Full logits in float64: sum_i coef_i KL(p_s || p_t), and its gradients w.r.t. hs and ws."""
    hs, ws = hs.detach().double().requires_grad_(), ws.detach().double().requires_grad_()
    lps = torch.log_softmax(hs @ ws.T, dim=-1)
    lpt = torch.log_softmax(ht.double() @ wt.double().T, dim=-1)
    loss = (coef.double() * (lps.exp() * (lps - lpt)).sum(-1)).sum()
    gh, gw = torch.autograd.grad(loss, [hs, ws])
    return loss.detach(), gh, gw


@pytest.mark.parametrize(("vocab", "chunk"), [(97, 1), (97, 7), (1000, 16), (32_768, 5), (32_768, 64)])
def test_chunked_kl_matches_float64_reference(vocab: int, chunk: int) -> None:
    n = 23
    hs, ws, ht, wt = _inputs(n, vocab)
    mask = torch.ones(n, dtype=torch.bool)
    mask[:6] = False  # the prompt
    mask[15] = False
    coef = token_coefficients(mask, 0.7)
    want, want_h, want_w = reference(hs, ws, ht, wt, coef)
    h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
    out = reverse_kl(h, w, ht, wt, coef, chunk_size=chunk)
    out.loss.backward()
    torch.testing.assert_close(out.loss, want, rtol=1e-10, atol=1e-12)
    assert h.grad is not None and w.grad is not None
    torch.testing.assert_close(h.grad, want_h, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(w.grad, want_w, rtol=1e-9, atol=1e-12)
    assert torch.all(h.grad[~mask] == 0)
    lps = torch.log_softmax(hs @ ws.T, -1)
    torch.testing.assert_close(out.entropy, -(lps.exp() * lps).sum(-1))
    assert torch.all(out.kl >= -1e-12)


def test_fp32_inputs_stay_close_to_the_float64_reference() -> None:
    hs, ws, ht, wt = _inputs(40, 5000)
    coef = token_coefficients(torch.ones(40))
    want, want_h, want_w = reference(hs, ws, ht, wt, coef)
    h, w = hs.float().requires_grad_(), ws.float().requires_grad_()
    out = reverse_kl(h, w, ht.float(), wt.float(), coef, chunk_size=16)
    out.loss.backward()
    assert h.grad is not None and w.grad is not None and h.grad.dtype == torch.float32
    torch.testing.assert_close(out.loss.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h.grad.double(), want_h, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w.grad.double(), want_w, rtol=1e-4, atol=1e-7)


def test_sampled_token_value_and_unbiased_gradient_with_more_variance() -> None:
    """The sampled-token value is the sampled log-ratio; over many draws y ~ p_s its gradient averages to the
    full-vocab gradient, and per draw it scatters far more (the full-vocab gradient has none: it is exact)."""
    n, vocab = 6, 50
    hs, ws, ht, wt = _inputs(n, vocab, seed=3)
    coef = token_coefficients(torch.ones(n))
    _, full_h, full_w = reference(hs, ws, ht, wt, coef)
    probs = torch.softmax(hs @ ws.T, -1)
    gen = torch.Generator().manual_seed(0)
    draws = 1000
    grads = []
    for _ in range(draws):
        y = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
        out = reverse_kl(h, w, ht, wt, coef, estimator="sampled-token", tokens=y, chunk_size=4)
        out.loss.backward()
        assert h.grad is not None and w.grad is not None
        grads.append(torch.cat([h.grad.reshape(-1), w.grad.reshape(-1)]))
    ratio = torch.log_softmax(hs @ ws.T, -1) - torch.log_softmax(ht @ wt.T, -1)
    torch.testing.assert_close(out.kl, ratio.gather(1, y[:, None]).squeeze(1))
    g = torch.stack(grads)
    full = torch.cat([full_h.reshape(-1), full_w.reshape(-1)])
    mean, var = g.mean(0), g.var(0).sum()
    # The mean's error shrinks as sqrt(var / draws): within 5 standard errors of the exact gradient.
    assert float((mean - full).norm()) < 5 * float((var / draws).sqrt())
    # Per batch the sampled-token gradient's total variance is of the order of the gradient's own size.
    assert float(var) > 0.1 * float(full.norm() ** 2)


def test_bad_inputs_name_what_is_wrong() -> None:
    hs, ws, ht, wt = _inputs(4, 10)
    coef = token_coefficients(torch.ones(4))
    with pytest.raises(ValueError, match="estimator"):
        reverse_kl(hs, ws, ht, wt, coef, estimator="top-k")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tokens"):
        reverse_kl(hs, ws, ht, wt, coef, estimator="sampled-token")
    with pytest.raises(ValueError, match="vocabulary"):
        reverse_kl(hs, ws, ht, wt[:5], coef)
    with pytest.raises(ValueError, match="coef"):
        reverse_kl(hs, ws, ht, wt, coef[:3])
    with pytest.raises(ValueError, match="no valid tokens"):
        token_coefficients(torch.zeros(4))


def test_peak_memory_grows_with_the_chunk_not_with_tokens_times_vocab() -> None:
    """Forward + backward at T x V = 2048 x 8192 (64 MiB of fp32 logits per model): the loss's peak is a few
    chunks of logits, so it scales with the chunk size and stays far below one model's [T, V] logits."""
    n, vocab, d = 2048, 8192, 32
    g = torch.Generator().manual_seed(0)
    hs, ws = torch.randn(n, d, generator=g), torch.randn(vocab, d, generator=g) * 0.1
    ht, wt = torch.randn(n, d, generator=g), torch.randn(vocab, d, generator=g) * 0.1
    coef = token_coefficients(torch.ones(n))

    def run(chunk: int) -> None:
        h, w = hs.clone().requires_grad_(), ws.clone().requires_grad_()
        reverse_kl(h, w, ht, wt, coef, chunk_size=chunk).loss.backward()

    fixed = 3 * (n * d + vocab * d) * 4  # the clones of hs and ws, their gradients and one partial sum
    peaks = {chunk: peak_cpu_bytes(lambda c=chunk: run(c)) for chunk in (32, 128)}
    logits = n * vocab * 4
    for c, p in peaks.items():
        assert p < fixed + 8 * c * vocab * 4, (c, p)
    assert peaks[128] - peaks[32] > 2 * (128 - 32) * vocab * 4  # a few chunk-sized buffers, no more
    assert peaks[128] < logits / 2
