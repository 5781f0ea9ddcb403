"""npu-ascendc templates, compiled with g++ against a CPU stand-in of the Ascend C API (ascendc_cpu/) and run core
by core: results match the suite's float64 references, and each API rule the templates once broke (ReduceSum's
work buffer, the V->S flag before GetValue, DataCacheCleanAndInvalid after SetValue, cache lines shared between
cores) is caught when a rendered kernel breaks it. The bf16 variants (bf16 queues, fp32 work tiles, Cast back with
CAST_RINT) meet the suite's bf16 tolerance, and RMSNorm's y is bit-identical to torch's fp32-compute-then-bfloat16
rounding. Needs g++ (skipped without, saying so)."""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from trex.kernels.backends.ascendc import (
    ASCEND_KERNELS,
    SOCS,
    AscendCBackend,
    AscendTiling,
    make_tiling,
    reduce_work_len,
)
from trex.kernels.suite import SUITE
from trex.kernels.suite.base import torch_dtype

HERE = Path(__file__).resolve().parent
GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="g++ missing: the AscendC CPU contract tests did NOT run")


TILING_H = (Path(__import__("trex.kernels.backends", fromlist=["x"]).__file__).parent / "ascendc_templates"
            / "tiling.h").read_text(encoding="utf-8")
MACROS = ("TILE_LEN", "BUFFER_NUM", "KERNEL_NAME", "RED_WORK_LEN", "TREX_DCCI", "T_IN", "TREX_BF16")


@dataclass(frozen=True)
class Variant:
    """One rendered kernel source to build: its key, text and entry point."""

    key: str
    name: str
    src: str

    @property
    def entry(self) -> str:
        return ASCEND_KERNELS[self.name][1]


def _bundle(variants: list[Variant], out: Path) -> ctypes.CDLL:
    """Every variant in one translation unit (one g++ run): each in its own namespace, its entry renamed, with a
    ``trex_run_<key>(ub_bytes, block_dim, gm pointers..., [heads])`` driver."""
    parts = ['#include "kernel_operator.h"', TILING_H]
    for v in variants:
        spec = SUITE[v.name]
        n_gm = len(spec.inputs) + len(spec.outputs) + 1
        rope = v.name.startswith("rope")
        params = ", ".join(f"uint8_t *a{i}" for i in range(n_gm)) + (", uint32_t heads" if rope else "")
        args = ", ".join(f"a{i}" for i in range(n_gm)) + (", heads" if rope else "")
        body = v.src.replace(v.entry, f"{v.entry}_{v.key}")
        parts += [*(f"#undef {m}" for m in MACROS), f"namespace {v.key} {{", body, "}",
                  f'extern "C" int trex_run_{v.key}(uint32_t ub_bytes, uint32_t block_dim, {params}) {{',
                  f"  return trex_run_cores(ub_bytes, block_dim, [&] {{ {v.key}::{v.entry}_{v.key}({args}); }});", "}"]
    parts.append('extern "C" const char *trex_last_error() { return trex_error().c_str(); }')
    text = "\n".join(parts) + "\n"
    lib = out / f"bundle-{hashlib.sha256(text.encode()).hexdigest()[:16]}.so"
    if not lib.exists():
        cpp = lib.with_suffix(".cpp")
        cpp.write_text(text, encoding="utf-8")
        cmd = [str(GXX), "-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{HERE / 'ascendc_cpu'}",
               str(cpp), "-o", str(lib)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
    dll = ctypes.CDLL(str(lib))
    dll.trex_last_error.restype = ctypes.c_char_p
    return dll


def _run(dll: ctypes.CDLL, key: str, name: str, shape: dict[str, int], t: AscendTiling, soc: str,
         dtype: str = "fp32", inputs: dict[str, torch.Tensor] | None = None
         ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], str | None]:
    """Run built variant ``key`` of kernel ``name`` on the CPU stand-in: (outputs, float64 reference, error)."""
    spec = SUITE[name]
    inputs = spec.make_inputs(shape, dtype, 0) if inputs is None else inputs
    outs = {b.name: torch.full(b.shape(shape), float("nan"), dtype=torch_dtype(b.role, dtype)) for b in spec.outputs}
    packed = bytearray(t.pack())
    tiling_buf = (ctypes.c_uint8 * len(packed)).from_buffer(packed)
    ptrs = [ctypes.c_void_p(inputs[b.name].data_ptr()) for b in spec.inputs]
    ptrs += [ctypes.c_void_p(outs[b.name].data_ptr()) for b in spec.outputs]
    ptrs.append(ctypes.cast(tiling_buf, ctypes.c_void_p))
    extra = [ctypes.c_uint32(shape["heads"])] if name.startswith("rope") else []
    rc = getattr(dll, f"trex_run_{key}")(ctypes.c_uint32(SOCS[soc].ub_bytes), ctypes.c_uint32(t.block_dim), *ptrs,
                                          *extra)
    error = dll.trex_last_error().decode() if rc else None
    ref = spec.reference({k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}, shape,
                         dict(spec.scalars))
    return outs, ref, error


