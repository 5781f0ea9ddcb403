"""The explicit AVX-512 paths of the memory-bound cpu-c kernels (fp32, VEC >= 16, float accumulators,
polynomial exp) against the float64 reference: ragged tails (masked loads/stores), odd row counts (the
two-row tiles of rmsnorm_bwd), two threads, and NaN-prefilled outputs (verify starts every output as NaN)."""

from __future__ import annotations

import pytest
from trex.kernels.suite import SUITE
from trex.kernels.verify import verify

SIMD_KERNELS = ("rmsnorm_fwd", "rmsnorm_bwd", "swiglu_clamp_fwd", "swiglu_clamp_bwd")
EXTRA_SHAPES = ({"rows": 1, "cols": 15}, {"rows": 3, "cols": 64}, {"rows": 5, "cols": 81}, {"rows": 2, "cols": 16})


@pytest.mark.parametrize("name", SIMD_KERNELS)
@pytest.mark.parametrize(("vec", "threads"), [(16, 1), (64, 2)])
def test_simd_path_matches_float64_reference(cpu_backend, name: str, vec: int, threads: int) -> None:  # type: ignore[no-untyped-def]
    spec = SUITE[name]
    shapes = [*spec.tail_shapes, *EXTRA_SHAPES]
    space = cpu_backend.param_space(spec, shapes[0])
    params = {**cpu_backend.default_params(spec, shapes[0]), "VEC": vec, "THREADS": threads, "CHUNK": 1}
    for k, val in (("ACC_DOUBLE", 0), ("EXP_POLY", 1)):
        if k in space:
            params[k] = val
    comp = cpu_backend.compile(spec, params, "fp32")
    v = verify(spec, comp, "fp32", seeds=5, shapes=shapes, full_shapes_seeds=5)
    assert v.ok, f"{name} {params}: {v.reason}"
    assert v.checks == 5 * len(shapes)


def test_swiglu_simd_bwd_at_clamp_edges_matches_autograd(cpu_backend) -> None:  # type: ignore[no-untyped-def]
    """Values exactly at +-limit, beyond it, far negative (exp overflow side) and large positive: the mask
    logic and the reciprocal of the vector path against float64 autograd (inclusive clamp boundaries)."""
    import torch

    spec = SUITE["swiglu_clamp_bwd"]
    lim = float(spec.scalars["limit"])
    vals = torch.tensor([-lim, lim, lim + 1, -lim - 1, 0.5, -90.0, 100.0, -3.0] * 5, dtype=torch.float32)
    shape = {"rows": 2, "cols": 20}
    t = {"dy": torch.linspace(-1, 1, 40).reshape(2, 20), "g": vals.reshape(2, 20).clone(),
         "u": vals.flip(0).reshape(2, 20).clone()}
    params = {**cpu_backend.default_params(spec, shape), "VEC": 16, "EXP_POLY": 1}
    got = cpu_backend.compile(spec, params, "fp32")(t, shape)
    want = spec.reference({k: v.double() for k, v in t.items()}, shape, dict(spec.scalars))
    for k in ("dg", "du"):
        torch.testing.assert_close(got[k].double(), want[k], rtol=1e-4, atol=1e-5)
