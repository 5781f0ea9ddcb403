"""npu-ascendc: tilings fit the SoC's Unified Buffer (halved by double buffering), stay 32-byte aligned,
cover every element, and overflowing ones are rejected; compiling without CANN fails clearly."""

from __future__ import annotations

import struct

import pytest
from trex.kernels.backends.ascendc import SOCS, AscendCBackend, make_tiling, plan_tiling, ub_bytes
from trex.kernels.backends.base import BackendUnavailable
from trex.kernels.suite import SUITE

SHAPES = [("rmsnorm_fwd", {"rows": 512, "cols": 7168}), ("rmsnorm_fwd", {"rows": 3, "cols": 40}),
          ("swiglu_clamp_fwd", {"rows": 64, "cols": 2048}), ("swiglu_clamp_fwd", {"rows": 1000, "cols": 18432}),
          ("rope_fwd", {"tokens": 512, "heads": 16, "dim": 64}), ("rope_inv", {"tokens": 7, "heads": 128, "dim": 192})]


@pytest.mark.parametrize("soc", sorted(SOCS))
@pytest.mark.parametrize(("name", "shape"), SHAPES)
def test_planned_tilings_fit_and_cover(soc: str, name: str, shape: dict[str, int]) -> None:
    be = AscendCBackend(soc=soc)
    spec = SUITE[name]
    ranked = plan_tiling(spec, shape, be, k=3)
    assert ranked
    for params, t, _ in ranked:
        assert t.ub_bytes <= SOCS[soc].ub_bytes
        assert (t.tile_len * 4) % 32 == 0
        assert (t.tile_num - 1) * t.tile_len + t.last_tile_len == t.cols and 0 < t.last_tile_len <= t.tile_len
        assert t.rows_per_core * t.block_dim >= t.rows > t.rows_per_core * (t.block_dim - 1)
        src = be.render(spec, params, "fp32")
        assert f"#define TILE_LEN {params['TILE_LEN']}" in src and f"#define BUFFER_NUM {params['BUFFER_NUM']}" in src
        assert "struct TrexTiling" in src and '#include "tiling.h"' not in src
        assert len(t.pack()) == struct.calcsize("<6If")


def test_double_buffering_halves_the_usable_tile() -> None:
    spec = SUITE["swiglu_clamp_fwd"]
    shape = {"rows": 8, "cols": 65536}
    one = {"TILE_LEN": 8192, "BUFFER_NUM": 1, "BLOCK_DIM": 8}
    two = {**one, "BUFFER_NUM": 2}
    assert make_tiling(spec, shape, one, "ascend910b").ub_bytes == (3 + 1) * 8192 * 4 <= 192 << 10
    with pytest.raises(ValueError, match="UB"):
        make_tiling(spec, shape, two, "ascend910b")  # (3*2+1)*8192*4 = 224 KiB > 192 KiB
    assert ub_bytes(spec.name, {"TILE_LEN": 4096, "BUFFER_NUM": 2}) <= 192 << 10
    # 310P has 256 KiB: the double-buffered 8192-element tile (224 KiB) fits there
    assert make_tiling(spec, shape, two, "ascend310p").ub_bytes == 7 * 8192 * 4


def test_overflow_and_misalignment_are_rejected() -> None:
    spec = SUITE["rmsnorm_fwd"]
    with pytest.raises(ValueError, match="UB"):
        make_tiling(spec, {"rows": 4, "cols": 65536}, {"TILE_LEN": 16384, "BUFFER_NUM": 2, "BLOCK_DIM": 4}, "ascend910b")
    with pytest.raises(ValueError, match="TILE_LEN"):
        make_tiling(spec, {"rows": 4, "cols": 64}, {"TILE_LEN": 100, "BUFFER_NUM": 1, "BLOCK_DIM": 4}, "ascend910b")
    with pytest.raises(ValueError, match="aligned"):
        make_tiling(spec, {"rows": 4, "cols": 1001}, {"TILE_LEN": 256, "BUFFER_NUM": 1, "BLOCK_DIM": 4}, "ascend910b")
    with pytest.raises(ValueError, match="BLOCK_DIM"):
        make_tiling(spec, {"rows": 4, "cols": 64}, {"TILE_LEN": 256, "BUFFER_NUM": 1, "BLOCK_DIM": 64}, "ascend310p")


def test_compile_without_cann_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    be = AscendCBackend()
    spec = SUITE["rmsnorm_fwd"]
    with pytest.raises(BackendUnavailable, match="CANN"):
        be.compile(spec, be.default_params(spec, {}), "fp32")


