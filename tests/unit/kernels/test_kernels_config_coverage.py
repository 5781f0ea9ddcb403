"""A KernelTuneConfig asking for a kernel, dtype or shape its backend cannot tune is refused with one line."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from trex.kernels.backends import coverage, get_backend
from trex.kernels.config import KERNEL_NAMES, KernelTuneConfig
from trex.kernels.suite import SUITE


@pytest.mark.parametrize("backend", ["cpu-c", "cuda-triton", "npu-ascendc"])
def test_coverage_agrees_with_backend_supports(backend: str) -> None:
    be = get_backend(backend)
    have = coverage(backend)
    for name in KERNEL_NAMES:
        for dtype in ("fp32", "bf16"):
            assert be.supports(SUITE[name], dtype) == (dtype in have.get(name, ())), (backend, name, dtype)


@pytest.mark.parametrize(("fields", "words"), [
    ({"backend": "npu-ascendc", "dtypes": ["bf16"]}, "dtypes: backend npu-ascendc has no bf16 template for any kernel"),
    ({"backend": "npu-ascendc", "kernels": ["router_topk"]}, "kernels: backend npu-ascendc has no template for router_topk"),
    ({"backend": "cpu-c", "kernels": ["mhc_pre"], "dtypes": ["fp32", "bf16"]}, "dtypes: backend cpu-c has no bf16 template for mhc_pre"),
    ({"backend": "cuda-triton", "kernels": ["grouped_gemm"], "dtypes": ["fp32", "bf16"]},
     "dtypes: backend cuda-triton has no bf16 template for grouped_gemm (it has fp32)"),
    ({"shapes": [{"kernel": "router_topk", "dims": {"tokens": 8, "experts": 16, "k": 2, "score": 3}}]},
     "shapes[0].dims.score: must be 1 (sigmoid) or 2 (sqrt-softplus), got 3"),
    ({"shapes": [{"kernel": "router_topk", "dims": {"tokens": 8, "experts": 4, "k": 6, "score": 1}}]},
     "shapes[0].dims.k: must be in [1, experts=4], got 6"),
    ({"shapes": [{"kernel": "rope_fwd", "dims": {"rows": 4, "cols": 8}}]}, "shapes[0].dims: rope_fwd takes dims"),
])
def test_uncovered_requests_rejected(fields: dict[str, object], words: str) -> None:
    with pytest.raises(ValidationError) as e:
        KernelTuneConfig(**fields)  # type: ignore[arg-type]
    assert words in str(e.value)


def test_covered_requests_accepted() -> None:
    KernelTuneConfig(backend="npu-ascendc", kernels=["rmsnorm_fwd", "rope_inv"])
    KernelTuneConfig(backend="cuda-triton", suite="none", kernels=["router_topk", "grouped_gemm", "mhc_pre"])
    KernelTuneConfig(backend="cuda-triton")  # the whole suite but rmsnorm_bwd, which has no Triton template
    KernelTuneConfig(backend="cpu-c", dtypes=["fp32", "bf16"])  # the suite: kernels lacking bf16 are skipped
    KernelTuneConfig(shapes=[{"kernel": "rope_fwd", "dims": {"tokens": 4, "heads": 2, "dim": 8}}])  # type: ignore[list-item]
