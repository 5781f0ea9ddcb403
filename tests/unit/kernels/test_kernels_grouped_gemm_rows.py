"""grouped_gemm's register-blocked paths for every leftover row count: experts holding 0..17 tokens (so each
tile ends in 0..7 rows after its 8-row blocks), a column tail, against the float64 per-token einsum."""

from __future__ import annotations

from typing import Any

import pytest
from trex.kernels.suite import SUITE


def _problem(counts: list[int], hidden: int, out: int, seed: int) -> tuple[dict[str, int], dict[str, Any]]:
    """Shape and inputs of a grouped GEMM whose experts hold ``counts`` tokens (x, w, cumulative offsets)."""
    import torch

    shape = {"tokens": sum(counts), "experts": len(counts), "hidden": hidden, "out": out}
    g = torch.Generator().manual_seed(seed)
    offsets = torch.zeros(len(counts) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(counts), 0)
    return shape, {"x": torch.randn(shape["tokens"], hidden, generator=g),
                   "w": torch.randn(shape["experts"], hidden, out, generator=g), "offsets": offsets}


@pytest.mark.parametrize(("order", "mb", "nb"), [(3, 16, 32), (3, 32, 64), (2, 16, 64)])
def test_grouped_gemm_every_leftover_row_count(cpu_backend, order: int, mb: int, nb: int) -> None:  # type: ignore[no-untyped-def]
    import torch

    spec = SUITE["grouped_gemm"]
    shape, t = _problem(list(range(18)), hidden=40, out=70, seed=7)
    params = {**cpu_backend.default_params(spec, shape), "ORDER": order, "MB": mb, "NB": nb, "VEC": 16}
    got = cpu_backend.compile(spec, params, "fp32")(t, shape)["y"]
    want = spec.reference({**t, "x": t["x"].double(), "w": t["w"].double()}, shape, {})["y"]
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("order", "mb", "nb", "threads"), [(3, 16, 128, 1), (3, 32, 64, 2), (2, 8, 32, 1), (0, 8, 64, 2)])
def test_grouped_gemm_moe_skewed_and_empty_groups(cpu_backend, order: int, mb: int, nb: int, threads: int) -> None:  # type: ignore[no-untyped-def]
    """MoE-like routing: a Zipf-skewed load (one expert with most tokens, a long tail of 1-3 token experts)
    and several idle experts, including the first and the last, against the float64 per-token einsum."""
    import torch

    spec = SUITE["grouped_gemm"]
    shape, t = _problem([0, 97, 41, 0, 23, 11, 7, 5, 3, 2, 0, 1, 1, 2, 0], hidden=72, out=100, seed=11)
    params = {**cpu_backend.default_params(spec, shape), "ORDER": order, "MB": mb, "NB": nb, "VEC": 16,
              "THREADS": threads}
    out = torch.full((shape["tokens"], shape["out"]), float("nan"))
    cpu_backend.compile(spec, params, "fp32").bind(t, {"y": out}, shape)()
    want = spec.reference({**t, "x": t["x"].double(), "w": t["w"].double()}, shape, {})["y"]
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)
