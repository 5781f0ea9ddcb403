"""GRPO's objective as pure tensor functions (Shao et al. 2024, DeepSeekMath; DeepSeek-V4's RL stage).

A batch holds G sampled responses per prompt. Each response's reward is normalised within its group
(:func:`group_advantages`), every response token carries its sequence's advantage, and the loss is the
clipped importance-ratio objective against the behaviour (old-policy) log-probs the rollout recorded,
plus a KL penalty to a frozen reference policy (the k3 estimator, :func:`k3_kl`), aggregated over
tokens (every valid token of the batch weighs the same, so long responses are not down-weighted).
Tokens generated under a stale policy (marked by the rollout log when a resumed rollout continued them
with newer weights) and padding are masked out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class GRPOLoss:
    """The loss and the statistics a step logs (detached)."""

    loss: torch.Tensor
    kl: torch.Tensor
    """Mean k3 KL to the reference over valid tokens."""
    clip_fraction: torch.Tensor
    """Fraction of valid tokens whose clipped term was the smaller one (no gradient through them)."""
    tokens: int
    """Valid tokens the loss averaged over."""


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean of its group) / (std of its group + eps) for rewards of shape [prompts, G] (G >= 2; the
    unbiased std). A group whose responses all scored the same gets advantage 0 everywhere."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must have shape [prompts, G] with G >= 2, got {tuple(rewards.shape)}")
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=True)
    return (rewards - mean) / (std + eps)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(ref - logp) - (ref - logp) - 1 (>= 0, unbiased
    under samples from the policy)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
              advantages: torch.Tensor, mask: torch.Tensor, *, stale: torch.Tensor | None = None,
              clip_eps: float = 0.2, clip_eps_high: float | None = None, kl_coef: float = 0.0,
              token_weights: torch.Tensor | None = None) -> GRPOLoss:
    """The GRPO loss of a batch of responses.

    ``logp`` [B, T]: the current policy's log-probs of the sampled tokens (with grad); ``old_logp`` [B, T]: the
    behaviour log-probs from the rollout; ``ref_logp`` [B, T]: the frozen reference's (None when kl_coef is 0);
    ``advantages`` [B] per response; ``mask`` [B, T]: response tokens (1) vs prompt and padding (0);
    ``stale`` [B, T]: tokens sampled under a stale policy (excluded). The ratio is clipped to
    [1 - clip_eps, 1 + clip_eps_high] (clip_eps_high defaults to clip_eps). ``token_weights`` [B, T] (detached)
    scale each token's policy term (truncated importance sampling, trex.trainer.rl.mismatch; None = 1).
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape or logp.dim() != 2:
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask {tuple(mask.shape)} "
                         "must share one [B, T] shape")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must have shape [{logp.shape[0]}], got {tuple(advantages.shape)}")
    if not 0 < clip_eps < 1 or (clip_eps_high is not None and clip_eps_high <= 0) or kl_coef < 0:
        raise ValueError(f"need 0 < clip_eps < 1, clip_eps_high > 0 and kl_coef >= 0 (got {clip_eps}, "
                         f"{clip_eps_high}, {kl_coef})")
    if kl_coef > 0 and ref_logp is None:
        raise ValueError("ref_logp: required when kl_coef > 0")
    valid = mask.to(torch.bool) & ~(stale.to(torch.bool) if stale is not None else torch.zeros_like(mask, dtype=torch.bool))
    n = int(valid.sum())
    if n == 0:
        raise ValueError("no valid response tokens (all masked or stale)")
    w = valid.to(logp.dtype)
    ratio = torch.exp(logp - old_logp.detach())
    adv = advantages.detach().to(logp.dtype)[:, None]
    high = clip_eps if clip_eps_high is None else clip_eps_high
    unclipped, clipped = ratio * adv, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    per_token = -surrogate if token_weights is None else -surrogate * token_weights.detach().to(logp.dtype)
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp.detach())
        per_token = per_token + kl_coef * kl
    loss = (per_token * w).sum() / n
    with torch.no_grad():
        clip_frac = ((clipped < unclipped) & valid).sum() / n
        kl_mean = (kl * w).sum() / n
    return GRPOLoss(loss, kl_mean, clip_frac, n)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] per position: logits [B, T, V] that predict tokens [B, T]."""
    return torch.log_softmax(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits,
                             dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


LOGPROB_CHUNK_BYTES = 4 << 20
"""Logits per row chunk of the fused head + log-softmax on CPU (small enough to stay in cache)."""
LOGPROB_DEVICE_CHUNK_BYTES = 256 << 20
"""The same on accelerators, where larger chunks keep the GEMMs big and the chunk count low."""


class _LinearTokenLogprobs(torch.autograd.Function):
    """log softmax(h @ W^T / temperature)[token] per row without materialising [N, V]: the forward makes each row
    chunk's logits, keeps only the picked logit and the log-sum-exp, and saves the inputs and the [N] log-sum-exps;
    the backward makes each chunk's logits again and turns them into d/dz = g * (onehot - softmax) / temperature,
    multiplied into both input gradients at once ([N, D] and [V, D], never [N, V])."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor, temperature: float,
                compute_dtype: torch.dtype, rows: int) -> torch.Tensor:
        acc = torch.float64 if h.dtype == torch.float64 else torch.float32
        n = h.shape[0]
        out = torch.empty(n, dtype=acc, device=h.device)
        lse = torch.empty(n, dtype=acc, device=h.device)
        with torch.autocast(h.device.type, enabled=False):
            wc = weight.to(compute_dtype)
            for s in range(0, n, rows):
                e = min(n, s + rows)
                z = (h[s:e].to(compute_dtype) @ wc.T).to(acc).div_(temperature)
                picked = z.gather(1, tokens[s:e, None]).squeeze(1)
                top = z.amax(dim=-1)
                lse[s:e] = top + z.sub_(top[:, None]).exp_().sum(dim=-1).log_()
                out[s:e] = picked - lse[s:e]
        ctx.save_for_backward(h, weight, tokens, lse)
        ctx.temperature, ctx.compute_dtype, ctx.rows = temperature, compute_dtype, rows
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, weight, tokens, lse = ctx.saved_tensors
        need_h, need_w = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        cd, temperature, rows = ctx.compute_dtype, ctx.temperature, ctx.rows
        acc = lse.dtype
        n = h.shape[0]
        grad_h = torch.empty(h.shape, dtype=acc, device=h.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        g_all = grad_out.to(acc)
        with torch.autocast(h.device.type, enabled=False):
            wc = weight.to(cd)
            for s in range(0, n, rows):
                e = min(n, s + rows)
                hc = h[s:e].to(cd)
                z = (hc @ wc.T).to(acc).div_(temperature)
                g = g_all[s:e, None]
                # d logp / d z = onehot - softmax; z = h W^T / temperature
                d = z.sub_(lse[s:e, None]).exp_().mul_(-g)
                d.scatter_add_(1, tokens[s:e, None], g)
                dc = d.div_(temperature).to(cd)
                if grad_h is not None:
                    grad_h[s:e] = dc @ wc
                if grad_w is not None:
                    grad_w.add_(dc.T @ hc)
        return (grad_h.to(h.dtype) if grad_h is not None else None,
                grad_w.to(weight.dtype) if grad_w is not None else None, None, None, None, None)


def linear_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor,
                          temperature: float = 1.0, chunk_rows: int | None = None) -> torch.Tensor:
    """token_logprobs(hidden @ weight.T / temperature, tokens) fused with the head: hidden [..., D], weight [V, D],
    tokens [...] -> log-probs [...] (fp32, float64 for a float64 model), with gradients to hidden and weight and no
    [N, V] tensor kept for the backward. GEMMs run in the autocast dtype when autocast is on, softmax in >= fp32;
    ``chunk_rows``: rows of logits made at once (default from a byte budget)."""
    if hidden.shape[:-1] != tokens.shape or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)} and tokens "
                         f"{tuple(tokens.shape)} do not fit [..., D], [V, D] and [...]")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    kind = hidden.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype
    vocab = weight.shape[0]
    if chunk_rows is None:
        budget = LOGPROB_CHUNK_BYTES if kind == "cpu" else LOGPROB_DEVICE_CHUNK_BYTES
        chunk_rows = max(1, budget // (8 * vocab))
    flat = hidden.reshape(-1, hidden.shape[-1])
    out: torch.Tensor = _LinearTokenLogprobs.apply(  # type: ignore[no-untyped-call]
        flat, weight, tokens.reshape(-1), float(temperature), dtype, max(1, chunk_rows))
    return out.reshape(tokens.shape)


def step_metrics(rewards: torch.Tensor, mask: torch.Tensor, out: GRPOLoss) -> dict[str, float]:
    """What a GRPO step logs: reward mean and std over the batch's responses, mean KL to the reference,
    clip fraction and mean response length (tokens)."""
    r = rewards.detach().double().reshape(-1)
    return {"reward_mean": float(r.mean()), "reward_std": float(r.std(unbiased=False)), "kl": float(out.kl),
            "clip_fraction": float(out.clip_fraction), "response_length": float(mask.detach().double().sum(1).mean())}