CASES = [("rmsnorm_fwd", {"rows": 37, "cols": 1000}, {"TILE_LEN": 256, "BUFFER_NUM": 2, "BLOCK_DIM": 8}),
         ("rmsnorm_fwd", {"rows": 64, "cols": 2048}, {"TILE_LEN": 2048, "BUFFER_NUM": 1, "BLOCK_DIM": 40}),
         ("swiglu_clamp_fwd", {"rows": 9, "cols": 136}, {"TILE_LEN": 64, "BUFFER_NUM": 2, "BLOCK_DIM": 4}),
         ("rope_fwd", {"tokens": 7, "heads": 5, "dim": 144}, {"TILE_LEN": 64, "BUFFER_NUM": 2, "BLOCK_DIM": 6}),
         ("rope_inv", {"tokens": 5, "heads": 3, "dim": 64}, {"TILE_LEN": 256, "BUFFER_NUM": 1, "BLOCK_DIM": 2})]


BF16_CASES = [("rmsnorm_fwd", {"rows": 37, "cols": 1008}, {"TILE_LEN": 256, "BUFFER_NUM": 2, "BLOCK_DIM": 8}),
              ("rmsnorm_fwd", {"rows": 64, "cols": 2048}, {"TILE_LEN": 2048, "BUFFER_NUM": 1, "BLOCK_DIM": 40}),
              ("swiglu_clamp_fwd", {"rows": 9, "cols": 144}, {"TILE_LEN": 64, "BUFFER_NUM": 2, "BLOCK_DIM": 4}),
              ("swiglu_clamp_fwd", {"rows": 33, "cols": 4096}, {"TILE_LEN": 1024, "BUFFER_NUM": 2, "BLOCK_DIM": 40})]
"""bf16 problems: row lengths in whole 16-element (32-byte) blocks, tails shorter than a tile."""


RMS = ("rmsnorm_fwd", {"rows": 40, "cols": 512}, CASES[0][2])
P310 = ("rmsnorm_fwd", {"rows": 20, "cols": 512}, {"TILE_LEN": 512, "BUFFER_NUM": 2, "BLOCK_DIM": 8})
BROKEN = [
    ("ReduceSum(red, sq, work_.Get<float>(), n)", "ReduceSum(red, sq, sq, n)", "work buffer overlaps its source"),
    ("pipe_.InitBuffer(work_, RED_WORK_LEN * sizeof(float))", "pipe_.InitBuffer(work_, 0 * sizeof(float))",
     "work buffer below its minimum size"),
    ("    WaitFlag<HardEvent::V_S>(ev);\n", "", "GetValue of a vector result without a V_S SetFlag/WaitFlag"),
    ("      TREX_DCCI(rGm_[r]);\n", "", "not cleaned out to GM"),
]


@pytest.fixture(scope="module")
def dll(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """One build of every variant the tests run: the templates as rendered, the 310P form, the broken ones."""
    variants = [Variant(f"c{i}", name, AscendCBackend(soc="ascend910b").render(SUITE[name], params, "fp32"))
                for i, (name, _, params) in enumerate(CASES)]
    variants.append(Variant("p310", P310[0], AscendCBackend(soc="ascend310p").render(SUITE[P310[0]], P310[2], "fp32")))
    rms = AscendCBackend().render(SUITE[RMS[0]], RMS[2], "fp32")
    for i, (old, new, _) in enumerate(BROKEN):
        assert old in rms
        variants.append(Variant(f"b{i}", RMS[0], rms.replace(old, new)))
    variants += [Variant(f"h{i}", name, AscendCBackend().render(SUITE[name], params, "bf16"))
                 for i, (name, _, params) in enumerate(BF16_CASES)]
    rms16 = AscendCBackend().render(SUITE[RMS[0]], RMS[2], "bf16")
    assert rms16.count("RoundMode::CAST_RINT") == 1
    variants.append(Variant("hnone", RMS[0], rms16.replace("RoundMode::CAST_RINT", "RoundMode::CAST_NONE")))
    return _bundle(variants, tmp_path_factory.mktemp("ascendc-cpu"))


@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda i: f"{CASES[i][0]}-{CASES[i][1]}")
def test_templates_match_the_float64_reference(dll: ctypes.CDLL, case: int) -> None:
    name, shape, params = CASES[case]
    outs, ref, error = _run(dll, f"c{case}", name, shape, make_tiling(SUITE[name], shape, params, "ascend910b"),
                            "ascend910b")
    assert error is None, error
    for key, want in ref.items():
        torch.testing.assert_close(outs[key].double(), want, rtol=2e-5, atol=2e-5)


