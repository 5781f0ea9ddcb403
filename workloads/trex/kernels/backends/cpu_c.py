"""cpu-c backend: C templates specialised by #defines, built with gcc -O3 -march=native -fopenmp, loaded via cffi.

Shared objects are cached by the hash of the full rendered source plus the compiler flags, under
``cache_dir`` (default: $TREX_KERNEL_CACHE or ~/.cache/trex/kernels). Every kernel exports the one
signature ``void trex_kernel(void **buffers, const int64_t *dims, const double *scalars)``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
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
from trex.kernels.machine import measure_cached
from trex.kernels.suite.base import KernelSpec, torch_dtype

if TYPE_CHECKING:
    import torch

CFLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared", "-std=gnu11")
CDEF = "void trex_kernel(void **p, const int64_t *d, const double *s);"

_TEMPLATES: dict[str, tuple[str, dict[str, str]]] = {
    "rmsnorm_fwd": ("rmsnorm_fwd.c", {}), "rmsnorm_bwd": ("rmsnorm_bwd.c", {}),
    "swiglu_clamp_fwd": ("swiglu_clamp_fwd.c", {}), "swiglu_clamp_bwd": ("swiglu_clamp_bwd.c", {}),
    "rope_fwd": ("rope.c", {"SIGN": "1.0f"}), "rope_inv": ("rope.c", {"SIGN": "(-1.0f)"}),
    "router_topk": ("router_topk.c", {}), "grouped_gemm": ("grouped_gemm.c", {}),
    "cross_entropy": ("cross_entropy.c", {}), "kl_div": ("kl_div.c", {}), "mhc_pre": ("mhc_pre.c", {}),
}

_VEC = (0, 8, 16, 32, 64)  # simdlen above the 16-lane register width = several independent accumulators
_UNROLL = (1, 2, 4, 8)
_CHUNK = (1, 4, 16, 64)


def default_cache_dir() -> Path:
    """$TREX_KERNEL_CACHE, else ~/.cache/trex/kernels."""
    env = os.environ.get("TREX_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "trex" / "kernels"


def _template(name: str) -> str:
    return resources.files("trex.kernels.backends").joinpath("cpu_c_templates", name).read_text(encoding="utf-8")


def thread_choices(cores: int) -> tuple[int, ...]:
    """1, powers of two below ``cores``, and ``cores`` itself."""
    vals = {1, cores}
    t = 2
    while t < cores:
        vals.add(t)
        t *= 2
    return tuple(sorted(vals))


class CpuCompiled(Compiled):
    """A loaded shared object for one variant."""

    def __init__(self, spec: KernelSpec, params: Params, dtype: str, digest: str, lib: Any, ffi: Any) -> None:
        self.spec, self.params, self.dtype, self.source_hash = spec, params, dtype, digest
        self._lib, self._ffi = lib, ffi

    def bind(self, inputs: Mapping[str, torch.Tensor], outputs: Mapping[str, torch.Tensor],
             shape: Mapping[str, int]) -> Callable[[], None]:
        ffi, spec = self._ffi, self.spec
        bufs = []
        for b in (*spec.inputs, *spec.outputs):
            t = inputs[b.name] if b in spec.inputs else outputs[b.name]
            want = b.shape(shape)
            if tuple(t.shape) != want or t.dtype != torch_dtype(b.role, self.dtype) or not t.is_contiguous():
                raise ValueError(f"buffer {b.name}: expected contiguous {want} {torch_dtype(b.role, self.dtype)}, "
                                 f"got {tuple(t.shape)} {t.dtype}")
            bufs.append(t)
        ptrs = ffi.new("void *[]", [ffi.cast("void *", t.data_ptr()) for t in bufs])
        dims = ffi.new("int64_t[]", list(spec.dims(shape)))
        scal = ffi.new("double[]", [float(v) for v in spec.scalars.values()] or [0.0])
        fn = self._lib.trex_kernel
        keep = (bufs, ptrs, dims, scal)

        def launch() -> None:
            fn(keep[1], keep[2], keep[3])
        return launch


class CpuCBackend(Backend):
    """gcc + OpenMP kernels on the host CPU."""

    name = "cpu-c"

    def __init__(self, cache_dir: str | Path | None = None, facts: DeviceFacts | None = None,
                 cores: int | None = None) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.cores = cores or os.cpu_count() or 1
        self._facts = facts
        self._loaded: dict[str, CpuCompiled] = {}
        self._lock = threading.Lock()

    def supports(self, spec: KernelSpec, dtype: str) -> bool:
        return spec.name in _TEMPLATES and dtype in spec.dtypes

    def param_space(self, spec: KernelSpec, shape: Mapping[str, int]) -> ParamSpace:
        th = thread_choices(self.cores)
        base: ParamSpace = {"THREADS": th, "VEC": _VEC, "UNROLL": _UNROLL}
        k = spec.kclass
        if k == "gemm":
            return {**base, "UNROLL": (1, 4), "MB": (4, 8, 16, 32), "NB": (16, 32, 64, 128, 256),
                    "KB": (32, 64, 128, 256, 512), "ORDER": (0, 1, 2, 3)}
        base["CHUNK"] = _CHUNK
        if k == "norm":
            return {**base, "ACC_DOUBLE": (0, 1)}
        if k == "elementwise":
            return {**base, "EXP_POLY": (0, 1)}
        if k == "routing":
            return {**base, "EXP_POLY": (0, 1), "CHUNK": (1, 16, 64, 256)}
        if k == "loss":
            return {**base, "CHUNK": (1, 4, 16), "EXP_POLY": (0, 1), "FUSED": (0, 1), "ACC_DOUBLE": (0, 1),
                    "BLOCK": (256, 512, 1024, 2048, 4096, 8192)}
        if k == "mixing":
            return {**base, "ACC_DOUBLE": (0, 1), "FUSED": (0, 1)}
        return base

    def default_params(self, spec: KernelSpec, shape: Mapping[str, int]) -> Params:
        plain = {"THREADS": self.cores, "VEC": 0, "UNROLL": 1, "CHUNK": 16, "ACC_DOUBLE": 0, "EXP_POLY": 0,
                 "FUSED": 0, "BLOCK": 2048, "MB": 8, "NB": 64, "KB": 128, "ORDER": 0}
        space = self.param_space(spec, shape)
        return {k: (plain[k] if plain[k] in space[k] else space[k][0]) for k in space}

    def render(self, spec: KernelSpec, params: Mapping[str, int], dtype: str) -> str:
        if not self.supports(spec, dtype):
            raise ValueError(f"cpu-c has no {dtype} variant of {spec.name} (dtypes: {list(spec.dtypes)})")
        fname, extra = _TEMPLATES[spec.name]
        lines = [f"/* trex cpu-c kernel {spec.name} dtype={dtype} */"]
        defaults = {"THREADS": 1, "VEC": 0, "UNROLL": 1, "CHUNK": 1, "ACC_DOUBLE": 0, "EXP_POLY": 0, "FUSED": 0,
                    "BLOCK": 1024, "MB": 8, "NB": 64, "KB": 128, "ORDER": 0}
        merged = {**defaults, **{k: int(v) for k, v in params.items()}}
        lines += [f"#define {k} {v}" for k, v in sorted(merged.items())]
        lines.append(f"#define DTYPE_BF16 {1 if dtype == 'bf16' else 0}")
        lines += [f"#define {k} {v}" for k, v in extra.items()]
        return "\n".join(lines) + "\n" + _template("common.h") + "\n" + _template(fname)

    def compile(self, spec: KernelSpec, params: Mapping[str, int], dtype: str) -> CpuCompiled:
        src = self.render(spec, params, dtype)
        digest = source_hash(src + " ".join(CFLAGS))
        with self._lock:
            if digest in self._loaded:
                return self._loaded[digest]
        so = self.build(src, digest)
        import cffi

        ffi = cffi.FFI()
        ffi.cdef(CDEF)
        lib = ffi.dlopen(str(so))
        comp = CpuCompiled(spec, dict(params), dtype, digest, lib, ffi)
        with self._lock:
            self._loaded[digest] = comp
        return comp

    def build(self, src: str, digest: str) -> Path:
        """Compile ``src`` to <cache>/<digest>.so unless present (atomic rename, safe across processes)."""
        so = self.cache_dir / f"{digest}.so"
        if so.exists():
            return so
        gcc = shutil.which(os.environ.get("CC", "gcc"))
        if gcc is None:
            raise BackendUnavailable("cpu-c needs gcc on PATH (or $CC); none found")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.cache_dir) as tmp:
            c = Path(tmp) / f"{digest}.c"
            c.write_text(src, encoding="utf-8")
            out = Path(tmp) / f"{digest}.so"
            proc = subprocess.run([gcc, *CFLAGS, str(c), "-o", str(out), "-lm"], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"gcc failed for {digest}:\n{proc.stderr[-4000:]}")
            (self.cache_dir / f"{digest}.c").write_text(src, encoding="utf-8")
            os.replace(out, so)
        return so

    def facts(self) -> DeviceFacts:
        if self._facts is None:
            self._facts = measure_cached(self.cache_dir, backend=self)
        return self._facts
