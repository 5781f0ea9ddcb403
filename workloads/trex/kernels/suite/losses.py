"""Full-vocabulary losses, per row: cross-entropy and KL divergence.

cross_entropy: loss_r = logsumexp(z_r) - z_r[target_r].
kl_div: KL(P || Q)_r = sum_v P_v (log P_v - log Q_v) with P = softmax(p_logits_r) (teacher) and
Q = softmax(q_logits_r) (student).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trex.kernels.suite._gen import gen, randn
from trex.kernels.suite.base import EXP_FLOPS, Buffer, Dims, KernelSpec, Tensors

if TYPE_CHECKING:
    import torch


def _rv(d: Dims) -> tuple[int, ...]:
    return (d["rows"], d["vocab"])


def _ce_inputs(d: Dims, dtype: str, seed: int) -> Tensors:
    import torch

    g = gen(seed)
    return {"logits": randn(_rv(d), dtype, g, 3.0), "target": torch.randint(0, d["vocab"], (d["rows"],), generator=g)}


def _ce_eager(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    import torch.nn.functional as F

    return {"loss": F.cross_entropy(t["logits"].float(), t["target"], reduction="none")}


def _ce_ref(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    import torch

    z = t["logits"]
    m = z.max(-1, keepdim=True).values
    lse = torch.log(torch.exp(z - m).sum(-1)) + m.squeeze(-1)
    return {"loss": lse - z.gather(-1, t["target"][:, None]).squeeze(-1)}


def _kl_inputs(d: Dims, dtype: str, seed: int) -> Tensors:
    g = gen(seed)
    p = randn(_rv(d), dtype, g, 2.0)
    return {"p_logits": p, "q_logits": (p.float() + randn(_rv(d), "fp32", g, 0.5)).to(p.dtype)}


def _kl_eager(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    import torch.nn.functional as F

    lp = F.log_softmax(t["p_logits"].float(), -1)
    lq = F.log_softmax(t["q_logits"].float(), -1)
    return {"kl": F.kl_div(lq, lp, log_target=True, reduction="none").sum(-1)}


def _kl_ref(t: Tensors, d: Dims, s: dict[str, float]) -> Tensors:
    import torch

    def logsm(z: torch.Tensor) -> torch.Tensor:
        m = z.max(-1, keepdim=True).values
        return z - m - torch.log(torch.exp(z - m).sum(-1, keepdim=True))

    lp, lq = logsm(t["p_logits"]), logsm(t["q_logits"])
    return {"kl": (torch.exp(lp) * (lp - lq)).sum(-1)}


_TAILS = ({"rows": 3, "vocab": 1001}, {"rows": 17, "vocab": 50257}, {"rows": 1, "vocab": 7})

CROSS_ENTROPY = KernelSpec(
    name="cross_entropy", kclass="loss", dim_names=("rows", "vocab"),
    inputs=(Buffer("logits", "act", _rv), Buffer("target", "i64", lambda d: (d["rows"],))),
    outputs=(Buffer("loss", "f32", lambda d: (d["rows"],)),), scalars={},
    default_shapes=({"rows": 64, "vocab": 32000},), tail_shapes=_TAILS, dtypes=("fp32", "bf16"),
    make_inputs=_ce_inputs, eager=_ce_eager, reference=_ce_ref,
    flops=lambda d: (4.0 + EXP_FLOPS) * d["rows"] * d["vocab"],
    bytes_moved=lambda d, e: e * d["rows"] * d["vocab"] + 12.0 * d["rows"],
    tile_dim="vocab", tile_bytes=lambda d, b, e: 1.0 * e * b,
    tol={"fp32": (1e-5, 1e-4), "bf16": (1e-4, 1e-3)},
)

KL_DIV = KernelSpec(
    name="kl_div", kclass="loss", dim_names=("rows", "vocab"),
    inputs=(Buffer("p_logits", "act", _rv), Buffer("q_logits", "act", _rv)),
    outputs=(Buffer("kl", "f32", lambda d: (d["rows"],)),), scalars={},
    default_shapes=({"rows": 32, "vocab": 32000},), tail_shapes=_TAILS, dtypes=("fp32", "bf16"),
    make_inputs=_kl_inputs, eager=_kl_eager, reference=_kl_ref,
    flops=lambda d: (10.0 + 2 * EXP_FLOPS) * d["rows"] * d["vocab"],
    bytes_moved=lambda d, e: 2.0 * e * d["rows"] * d["vocab"] + 4.0 * d["rows"],
    tile_dim="vocab", tile_bytes=lambda d, b, e: 2.0 * e * b,
    tol={"fp32": (1e-4, 1e-5), "bf16": (1e-3, 1e-4)},
)