def test_the_310p_form_of_the_cache_clean_runs(dll: ctypes.CDLL) -> None:
    name, shape, params = P310
    outs, ref, error = _run(dll, "p310", name, shape, make_tiling(SUITE[name], shape, params, "ascend310p"),
                            "ascend310p")
    assert error is None, error
    torch.testing.assert_close(outs["rstd"].double(), ref["rstd"], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("case", range(len(BROKEN)), ids=lambda i: BROKEN[i][2])
def test_each_broken_pattern_is_caught(dll: ctypes.CDLL, case: int) -> None:
    name, shape, params = RMS
    _, _, error = _run(dll, f"b{case}", name, shape, make_tiling(SUITE[name], shape, params, "ascend910b"),
                       "ascend910b")
    assert error is not None and BROKEN[case][2] in error


def test_cores_never_share_an_rstd_cache_line(dll: ctypes.CDLL) -> None:
    name, shape, params = RMS
    t = make_tiling(SUITE[name], shape, params, "ascend910b")
    assert t.rows_per_core % 16 == 0 and (t.rows_per_core, t.block_dim) == (16, 3)  # 40 rows on 8 cores
    # a tiling of 10 rows per core puts rows 10..15 of core 1 on core 0's 64-byte line
    _, _, error = _run(dll, "c0", name, shape, replace(t, rows_per_core=10, block_dim=4), "ascend910b")
    assert error is not None and "two cores write the same 64-byte GM line" in error


@pytest.mark.parametrize(("count", "work"), [(1, 8), (64, 8), (65, 8), (512, 8), (513, 16), (16384, 256)])
def test_reduce_work_len_follows_the_api_formula(count: int, work: int) -> None:
    assert reduce_work_len(count) == work


@pytest.mark.parametrize("case", range(len(BF16_CASES)), ids=lambda i: f"{BF16_CASES[i][0]}-{BF16_CASES[i][1]}")
def test_bf16_templates_match_the_float64_reference(dll: ctypes.CDLL, case: int) -> None:
    name, shape, params = BF16_CASES[case]
    spec = SUITE[name]
    outs, ref, error = _run(dll, f"h{case}", name, shape, make_tiling(spec, shape, params, "ascend910b", "bf16"),
                            "ascend910b", "bf16")
    assert error is None, error
    rtol, atol = spec.tol["bf16"]
    for b in spec.outputs:
        assert outs[b.name].dtype == torch_dtype(b.role, "bf16")
        torch.testing.assert_close(outs[b.name].double(), ref[b.name], rtol=rtol, atol=atol)
    if name == "rmsnorm_fwd":  # rstd is fp32 in GM: fp32 accuracy, not bf16's
        torch.testing.assert_close(outs["rstd"].double(), ref["rstd"], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("case", [0, 1])
def test_bf16_rmsnorm_rounds_like_torch(dll: ctypes.CDLL, case: int) -> None:
    """y is x.float() * rstd * w.float() in fp32, rounded once to bf16 (nearest even): bit-identical to torch."""
    name, shape, params = BF16_CASES[case]
    inputs = SUITE[name].make_inputs(shape, "bf16", 0)
    outs, _, error = _run(dll, f"h{case}", name, shape, make_tiling(SUITE[name], shape, params, "ascend910b", "bf16"),
                          "ascend910b", "bf16", inputs)
    assert error is None, error
    want = (inputs["x"].float() * outs["rstd"][:, None] * inputs["w"].float()).bfloat16()
    assert torch.equal(outs["y"].view(torch.int16), want.view(torch.int16))
    truncated = (inputs["x"].float() * outs["rstd"][:, None] * inputs["w"].float()).view(torch.int32) >> 16
    assert not torch.equal(outs["y"].view(torch.int16).int(), truncated)  # the inputs exercise the rounding


def test_bf16_narrowing_cast_needs_a_rounding_mode(dll: ctypes.CDLL) -> None:
    name, shape, params = RMS
    _, _, error = _run(dll, "hnone", name, shape, make_tiling(SUITE[name], shape, params, "ascend910b", "bf16"),
                       "ascend910b", "bf16")
    assert error is not None and "CAST_NONE is the exact widening mode" in error
