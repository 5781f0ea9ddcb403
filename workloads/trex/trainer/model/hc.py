"""Manifold-constrained hyper-connections (mHC): `n` residual streams mixed by a doubly-stochastic matrix.

Per sublayer, from the RMS-normalised flattened streams x~ (1 x nD):
  H_pre  = sigmoid(a_pre  * x~ phi_pre  + b_pre)        (1 x n)  reads the sublayer input
  H_post = 2 sigmoid(a_post * x~ phi_post + b_post)     (1 x n)  writes the sublayer output
  H_res  = Sinkhorn(a_res * mat(x~ phi_res) + b_res)    (n x n)  mixes the streams, doubly stochastic
  x' = H_res x + H_post^T F(H_pre x)
phi are the dynamic projections (GEMM weights), a and b the static gates/biases.
"""

from __future__ import annotations

import torch
from torch import nn

from trex.trainer.model.layers import upcast


def sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """Sinkhorn-Knopp on exp(logits) [..., n, n]: alternate row and column normalisation."""
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iters):
        m = m / m.sum(-1, keepdim=True)
        m = m / m.sum(-2, keepdim=True)
    return m


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = upcast(x)
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


class HyperConnection(nn.Module):
    """One sublayer's mHC mapping over `n` streams of width `dim`."""

    def __init__(self, n: int, dim: int, sinkhorn_iters: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.n = n
        self.iters = sinkhorn_iters
        self.eps = eps
        self.phi = nn.Linear(n * dim, 2 * n + n * n, bias=False)
        self.alpha = nn.Parameter(torch.empty(3))
        self.b_pre = nn.Parameter(torch.empty(n))
        self.b_post = nn.Parameter(torch.empty(n))
        self.b_res = nn.Parameter(torch.empty(n, n))

    @torch.no_grad()
    def reset_static(self) -> None:
        """Start near a plain residual: H_pre = 1/n, H_post = 1, H_res diagonal-heavy (0.71 on the
        diagonal for n = 4; a heavier diagonal slows Sinkhorn convergence)."""
        self.alpha.fill_(0.01)
        self.b_pre.fill_(-float(torch.log(torch.tensor(float(max(self.n - 1, 1))))))
        self.b_post.zero_()
        self.b_res.copy_(torch.eye(self.n, device=self.b_res.device) * 2.0)

    def mappings(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, n, D] -> (H_pre [B, T, n], H_post [B, T, n], H_res [B, T, n, n]) in fp32."""
        b, t, n, d = x.shape
        proj = upcast(self.phi(_rms(x.reshape(b, t, n * d), self.eps).to(x.dtype)))
        p_pre, p_post, p_res = proj.split([n, n, n * n], dim=-1)
        a = upcast(self.alpha)
        h_pre = torch.sigmoid(a[0] * p_pre + upcast(self.b_pre))
        h_post = 2 * torch.sigmoid(a[1] * p_post + upcast(self.b_post))
        h_res = sinkhorn(a[2] * p_res.view(b, t, n, n) + upcast(self.b_res), self.iters)
        return h_pre, h_post, h_res

    def read(self, x: torch.Tensor, h_pre: torch.Tensor) -> torch.Tensor:
        """Sublayer input sum_i H_pre[i] x_i: [B, T, D]."""
        return torch.einsum("btn,btnd->btd", h_pre.to(x.dtype), x)

    def write(self, x: torch.Tensor, y: torch.Tensor, h_post: torch.Tensor, h_res: torch.Tensor) -> torch.Tensor:
        """New streams H_res x + H_post^T y: [B, T, n, D]."""
        mixed = torch.einsum("btij,btjd->btid", h_res.to(x.dtype), x)
        return mixed + h_post.to(x.dtype)[..., None] * y[:, :, None, :]


class HyperHead(nn.Module):
    """Collapse the n streams into one hidden state: sum_i sigmoid(a x~ phi + b)_i x_i."""

    def __init__(self, n: int, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.phi = nn.Linear(n * dim, n, bias=False)
        self.alpha = nn.Parameter(torch.empty(1))
        self.bias = nn.Parameter(torch.empty(n))
        self.n = n

    @torch.no_grad()
    def reset_static(self) -> None:
        """Start as the mean of the streams."""
        self.alpha.fill_(0.01)
        self.bias.fill_(-float(torch.log(torch.tensor(float(max(self.n - 1, 1))))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, n, d = x.shape
        proj = upcast(self.phi(_rms(x.reshape(b, t, n * d), self.eps).to(x.dtype)))
        w = torch.sigmoid(upcast(self.alpha) * proj + upcast(self.bias))
        return torch.einsum("btn,btnd->btd", w.to(x.dtype), x)
