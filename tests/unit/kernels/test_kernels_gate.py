"""The correctness gate rejects deliberately wrong variants and accepts the right one."""

from __future__ import annotations

import pytest
from trex.kernels.backends.base import source_hash
from trex.kernels.backends.cpu_c import CFLAGS, CpuCompiled
from trex.kernels.suite import SUITE
from trex.kernels.verify import check_outputs, verify


def _build_variant(backend, name: str, old: str, new: str):  # type: ignore[no-untyped-def]
    """Compile the rendered kernel with one textual change (a planted bug)."""
    import cffi

    spec = SUITE[name]
    params = backend.default_params(spec, spec.tail_shapes[0])
    src = backend.render(spec, params, "fp32")
    assert old in src, f"template changed: {old!r} not found"
    bad = src.replace(old, new)
    digest = source_hash(bad + " ".join(CFLAGS))
    so = backend.build(bad, digest)
    ffi = cffi.FFI()
    ffi.cdef("void trex_kernel(void **p, const int64_t *d, const double *s);")
    return CpuCompiled(spec, params, "fp32", digest, ffi.dlopen(str(so)), ffi)


def test_correct_variant_passes(cpu_backend) -> None:  # type: ignore[no-untyped-def]
    spec = SUITE["rmsnorm_fwd"]
    comp = cpu_backend.compile(spec, cpu_backend.default_params(spec, spec.tail_shapes[0]), "fp32")
    assert verify(spec, comp, "fp32", seeds=5, shapes=list(spec.tail_shapes)).ok


def test_off_by_one_tail_is_rejected(cpu_backend) -> None:  # type: ignore[no-untyped-def]
    comp = _build_variant(cpu_backend, "rmsnorm_fwd", "for (int64_t c = 0; c < C; ++c) ST(yr",
                          "for (int64_t c = 0; c < C - 1; ++c) ST(yr")
    v = verify(SUITE["rmsnorm_fwd"], comp, "fp32", seeds=5, shapes=list(SUITE["rmsnorm_fwd"].tail_shapes))
    assert not v.ok and "non-finite" in v.reason


def test_wrong_clamp_bound_is_rejected(cpu_backend) -> None:  # type: ignore[no-untyped-def]
    comp = _build_variant(cpu_backend, "swiglu_clamp_fwd", "const float L = (float)s[0];",
                          "const float L = (float)s[0] + 0.5f;")
    spec = SUITE["swiglu_clamp_fwd"]
    v = verify(spec, comp, "fp32", seeds=5, shapes=list(spec.tail_shapes))
    assert not v.ok and "beyond tol" in v.reason


def test_output_aliasing_an_input_is_rejected() -> None:
    spec = SUITE["swiglu_clamp_fwd"]
    shape = spec.tail_shapes[0]

    def in_place(inputs, sh):  # type: ignore[no-untyped-def]
        y = spec.eager(inputs, sh, spec.scalars)["y"]
        return {"y": inputs["g"].copy_(y)}

    v = verify(spec, in_place, "fp32", seeds=5, shapes=[shape])
    assert not v.ok and ("modified" in v.reason or "aliases" in v.reason)
    t = spec.make_inputs(shape, "fp32", 0)
    ref = spec.reference({k: v.double() for k, v in t.items()}, shape, spec.scalars)
    assert "aliases input g" in (check_outputs(spec, "fp32", t, {"y": t["g"][:]}, ref, shape) or "")


def test_returning_a_cached_output_is_rejected(cpu_backend) -> None:  # type: ignore[no-untyped-def]
    spec = SUITE["cross_entropy"]
    comp = cpu_backend.compile(spec, cpu_backend.default_params(spec, spec.tail_shapes[0]), "fp32")
    cache: dict[str, object] = {}

    def memo(inputs, sh):  # type: ignore[no-untyped-def]
        key = repr(sorted(sh.items()))
        if key not in cache:
            cache[key] = {k: v.clone() for k, v in comp(inputs, sh).items()}
        return {k: v.clone() for k, v in cache[key].items()}  # type: ignore[attr-defined]

    v = verify(spec, memo, "fp32", seeds=5, shapes=list(spec.tail_shapes))
    assert not v.ok and "seed 1" in v.reason


def test_router_rejects_wrong_selection_bias_use(cpu_backend) -> None:  # type: ignore[no-untyped-def]
    spec = SUITE["router_topk"]
    comp = _build_variant(cpu_backend, "router_topk", "const float v = sc[e] + bias[e];", "const float v = sc[e];")
    v = verify(spec, comp, "fp32", seeds=5, shapes=list(spec.tail_shapes))
    assert not v.ok and "top-k" in v.reason


@pytest.mark.parametrize("name", ["rmsnorm_bwd", "swiglu_clamp_bwd"])
def test_backward_references_come_from_autograd(name: str) -> None:
    """The eager closed forms agree with the float64 autograd reference (two independent derivations)."""
    import torch

    spec = SUITE[name]
    shape = spec.tail_shapes[0]
    t = spec.make_inputs(shape, "fp32", 3)
    ref = spec.reference({k: v.double() for k, v in t.items()}, shape, spec.scalars)
    eager = spec.eager({k: v.double() for k, v in t.items()}, shape, spec.scalars)
    for k in ref:
        torch.testing.assert_close(eager[k].double(), ref[k], rtol=1e-6, atol=1e-6)
