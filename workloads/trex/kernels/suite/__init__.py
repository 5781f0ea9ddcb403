"""The kernel suite: every kernel's contract, references and default shapes, by name."""

from __future__ import annotations

from trex.kernels.suite.activation import SWIGLU_BWD, SWIGLU_FWD
from trex.kernels.suite.base import KernelSpec
from trex.kernels.suite.losses import CROSS_ENTROPY, KL_DIV
from trex.kernels.suite.mixing import MHC_PRE
from trex.kernels.suite.norm import RMSNORM_BWD, RMSNORM_FWD
from trex.kernels.suite.rotary import ROPE_FWD, ROPE_INV
from trex.kernels.suite.routing import GROUPED_GEMM, ROUTER_TOPK

SUITE: dict[str, KernelSpec] = {
    k.name: k
    for k in (RMSNORM_FWD, RMSNORM_BWD, SWIGLU_FWD, SWIGLU_BWD, ROPE_FWD, ROPE_INV, ROUTER_TOPK, GROUPED_GEMM,
              CROSS_ENTROPY, KL_DIV, MHC_PRE)
}


def get(name: str) -> KernelSpec:
    """The spec of a suite kernel; an unknown name is an error listing the known ones."""
    try:
        return SUITE[name]
    except KeyError:
        raise KeyError(f"unknown kernel {name!r}; known: {sorted(SUITE)}") from None
