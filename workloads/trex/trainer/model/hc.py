"""Manifold-constrained hyper-connections (mHC) as DeepSeek-V4 releases them: `n` residual streams.

Per sublayer, from the RMS-normalised flattened streams x~ (1 x nD) and one projection `fn`:
  [p_pre, p_post, p_res] = x~ fn^T + base-free logits, split n / n / n x n
  H_pre  = sigmoid(s_pre  p_pre  + b_pre) + eps           reads the sublayer input sum_i H_pre[i] x_i
  H_post = 2 sigmoid(s_post p_post + b_post)              writes the sublayer output to every stream
  H_res  = Sinkhorn(softmax_rows(s_res p_res + b_res) + eps)   doubly stochastic
  x'_i = H_post[i] F(.) + sum_j H_res[j, i] x_j
`fn` is the GEMM weight; `base` (b_pre, b_post, b_res) and `scale` (s_pre, s_post, s_res) are static.
Everything here runs in (at least) fp32, as released.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trex.trainer.model.layers import ParamHook, same, unit_rms, upcast


def sinkhorn(logits: torch.Tensor, iters: int, eps: float = 1e-6) -> torch.Tensor:
    """V4's projection of [..., n, n] logits onto doubly-stochastic matrices: row softmax + eps, then a
    column normalisation and (iters - 1) row/column rounds, each denominator floored by eps."""
    m = torch.softmax(logits, dim=-1) + eps
    m = m / (m.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(-1, keepdim=True) + eps)
        m = m / (m.sum(-2, keepdim=True) + eps)
    return m


def _log_n_minus_1(n: int) -> float:
    return float(torch.log(torch.tensor(float(max(n - 1, 1)))))


class HyperConnection(nn.Module):
    """One sublayer's mHC mapping over `n` streams of width `dim` (HF names: fn, base, scale)."""

    def __init__(self, n: int, dim: int, sinkhorn_iters: int, eps: float = 1e-6, hc_eps: float = 1e-6) -> None:
        super().__init__()
        self.n = n
        self.iters = sinkhorn_iters
        self.eps = eps
        self.hc_eps = hc_eps
        self.fn = nn.Parameter(torch.empty((2 + n) * n, n * dim))
        self.base = nn.Parameter(torch.empty((2 + n) * n))
        self.scale = nn.Parameter(torch.empty(3))
        self.param_hook: ParamHook = same
        """Applied to fn, base and scale at each use (see trex.trainer.model.layers.ParamHook)."""

    def static_base(self) -> torch.Tensor:
        """The initial bias (host): near a plain residual, H_pre ~ 1/n, H_post ~ 1, H_res diagonal-heavy."""
        n = self.n
        return torch.cat([torch.full((n,), -_log_n_minus_1(n)), torch.zeros(n), (torch.eye(n) * 2.0).flatten()])

    def mappings(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, n, D] -> (H_pre [B, T, n], H_post [B, T, n], H_res [B, T, n, n]) in >= fp32."""
        b, t, n, _ = x.shape
        fn, base, scale = (self.param_hook(p) for p in (self.fn, self.base, self.scale))
        flat = unit_rms(upcast(x.reshape(b, t, -1)), self.eps)
        proj = F.linear(flat, fn.to(flat.dtype))
        p_pre, p_post, p_res = torch.split(proj, [n, n, n * n], dim=-1)
        b_pre, b_post, b_res = torch.split(base.to(flat.dtype), [n, n, n * n])
        s = scale.to(flat.dtype)
        h_pre = torch.sigmoid(p_pre * s[0] + b_pre) + self.hc_eps
        h_post = 2 * torch.sigmoid(p_post * s[1] + b_post)
        h_res = sinkhorn(p_res.view(b, t, n, n) * s[2] + b_res.view(n, n), self.iters, self.hc_eps)
        return h_pre, h_post, h_res

    def read(self, x: torch.Tensor, h_pre: torch.Tensor) -> torch.Tensor:
        """Sublayer input sum_i H_pre[i] x_i: [B, T, D] (summed in >= fp32)."""
        return (h_pre[..., None] * x).sum(dim=2).to(x.dtype)

    def write(self, x: torch.Tensor, y: torch.Tensor, h_post: torch.Tensor, h_res: torch.Tensor) -> torch.Tensor:
        """New streams x'_i = H_post[i] y + sum_j H_res[j, i] x_j: [B, T, n, D]."""
        mixed = torch.matmul(h_res.to(x.dtype).transpose(-1, -2), x)
        return h_post.to(x.dtype)[..., None] * y[:, :, None, :] + mixed


class HyperHead(nn.Module):
    """Collapse the n streams into one hidden state: sum_i (sigmoid(s x~ fn + b)_i + eps) x_i."""

    def __init__(self, n: int, dim: int, eps: float = 1e-6, hc_eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.hc_eps = hc_eps
        self.fn = nn.Parameter(torch.empty(n, n * dim))
        self.base = nn.Parameter(torch.empty(n))
        self.scale = nn.Parameter(torch.empty(1))
        self.n = n

    def static_base(self) -> torch.Tensor:
        """The initial bias (host): start as the mean of the streams."""
        return torch.full((self.n,), -_log_n_minus_1(self.n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _, _ = x.shape
        flat = unit_rms(upcast(x.reshape(b, t, -1)), self.eps)
        w = torch.sigmoid(F.linear(flat, self.fn.to(flat.dtype)) * self.scale.to(flat.dtype)
                          + self.base.to(flat.dtype)) + self.hc_eps
        return (w[..., None] * x).sum(dim=2).to(x.dtype)
