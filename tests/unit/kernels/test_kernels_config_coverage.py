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
    ({"backend": "npu-ascendc", "kernels": ["rope_fwd"], "dtypes": ["bf16"]},
     "dtypes: backend npu-ascendc has no bf16 template for rope_fwd (it has fp32)"),
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


def _planned(**fields: object) -> set[tuple[str, str]]:
    """The (kernel, dtype) pairs a valid config makes the tuner run on its backend."""
    from trex.kernels.tune import jobs

    cfg = KernelTuneConfig(**fields)  # type: ignore[arg-type]
    return {(spec.name, dtype) for spec, _shape, dtype in jobs(cfg, get_backend(cfg.backend))}


def test_covered_requests_accepted() -> None:
    assert _planned(backend="npu-ascendc", kernels=["rmsnorm_fwd", "rope_inv"]) == {
        ("rmsnorm_fwd", "fp32"), ("rope_inv", "fp32")}
    # bf16 templates exist for RMSNorm and SwiGLU only: RoPE is tuned in fp32 alone
    assert _planned(backend="npu-ascendc", dtypes=["fp32", "bf16"]) == {(n, "fp32") for n in (
        "rmsnorm_fwd", "swiglu_clamp_fwd", "rope_fwd", "rope_inv")} | {("rmsnorm_fwd", "bf16"), ("swiglu_clamp_fwd", "bf16")}
    assert _planned(backend="cuda-triton", suite="none", kernels=["router_topk", "grouped_gemm", "mhc_pre"]) == {
        ("router_topk", "fp32"), ("grouped_gemm", "fp32"), ("mhc_pre", "fp32")}
    # the whole suite but rmsnorm_bwd, which has no Triton template
    assert _planned(backend="cuda-triton") == {(n, "fp32") for n in SUITE if n != "rmsnorm_bwd"}
    # the suite in both dtypes, but the kernels lacking a bf16 template are skipped in bf16
    fp32_only = {"grouped_gemm", "mhc_pre", "router_topk"}
    assert _planned(backend="cpu-c", dtypes=["fp32", "bf16"]) == {(n, "fp32") for n in SUITE} | {
        (n, "bf16") for n in SUITE if n not in fp32_only}
    from trex.kernels.tune import jobs

    cfg = KernelTuneConfig(shapes=[{"kernel": "rope_fwd", "dims": {"tokens": 4, "heads": 2, "dim": 8}}])  # type: ignore[list-item]
    assert [shape for spec, shape, _ in jobs(cfg, get_backend(cfg.backend)) if spec.name == "rope_fwd"] == [
        {"tokens": 4, "heads": 2, "dim": 8}]


def test_one_shape_per_class_is_tuned() -> None:
    """Two listed shapes in one shape class (the registry holds one entry per class) tune once: the first."""
    from trex.kernels.suite.base import shape_bucket
    from trex.kernels.tune import jobs

    cfg = KernelTuneConfig.model_validate({"backend": "cpu-c", "suite": "none", "kernels": ["rmsnorm_fwd"], "shapes": [
        {"kernel": "rmsnorm_fwd", "dims": {"rows": 3000, "cols": 64}},
        {"kernel": "rmsnorm_fwd", "dims": {"rows": 4096, "cols": 64}},
        {"kernel": "rmsnorm_fwd", "dims": {"rows": 512, "cols": 64}}]})
    got = [sh for _, sh, _ in jobs(cfg, get_backend("cpu-c"))]
    assert shape_bucket({"rows": 3000, "cols": 64}) == shape_bucket({"rows": 4096, "cols": 64})
    assert got == [{"rows": 3000, "cols": 64}, {"rows": 512, "cols": 64}]


def test_summary_geomean_is_that_of_the_published_classes() -> None:
    """The termination summary's geomeans are those of the per-class figures it publishes (rounded as published),
    even when two records share a class."""
    import math

    from trex.kernels.backends.base import DeviceFacts
    from trex.kernels.tune import termination_summary

    def rec(bucket: str, eager: float, comp: float | None) -> dict[str, object]:
        return {"kernel": "rmsnorm_fwd", "dtype": "fp32", "bucket": bucket, "speedup_eager": eager,
                "speedup_compile": comp, "params": {"VEC": 8}, "trials": 3}
    facts = get_backend("cpu-c").facts()
    assert isinstance(facts, DeviceFacts)
    out = termination_summary([rec("a", 2.00049, 1.5), rec("b", 0.5, None), rec("b", 8.0, 3.0)], "cpu-c", facts)
    published = [v["speedup"] for v in out["kernels"].values()]
    assert published == [2.0, 8.0] and out["trials"] == 9
    assert out["geomeanSpeedup"] == pytest.approx(math.sqrt(2.0 * 8.0), abs=1e-4)
    assert out["geomeanSpeedupCompile"] == pytest.approx(math.sqrt(1.5 * 3.0), abs=1e-4)
