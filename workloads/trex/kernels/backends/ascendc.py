"""npu-ascendc backend: AscendC kernel templates plus host tiling structs (the same split as cpu-c:
templates specialised by rendered constants, a tiling decided on the host).

Unified Buffer (UB) per AI core, as shipped in CANN's platform_config/<SoC>.ini (`ub_size`):
Ascend910B (Atlas A2): 196608 B = 192 KiB; Ascend910_93 (910C, two 910B-class dies): 192 KiB per core;
Ascend310P: 262144 B = 256 KiB. UB addresses must be 32-byte aligned (CANN Ascend C API reference,
"General Restrictions", Table 2). Double buffering (BUFFER_NUM = 2) allocates every queue twice, so it
halves the tile that fits. Core counts are the vector-core counts of those ini files (`vector_core_cnt`
/ `ai_core_cnt`); check them against the installed CANN for other SKUs.

Element types: fp32 for every template; bf16 for rmsnorm_fwd and swiglu_clamp_fwd (one template per kernel,
T_IN = bfloat16_t: bf16 in GM and in the in/out queues, AscendC::Cast to fp32 work tiles with CAST_NONE, fp32
arithmetic, Cast back with CAST_RINT before the copy out; RMSNorm's rstd stays fp32). RoPE is fp32 only.

Compiling and running needs CANN (ccec and ASCEND_HOME_PATH) and torch_npu; without them compile()
raises BackendUnavailable. What has NOT run: no template (fp32 or bf16) has been built by CANN's ccec or run on
an NPU. They are compiled with g++ and run core by core against a CPU stand-in of the Ascend C API
(tests/unit/kernels/ascendc_cpu/kernel_operator.h), which checks results against float64 references and the
API rules it models (UB size and alignment, DataCopy blocks, ReduceSum work size, V->S flags, scalar-cache
cleaning), not ccec's acceptance of the code, the real Cast instruction or timing.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trex.kernels.backends.base import (
    Backend,
    BackendUnavailable,
    Compiled,
    DeviceFacts,
    Params,
    ParamSpace,
    source_hash,
)
from trex.kernels.backends.cpu_c import default_cache_dir
from trex.kernels.suite.base import KernelSpec
from trex.kernels.tiling import Combo, Group, Solver, TilingModel, plan

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SocSpec:
    """On-chip figures of one Ascend SoC used by the tiling model."""

    ub_bytes: int
    cores: int
    hbm_bandwidth: float
    vector_fp32_flops: float


SOCS: dict[str, SocSpec] = {
    # nominal bandwidths: 910B HBM2e ~1.6 TB/s; 310P LPDDR4X 204.8 GB/s (vendor datasheets)
    "ascend910b": SocSpec(192 << 10, 40, 1.6e12, 40 * 2 * 64 * 1.8e9),
    "ascend910c": SocSpec(192 << 10, 40, 1.6e12, 40 * 2 * 64 * 1.8e9),
    "ascend310p": SocSpec(256 << 10, 8, 204.8e9, 8 * 2 * 64 * 1.08e9),
}
UB_ALIGN = 32
CACHE_LINE = 64
"""Bytes of one scalar data-cache line: rows a core writes through the scalar unit never share one."""
ASCEND_KERNELS: dict[str, tuple[str, str]] = {
    "rmsnorm_fwd": ("rmsnorm_fwd.cpp", "trex_rmsnorm_fwd"),
    "swiglu_clamp_fwd": ("swiglu_clamp_fwd.cpp", "trex_swiglu_clamp_fwd"),
    "rope_fwd": ("rope.cpp", "trex_rope_fwd"),
    "rope_inv": ("rope.cpp", "trex_rope_inv"),
}
ASCEND_DTYPES: tuple[str, ...] = ("fp32", "bf16")
"""Element types some template is written for (see ASCEND_KERNEL_DTYPES for which kernel has which)."""
ASCEND_KERNEL_DTYPES: dict[str, tuple[str, ...]] = {
    "rmsnorm_fwd": ("fp32", "bf16"), "swiglu_clamp_fwd": ("fp32", "bf16"), "rope_fwd": ("fp32",), "rope_inv": ("fp32",),
}
"""Element types each template is written for (bf16: bf16 queues, fp32 work tiles and arithmetic)."""
_T_IN = {"fp32": "float", "bf16": "bfloat16_t"}
# queue slots per buffer (x BUFFER_NUM, TILE_LEN elements of the dtype each) and single fp32 scratch tiles
# (TILE_LEN fp32 each) per dtype: bf16 adds the fp32 tiles its inputs are cast into
_QUEUE_TILES: dict[str, tuple[int, dict[str, int]]] = {
    "rmsnorm_fwd": (3, {"fp32": 1, "bf16": 2}), "swiglu_clamp_fwd": (3, {"fp32": 1, "bf16": 3}),
    "rope_fwd": (6, {"fp32": 1}), "rope_inv": (6, {"fp32": 1}),
}
_SCALAR_WRITERS = ("rmsnorm_fwd",)
"""Kernels that write GM through the scalar unit (GlobalTensor::SetValue + DataCacheCleanAndInvalid)."""


@dataclass(frozen=True)
class AscendTiling:
    """Host tiling for one launch (mirrors struct TrexTiling in tiling.h) plus the launch's block_dim."""

    rows: int
    cols: int
    rows_per_core: int
    tile_len: int
    tile_num: int
    last_tile_len: int
    scalar: float
    block_dim: int
    ub_bytes: int

    def pack(self) -> bytes:
        """Binary layout of struct TrexTiling (six uint32 then one float, little endian)."""
        return struct.pack("<6If", self.rows, self.cols, self.rows_per_core, self.tile_len, self.tile_num,
                           self.last_tile_len, self.scalar)