def test_tuning_on_a_host_without_npu_is_a_clear_error(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from trex.kernels.cli import main

    try:
        import torch_npu  # noqa: F401
        pytest.skip("torch_npu present: this checks the no-NPU path")
    except ImportError:
        pass
    assert main(["tune", "--backend", "npu-ascendc", "--kernels", "rmsnorm_fwd", "--budget-trials", "1",
                 "--out", str(tmp_path)]) == 3
    assert "torch_npu" in capsys.readouterr().err


@pytest.mark.parametrize("layout", ["compiler", "tools", "aarch64-linux", "x86_64-linux"])
def test_cann_root_and_cmake_module_in_every_shipped_layout(layout: str, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from trex.kernels.backends.ascendc import ascendc_cmake_dir, cann_home, cmake_lists

    home = tmp_path / "ascend-toolkit" / "latest"
    ccec = home / layout / "ccec_compiler" / "bin" / "ccec"
    ccec.parent.mkdir(parents=True)
    ccec.write_text("#!/bin/sh\n")
    ccec.chmod(0o755)
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    monkeypatch.setenv("PATH", str(ccec.parent))
    assert cann_home() == home  # <home>/<layout>/ccec_compiler/bin/ccec: three levels above bin
    assert ascendc_cmake_dir(home) is None
    with pytest.raises(BackendUnavailable, match=r"no tikcpp/ascendc_kernel_cmake/ascendc\.cmake under"):
        AscendCBackend().compile(SUITE["rmsnorm_fwd"], AscendCBackend().default_params(SUITE["rmsnorm_fwd"], {}), "fp32")
    module = home / layout / "tikcpp" / "ascendc_kernel_cmake"
    module.mkdir(parents=True)
    (module / "ascendc.cmake").write_text("")
    assert ascendc_cmake_dir(home) == module
    text = cmake_lists("trex_rmsnorm_fwd", "Ascend910B1", home, module)
    assert f"include({module}/ascendc.cmake)" in text and "set(SOC_VERSION Ascend910B1)" in text
    assert "ascendc_library(trex_rmsnorm_fwd SHARED trex_rmsnorm_fwd.cpp)" in text


def test_rendered_templates_carry_the_soc_form_of_the_cache_clean() -> None:
    spec = SUITE["rmsnorm_fwd"]
    params = {"TILE_LEN": 1024, "BUFFER_NUM": 2, "BLOCK_DIM": 8}
    a2 = AscendCBackend("ascend910b").render(spec, params, "fp32")
    assert "#define RED_WORK_LEN 16" in a2
    assert "DataCacheCleanAndInvalid<float, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(g)" in a2
    p310 = AscendCBackend("ascend310p").render(spec, params, "fp32")
    assert "DataCacheCleanAndInvalid<float, CacheLine::SINGLE_CACHE_LINE>(g)" in p310
    # the UB account includes the ReduceSum work buffer and the 16-float result block
    assert ub_bytes("rmsnorm_fwd", params) == (3 * 2 + 1) * 1024 * 4 + (16 + 16) * 4


BF16_SHAPES = [("rmsnorm_fwd", {"rows": 512, "cols": 7168}), ("rmsnorm_fwd", {"rows": 3, "cols": 48}),
               ("swiglu_clamp_fwd", {"rows": 1000, "cols": 18432})]


@pytest.mark.parametrize("soc", sorted(SOCS))
@pytest.mark.parametrize(("name", "shape"), BF16_SHAPES)
def test_bf16_planned_tilings_fit_and_render(soc: str, name: str, shape: dict[str, int]) -> None:
    be = AscendCBackend(soc=soc)
    spec = SUITE[name]
    ranked = plan_tiling(spec, shape, be, k=3, dtype="bf16")
    assert ranked
    for params, t, _ in ranked:
        assert t.ub_bytes == ub_bytes(name, params, "bf16") <= SOCS[soc].ub_bytes
        assert (t.tile_len * 2) % 32 == 0
        src = be.render(spec, params, "bf16")
        assert "#define T_IN bfloat16_t" in src and "#define TREX_BF16 1" in src


def test_bf16_ub_account_has_half_size_queues_and_fp32_work_tiles() -> None:
    p = {"TILE_LEN": 1024, "BUFFER_NUM": 2}
    # rmsnorm: x, w, y queues of bf16 twice; fp32 x^2 / x and w tiles; ReduceSum work and the 16-float block
    assert ub_bytes("rmsnorm_fwd", p, "bf16") == 3 * 2 * 1024 * 2 + 2 * 1024 * 4 + (16 + 16) * 4
    # swiglu: g, u, y queues of bf16 twice; fp32 g, u and exp tiles
    assert ub_bytes("swiglu_clamp_fwd", p, "bf16") == 3 * 2 * 1024 * 2 + 3 * 1024 * 4
    spec = SUITE["swiglu_clamp_fwd"]
    two = {"TILE_LEN": 8192, "BUFFER_NUM": 2, "BLOCK_DIM": 8}  # fp32 overflows 192 KiB (224 KiB); bf16 is 192 KiB
    assert make_tiling(spec, {"rows": 8, "cols": 65536}, two, "ascend910b", "bf16").ub_bytes == 192 << 10


def test_bf16_alignment_and_dtype_are_checked() -> None:
    spec = SUITE["rmsnorm_fwd"]
    one = {"TILE_LEN": 256, "BUFFER_NUM": 1, "BLOCK_DIM": 4}
    make_tiling(spec, {"rows": 4, "cols": 1000}, one, "ascend910b")  # 1000 fp32 = 125 blocks
    with pytest.raises(ValueError, match="row length 1000 bf16 is not 32-byte aligned"):
        make_tiling(spec, {"rows": 4, "cols": 1000}, one, "ascend910b", "bf16")
    with pytest.raises(ValueError, match="TILE_LEN=8"):
        make_tiling(spec, {"rows": 4, "cols": 64}, {**one, "TILE_LEN": 8}, "ascend910b", "bf16")
    with pytest.raises(ValueError, match="dtype 'bf16'"):
        make_tiling(SUITE["rope_fwd"], {"tokens": 4, "heads": 2, "dim": 64}, one, "ascend910b", "bf16")
    be = AscendCBackend()
    assert be.supports(spec, "bf16") and not be.supports(SUITE["rope_fwd"], "bf16")
    assert "#define T_IN float" in be.render(spec, one, "fp32")
