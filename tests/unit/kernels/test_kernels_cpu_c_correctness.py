"""Every cpu-c kernel matches its float64 reference (fp32, and bf16 where the suite declares it), for the
plain configuration and for one with every optimisation switched on."""

from __future__ import annotations

from typing import Any

import pytest
from trex.kernels.suite import SUITE
from trex.kernels.verify import verify

CASES = [(n, dt) for n, spec in SUITE.items() for dt in spec.dtypes]


def _tuned(backend: Any, spec: Any) -> dict[str, int]:
    shape = spec.tail_shapes[0]
    p = backend.default_params(spec, shape)
    on = {"VEC": 16, "EXP_POLY": 1, "FUSED": 1, "ORDER": 3, "ACC_DOUBLE": 1, "CHUNK": 4, "BLOCK": 512, "MB": 16, "NB": 32}
    space = backend.param_space(spec, shape)
    return {k: (on[k] if k in on and on[k] in space[k] else v) for k, v in p.items()}


@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_cpu_c_kernel_matches_float64_reference(cpu_backend, name: str, dtype: str) -> None:  # type: ignore[no-untyped-def]
    spec = SUITE[name]
    for params in (cpu_backend.default_params(spec, spec.tail_shapes[0]), _tuned(cpu_backend, spec)):
        comp = cpu_backend.compile(spec, params, dtype)
        v = verify(spec, comp, dtype, seeds=5, shapes=list(spec.tail_shapes))
        assert v.ok, f"{name} {dtype} {params}: {v.reason}"
        assert v.checks == 5 * len(spec.tail_shapes)


def test_suite_covers_the_issue() -> None:
    assert len(SUITE) >= 8
    assert {"rmsnorm_fwd", "rmsnorm_bwd", "swiglu_clamp_fwd", "swiglu_clamp_bwd", "rope_fwd", "rope_inv",
            "router_topk", "grouped_gemm", "cross_entropy", "kl_div", "mhc_pre"} <= set(SUITE)


def test_rope_inverse_undoes_forward(cpu_backend) -> None:  # type: ignore[no-untyped-def]
    import torch

    shape = {"tokens": 9, "heads": 3, "dim": 34}
    fwd, inv = SUITE["rope_fwd"], SUITE["rope_inv"]
    t = fwd.make_inputs(shape, "fp32", 4)
    y = cpu_backend.compile(fwd, cpu_backend.default_params(fwd, shape), "fp32")(t, shape)["y"]
    back = cpu_backend.compile(inv, cpu_backend.default_params(inv, shape), "fp32")({**t, "x": y}, shape)["y"]
    torch.testing.assert_close(back, t["x"], rtol=1e-5, atol=1e-5)


def test_mhc_output_is_column_stochastic_and_rows_near_one(cpu_backend) -> None:  # type: ignore[no-untyped-def]
    import torch

    spec = SUITE["mhc_pre"]
    shape = {"tokens": 5, "streams": 4, "hidden": 16, "iters": 30}
    h = cpu_backend.compile(spec, cpu_backend.default_params(spec, shape), "fp32")(spec.make_inputs(shape, "fp32", 0), shape)["h"]
    torch.testing.assert_close(h.sum(-2), torch.ones(5, 4), rtol=0, atol=1e-5)
    torch.testing.assert_close(h.sum(-1), torch.ones(5, 4), rtol=0, atol=1e-3)


@pytest.mark.parametrize("order", [0, 1, 2, 3])
def test_grouped_gemm_every_loop_order(cpu_backend, order: int) -> None:  # type: ignore[no-untyped-def]
    spec = SUITE["grouped_gemm"]
    shapes = [*spec.tail_shapes, {"tokens": 70, "experts": 3, "hidden": 40, "out": 70}]
    for mb, nb in ((8, 32), (16, 64)):
        params = {**cpu_backend.default_params(spec, shapes[0]), "ORDER": order, "MB": mb, "NB": nb, "VEC": 16}
        v = verify(spec, cpu_backend.compile(spec, params, "fp32"), "fp32", seeds=5, shapes=shapes, full_shapes_seeds=5)
        assert v.ok, f"ORDER={order} MB={mb} NB={nb}: {v.reason}"
