"""The train/inference mismatch of an external rollout engine: how far the engine's behaviour log-probs are from the
trainer's recomputation on the same tokens (same weights), and its correction by truncated importance sampling.

An engine such as vLLM computes the same policy with other kernels (on CPU: its fused-MoE experts and its MLA
attention), so pi_rollout != pi_trainer token by token. Truncated importance sampling (Yao et al. 2025, as verl and
slime apply it) takes the PPO ratio against the trainer's own log-probs of the behaviour policy and weights each
token's loss by min(pi_trainer / pi_rollout, cap), the correction for having sampled from pi_rollout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def tis_correction(logp: torch.Tensor, rollout_logp: torch.Tensor, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(old log-probs for the PPO ratio, per-token loss weights) under truncated importance sampling: the trainer's
    own log-probs (detached; the weights have not moved since the rollout) and min(exp(logp - rollout_logp), cap)."""
    if cap <= 0:
        raise ValueError(f"rollout.tisCap must be > 0, got {cap}")
    old = logp.detach()
    return old, torch.exp(old - rollout_logp.detach().to(old.dtype)).clamp(max=cap)


@dataclass
class Mismatch:
    """Running sums of |trainer - rollout| log-prob differences over the valid tokens of a step."""

    n: int = 0
    abs_sum: float = 0.0
    max_abs: float = 0.0
    sums: list[float] = field(default_factory=lambda: [0.0] * 5)
    """sum x, sum y, sum x^2, sum y^2, sum xy (x trainer, y rollout), for the correlation."""

    def add(self, logp: torch.Tensor, rollout_logp: torch.Tensor, valid: torch.Tensor) -> None:
        """Count the tokens where ``valid`` holds."""
        x = logp.detach().double()[valid]
        y = rollout_logp.detach().double().to(x.device)[valid]
        if x.numel() == 0:
            return
        d = (x - y).abs()
        self.n += int(x.numel())
        self.abs_sum += float(d.sum())
        self.max_abs = max(self.max_abs, float(d.max()))
        for i, v in enumerate((x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum())):
            self.sums[i] += float(v)

    def metrics(self, alert: float) -> dict[str, float]:
        """rollout_logprob_mismatch_{mean,max,corr} and _alert (1 when the mean exceeds ``alert``)."""
        if self.n == 0:
            return {}
        n = float(self.n)
        sx, sy, sxx, syy, sxy = self.sums
        cov = sxy / n - sx * sy / n**2
        vx, vy = sxx / n - (sx / n) ** 2, syy / n - (sy / n) ** 2
        corr = cov / (vx * vy) ** 0.5 if vx > 0 and vy > 0 else 1.0
        mean = self.abs_sum / n
        return {"rollout_logprob_mismatch_mean": mean, "rollout_logprob_mismatch_max": self.max_abs,
                "rollout_logprob_mismatch_corr": corr, "rollout_logprob_mismatch_alert": float(mean > alert)}