def reduce_work_len(count: int) -> int:
    """fp32 elements ReduceSum's work buffer needs for ``count`` elements (CANN Ascend C API, ReduceSum): one
    partial sum per 64-element repeat, rounded up to whole 32-byte blocks (8 fp32)."""
    repeats = max(1, -(-count // 64))
    return -(-repeats // 8) * 8


def elem_size(dtype: str) -> int:
    """Bytes of one GM / queue element of a template dtype; ValueError naming the dtype when unknown."""
    if dtype not in _T_IN:
        raise ValueError(f"dtype {dtype!r}: npu-ascendc templates take one of {sorted(_T_IN)}")
    return 2 if dtype == "bf16" else 4


def ub_bytes(kernel: str, params: Mapping[str, int], dtype: str = "fp32") -> int:
    """UB bytes the kernel allocates for these parameters: queues of ``dtype`` elements, fp32 scratch tiles."""
    q, scratch = _QUEUE_TILES[kernel]
    if dtype not in scratch:
        raise ValueError(f"npu-ascendc has no {dtype} template for {kernel}")
    tile = int(params["TILE_LEN"])
    extra = (reduce_work_len(tile) + 16) * 4 if kernel == "rmsnorm_fwd" else 0
    return q * int(params["BUFFER_NUM"]) * tile * elem_size(dtype) + scratch[dtype] * tile * 4 + extra


def _rows_cols(spec: KernelSpec, shape: Mapping[str, int]) -> tuple[int, int, float]:
    if spec.name.startswith("rope"):
        return shape["tokens"] * shape["heads"], shape["dim"] // 2, 1.0 if spec.name == "rope_fwd" else -1.0
    scalar = spec.scalars.get("eps", spec.scalars.get("limit", 0.0))
    return shape["rows"], shape["cols"], float(scalar)


def make_tiling(spec: KernelSpec, shape: Mapping[str, int], params: Mapping[str, int], soc: str,
                dtype: str = "fp32") -> AscendTiling:
    """Host tiling for a problem; ValueError naming the violated rule when it cannot fit or align."""
    if spec.name not in ASCEND_KERNELS:
        raise ValueError(f"npu-ascendc has no template for {spec.name}")
    if dtype not in ASCEND_KERNEL_DTYPES[spec.name]:
        raise ValueError(f"dtype {dtype!r}: npu-ascendc's {spec.name} template takes {list(ASCEND_KERNEL_DTYPES[spec.name])}")
    chip = SOCS[soc]
    tile, bufs, cores = int(params["TILE_LEN"]), int(params["BUFFER_NUM"]), int(params["BLOCK_DIM"])
    esz = elem_size(dtype)
    if (tile * esz) % UB_ALIGN:
        raise ValueError(f"params.TILE_LEN={tile}: tiles must be multiples of {UB_ALIGN} bytes "
                         f"({UB_ALIGN // esz} {dtype})")
    if bufs not in (1, 2):
        raise ValueError(f"params.BUFFER_NUM={bufs}: must be 1 or 2")
    if not 1 <= cores <= chip.cores:
        raise ValueError(f"params.BLOCK_DIM={cores}: {soc} has {chip.cores} vector cores")
    used = ub_bytes(spec.name, params, dtype)
    if used > chip.ub_bytes:
        raise ValueError(f"tiling needs {used} B of UB but {soc} has {chip.ub_bytes} B per core "
                         f"(TILE_LEN={tile}, BUFFER_NUM={bufs}); lower TILE_LEN or use single buffering")
    rows, cols, scalar = _rows_cols(spec, shape)
    if (cols * esz) % UB_ALIGN:
        raise ValueError(f"row length {cols} {dtype} is not 32-byte aligned ({UB_ALIGN // esz} elements); these "
                         "templates copy whole 32 B blocks")
    per_core = -(-rows // cores)
    if spec.name in _SCALAR_WRITERS:  # whole cache lines of the per-row output per core
        line = CACHE_LINE // 4
        per_core = -(-per_core // line) * line
    tile_num = -(-cols // tile)
    last = cols - (tile_num - 1) * tile
    return AscendTiling(rows, cols, per_core, tile, tile_num, last, scalar, -(-rows // per_core), used)


def _template(name: str) -> str:
    return resources.files("trex.kernels.backends").joinpath("ascendc_templates", name).read_text(encoding="utf-8")


def cann_home() -> Path | None:
    """The CANN toolkit root when installed (ASCEND_HOME_PATH / ASCEND_TOOLKIT_HOME, or three levels above
    ccec's bin directory: <home>/{compiler,tools,<arch>-linux}/ccec_compiler/bin/ccec)."""
    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"):
        v = os.environ.get(var)
        if v and Path(v).exists():
            return Path(v)
    ccec = shutil.which("ccec")
    return Path(ccec).absolute().parents[3] if ccec else None


CANN_LAYOUTS = ("compiler", "tools", "aarch64-linux", "x86_64-linux")
"""Directories under the CANN root that have held tikcpp/ and ccec_compiler/ across CANN releases."""


def ascendc_cmake_dir(home: Path) -> Path | None:
    """The directory of CANN's ascendc.cmake (ascendc_library()) under ``home``, whichever layout it ships."""
    candidates = [home / d / "tikcpp" / "ascendc_kernel_cmake" for d in CANN_LAYOUTS]
    candidates.append(home / "ascendc_devkit" / "tikcpp" / "samples" / "cmake")
    return next((c for c in candidates if (c / "ascendc.cmake").is_file()), None)


SOC_VERSIONS = {"ascend910b": "Ascend910B1", "ascend910c": "Ascend910_9391", "ascend310p": "Ascend310P3"}
"""CANN SOC_VERSION each catalog SoC is built for."""


def cmake_lists(entry: str, soc_version: str, home: Path, cmake_dir: Path) -> str:
    """CMakeLists.txt building the kernel ``entry`` into lib<entry>.so with CANN's ascendc_library()."""
    return ("cmake_minimum_required(VERSION 3.16)\nproject(trex_ascendc LANGUAGES CXX)\n"
            f"set(SOC_VERSION {soc_version})\nset(ASCEND_CANN_PACKAGE_PATH {home})\n"
            f"include({cmake_dir}/ascendc.cmake)\n"
            f"ascendc_library({entry} SHARED {entry}.cpp)\n")


def _dcci(soc: str) -> str:
    """DataCacheCleanAndInvalid of one GM cache line: Atlas inference AI cores (310P) take no DcciDst."""
    if soc == "ascend310p":
        return "DataCacheCleanAndInvalid<float, CacheLine::SINGLE_CACHE_LINE>(g)"
    return "DataCacheCleanAndInvalid<float, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(g)"


class AscendCompiled(Compiled):
    """A built kernel library launched through its generated aclrtlaunch_<name> entry point."""

    def __init__(self, spec: KernelSpec, params: Params, dtype: str, digest: str, lib: Any, entry: str, soc: str) -> None:
        self.spec, self.params, self.dtype, self.source_hash = spec, params, dtype, digest
        self._fn = getattr(lib, f"aclrtlaunch_{entry}")
        self._soc = soc

    def bind(self, inputs: Mapping[str, torch.Tensor], outputs: Mapping[str, torch.Tensor],
             shape: Mapping[str, int]) -> Callable[[], None]:
        import torch

        t = make_tiling(self.spec, shape, self.params, self._soc, self.dtype)
        dev = next(iter(inputs.values())).device
        tiling = torch.frombuffer(bytearray(t.pack()), dtype=torch.uint8).to(dev)
        ptrs = [ctypes.c_void_p(inputs[b.name].data_ptr()) for b in self.spec.inputs]
        ptrs += [ctypes.c_void_p(outputs[b.name].data_ptr()) for b in self.spec.outputs]
        extra = [ctypes.c_uint32(shape["heads"])] if self.spec.name.startswith("rope") else []
        stream = ctypes.c_void_p(torch.npu.current_stream().npu_stream)  # type: ignore[attr-defined]
        fn, keep = self._fn, (tiling, inputs, outputs)

        def launch() -> None:
            fn(ctypes.c_uint32(t.block_dim), stream, *ptrs, ctypes.c_void_p(keep[0].data_ptr()), *extra)
        return launch


class AscendCBackend(Backend):
    """AscendC on Ascend NPUs; rendering and tiling work everywhere, building needs CANN."""

    name = "npu-ascendc"

    def __init__(self, soc: str = "ascend910b", cache_dir: str | Path | None = None) -> None:
        if soc not in SOCS:
            raise ValueError(f"soc {soc!r} unknown; expected one of {sorted(SOCS)}")
        self.soc = soc
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir() / "ascendc"

    def supports(self, spec: KernelSpec, dtype: str) -> bool:
        return dtype in ASCEND_KERNEL_DTYPES.get(spec.name, ())

    def param_space(self, spec: KernelSpec, shape: Mapping[str, int]) -> ParamSpace:
        cores = SOCS[self.soc].cores
        return {"TILE_LEN": (256, 512, 1024, 2048, 4096, 8192, 16384), "BUFFER_NUM": (1, 2),
                "BLOCK_DIM": tuple(sorted({1, max(1, cores // 4), max(1, cores // 2), cores}))}

    def default_params(self, spec: KernelSpec, shape: Mapping[str, int]) -> Params:
        return {"TILE_LEN": 1024, "BUFFER_NUM": 2, "BLOCK_DIM": SOCS[self.soc].cores}

    def render(self, spec: KernelSpec, params: Mapping[str, int], dtype: str) -> str:
        if not self.supports(spec, dtype):
            raise ValueError(f"npu-ascendc has no {dtype} template for {spec.name}")
        fname, entry = ASCEND_KERNELS[spec.name]
        tile = int(params["TILE_LEN"])
        head = [f"// trex npu-ascendc {spec.name} soc={self.soc}", f"#define TILE_LEN {tile}",
                f"#define BUFFER_NUM {int(params['BUFFER_NUM'])}", f"#define KERNEL_NAME {entry}",
                f"#define T_IN {_T_IN[dtype]}", f"#define TREX_BF16 {int(dtype == 'bf16')}",
                f"#define RED_WORK_LEN {reduce_work_len(tile)}", f"#define TREX_DCCI(g) {_dcci(self.soc)}"]
        body = _template(fname).replace('#include "tiling.h"', _template("tiling.h"))
        return "\n".join(head) + "\n" + body

    def ub_capacity(self) -> int:
        """UB bytes per AI core of the configured SoC."""
        return SOCS[self.soc].ub_bytes

    def tile_capacity(self, facts: DeviceFacts) -> float:
        return float(self.ub_capacity())

    def facts(self) -> DeviceFacts:
        chip = SOCS[self.soc]
        return DeviceFacts(name=f"npu:{self.soc}", peak_flops=chip.vector_fp32_flops, bandwidth=chip.hbm_bandwidth,
                           caches={"UB": chip.ub_bytes}, level_bandwidth={}, cores=chip.cores, source="catalog")

    def predict(self, spec: KernelSpec, shape: Mapping[str, int], dtype: str, params: Mapping[str, int],
                facts: DeviceFacts) -> float:
        """HBM time over the cores used, plus per-tile issue cost (hidden by double buffering) and launch."""
        rows, cols, _ = _rows_cols(spec, shape)
        cores = int(params["BLOCK_DIM"])
        per_core = -(-rows // cores)
        tiles = per_core * -(-cols // int(params["TILE_LEN"]))
        mem = spec.bytes_moved(shape, elem_size(dtype)) / facts.bandwidth * (facts.cores / max(cores, 1)) ** 0.5
        issue = tiles * (1.5e-6 if int(params["BUFFER_NUM"]) == 1 else 0.6e-6)
        return float(mem + issue + 5e-6)

    def tiling_model(self, spec: KernelSpec, shape: Mapping[str, int], dtype: str, facts: DeviceFacts,
                     capacity: float | None = None) -> TilingModel:
        """UB MILP: queue footprint (BUFFER_NUM copies of every queue tile in ``dtype`` plus fp32 scratch) within
        the UB, tiles of whole 32-byte blocks of ``dtype`` no longer than the padded row, at most one core per row; HBM time over the
        cores used, per-tile issue cost exposed without double buffering (a_1 = 1, a_2 = 0), launch cost."""
        space = self.param_space(spec, shape)
        rows, cols, _ = _rows_cols(spec, shape)
        cap = float(capacity if capacity is not None else self.ub_capacity())
        esz = elem_size(dtype)
        forbid: dict[tuple[str, int], str] = {}
        for t in space["TILE_LEN"]:
            if (t * esz) % UB_ALIGN:
                forbid[("TILE_LEN", t)] = f"TILE_LEN not a multiple of {UB_ALIGN} bytes"
            elif t > max(256, 1 << (cols - 1).bit_length()):
                forbid[("TILE_LEN", t)] = "TILE_LEN longer than the padded row"
        for c in space["BLOCK_DIM"]:
            if c > max(1, rows):
                forbid[("BLOCK_DIM", c)] = "more cores than rows"
        moved, fl = spec.bytes_moved(shape, esz), spec.flops(shape)
        foot: dict[Combo, float] = {(t, b): float(ub_bytes(spec.name, {"TILE_LEN": t, "BUFFER_NUM": b}, dtype))
                for t in space["TILE_LEN"] for b in space["BUFFER_NUM"]}
        issue: dict[Combo, float] = {(t, b, c): -(-rows // c) * -(-cols // t) * (1.5e-6 if b == 1 else 0.6e-6)
                 for t in space["TILE_LEN"] for b in space["BUFFER_NUM"] for c in space["BLOCK_DIM"]}
        per_core: dict[Combo, float] = {(c,): moved / facts.bandwidth * (facts.cores / c) ** 0.5 for c in space["BLOCK_DIM"]}
        compute: dict[Combo, float] = {(c,): fl / (facts.peak_flops * c / facts.cores) for c in space["BLOCK_DIM"]}
        groups = (Group(("TILE_LEN", "BUFFER_NUM"), footprint=foot),
                  Group(("TILE_LEN", "BUFFER_NUM", "BLOCK_DIM"), overhead=issue),
                  Group(("BLOCK_DIM",), memory=per_core, compute=compute))
        return TilingModel(space=space, levels=(("UB", cap),), groups=groups, overlap={1: 1.0, 2: 0.0},
                           buffers="BUFFER_NUM", launch_s=5e-6, forbid=forbid)

    def compile(self, spec: KernelSpec, params: Mapping[str, int], dtype: str) -> AscendCompiled:
        home = cann_home()
        has_ccec = shutil.which("ccec") is not None or (
            home is not None and any((home / d / "ccec_compiler").exists() for d in CANN_LAYOUTS))
        if home is None or not has_ccec:
            raise BackendUnavailable("npu-ascendc needs CANN: set ASCEND_HOME_PATH (or put ccec on PATH); "
                                     "rendering and tiling work without it, compiling and running do not")
        cmake_dir = ascendc_cmake_dir(home)
        if cmake_dir is None:
            raise BackendUnavailable(f"npu-ascendc: no tikcpp/ascendc_kernel_cmake/ascendc.cmake under {home} "
                                     f"({', '.join(CANN_LAYOUTS)} or ascendc_devkit); is the CANN toolkit complete?")
        try:
            import torch_npu  # noqa: F401
        except ImportError as e:
            raise BackendUnavailable("npu-ascendc runs kernels through torch_npu, which is not installed") from e
        src = self.render(spec, params, dtype)
        digest = source_hash(src + self.soc)
        lib_path = self._build(src, digest, ASCEND_KERNELS[spec.name][1], home, cmake_dir)
        return AscendCompiled(spec, dict(params), dtype, digest, ctypes.CDLL(str(lib_path)),
                              ASCEND_KERNELS[spec.name][1], self.soc)

    def _build(self, src: str, digest: str, entry: str, home: Path, cmake_dir: Path) -> Path:
        """ascendc_library() through CANN's CMake module; output cached by source hash."""
        out = self.cache_dir / digest
        lib = out / "build" / "lib" / f"lib{entry}.so"
        if lib.exists():
            return lib
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{entry}.cpp").write_text(src, encoding="utf-8")
        (out / "CMakeLists.txt").write_text(cmake_lists(entry, SOC_VERSIONS[self.soc], home, cmake_dir),
                                            encoding="utf-8")
        for cmd in (["cmake", "-S", str(out), "-B", str(out / "build")], ["cmake", "--build", str(out / "build"), "-j"]):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"AscendC build failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
        found = list((out / "build").rglob(f"lib{entry}.so"))
        if not found:
            raise RuntimeError(f"AscendC build produced no lib{entry}.so under {out / 'build'}")
        return found[0]

    def device(self) -> str:
        try:
            import torch_npu  # noqa: F401
        except ImportError as e:
            raise BackendUnavailable("npu-ascendc runs kernels on an Ascend NPU through torch_npu, which is not "
                                     "installed; rendering and tiling work without it") from e
        return "npu"

    def synchronize(self) -> None:
        import torch

        torch.npu.synchronize()  # type: ignore[attr-defined]


def plan_tiling(spec: KernelSpec, shape: Mapping[str, int], backend: AscendCBackend, k: int = 3,
                solver: Solver = "highs", dtype: str = "fp32") -> list[tuple[Params, AscendTiling, float]]:
    """The k best tilings of the UB MILP (``AscendCBackend.tiling_model``) with their host tiling structs."""
    pl = plan(spec, shape, dtype, backend, backend.facts(), k=k, solver=solver)
    return [(c.params, make_tiling(spec, shape, c.params, backend.soc, dtype), c.predicted) for c in pl.ranked]
