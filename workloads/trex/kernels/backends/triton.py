"""cuda-triton backend: Triton kernels with tunable BLOCK, num_warps (WARPS) and num_stages (STAGES).

Timing needs a CUDA device. Correctness also runs without one under TRITON_INTERPRET=1 (set before
triton is first imported), where the interpreter executes the kernels on CPU torch tensors.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
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
from trex.kernels.suite.base import KernelSpec

if TYPE_CHECKING:
    import torch

    from trex.kernels.tiling import TilingModel

TRITON_KERNELS: tuple[str, ...] = (
    "rmsnorm_fwd", "swiglu_clamp_fwd", "swiglu_clamp_bwd", "rope_fwd", "rope_inv", "cross_entropy", "kl_div",
)
_FN = {"rmsnorm_fwd": "rmsnorm_fwd_kernel", "swiglu_clamp_fwd": "swiglu_fwd_kernel",
       "swiglu_clamp_bwd": "swiglu_bwd_kernel", "rope_fwd": "rope_kernel", "rope_inv": "rope_kernel",
       "cross_entropy": "cross_entropy_kernel", "kl_div": "kl_div_kernel"}

# Per-SKU figures (dense fp32 non-tensor-core FLOP/s, HBM B/s, L2 bytes) from NVIDIA's datasheets, used when
# measuring is not wanted; the measured path is the default.
CATALOG: dict[str, tuple[float, float, int]] = {
    "H200": (67e12, 4.8e12, 50 << 20), "H100": (67e12, 3.35e12, 50 << 20), "A100": (19.5e12, 2.0e12, 40 << 20),
}


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _module() -> Any:
    from trex.kernels.backends import triton_kernels

    return triton_kernels


class TritonCompiled(Compiled):
    """A Triton kernel plus its launch configuration."""

    def __init__(self, spec: KernelSpec, params: Params, dtype: str, digest: str) -> None:
        self.spec, self.params, self.dtype, self.source_hash = spec, params, dtype, digest
        self._kernel = getattr(_module(), _FN[spec.name])

    def bind(self, inputs: Mapping[str, torch.Tensor], outputs: Mapping[str, torch.Tensor],
             shape: Mapping[str, int]) -> Callable[[], None]:
        import triton

        k, s, n = self._kernel, self.spec.scalars, self.spec.name
        blk = int(self.params["BLOCK"])
        opts = {"BLOCK": blk, "num_warps": int(self.params["WARPS"]), "num_stages": int(self.params["STAGES"])}
        i, o = inputs, outputs
        if n == "rmsnorm_fwd":
            args: tuple[Any, ...] = (i["x"], i["w"], o["y"], o["rstd"], shape["cols"], float(s["eps"]))
            grid: tuple[int, ...] = (shape["rows"],)
        elif n == "swiglu_clamp_fwd":
            numel = shape["rows"] * shape["cols"]
            args, grid = (i["g"], i["u"], o["y"], numel, float(s["limit"])), (triton.cdiv(numel, blk),)
        elif n == "swiglu_clamp_bwd":
            numel = shape["rows"] * shape["cols"]
            args = (i["dy"], i["g"], i["u"], o["dg"], o["du"], numel, float(s["limit"]))
            grid = (triton.cdiv(numel, blk),)
        elif n in ("rope_fwd", "rope_inv"):
            sign = 1.0 if n == "rope_fwd" else -1.0
            args = (i["x"], i["cos"], i["sin"], o["y"], shape["heads"], shape["dim"], sign)
            grid = (shape["tokens"] * shape["heads"],)
        elif n == "cross_entropy":
            args, grid = (i["logits"], i["target"], o["loss"], shape["vocab"]), (shape["rows"],)
        else:
            args, grid = (i["p_logits"], i["q_logits"], o["kl"], shape["vocab"]), (shape["rows"],)
        return _launcher(k, grid, args, opts)


def _launcher(k: Any, grid: tuple[int, ...], args: tuple[Any, ...], opts: dict[str, int]) -> Callable[[], None]:
    """Zero-argument launch (the closure holds the tensors alive)."""
    def launch() -> None:
        k[grid](*args, **opts)
    return launch


class TritonBackend(Backend):
    """Triton on CUDA (or the Triton interpreter on CPU tensors for correctness only)."""

    name = "cuda-triton"

    def __init__(self, facts: DeviceFacts | None = None) -> None:
        self._facts = facts

    def supports(self, spec: KernelSpec, dtype: str) -> bool:
        return spec.name in TRITON_KERNELS and dtype in spec.dtypes

    def param_space(self, spec: KernelSpec, shape: Mapping[str, int]) -> ParamSpace:
        return {"BLOCK": (64, 128, 256, 512, 1024, 2048, 4096), "WARPS": (1, 2, 4, 8, 16), "STAGES": (1, 2, 3)}

    def default_params(self, spec: KernelSpec, shape: Mapping[str, int]) -> Params:
        return {"BLOCK": 1024, "WARPS": 4, "STAGES": 2}

    def render(self, spec: KernelSpec, params: Mapping[str, int], dtype: str) -> str:
        if not self.supports(spec, dtype):
            raise ValueError(f"cuda-triton has no {dtype} variant of {spec.name}")
        fn = getattr(_module(), _FN[spec.name])
        src = inspect.getsource(getattr(fn, "fn", fn))
        head = f"# trex cuda-triton {spec.name} dtype={dtype} " + " ".join(f"{k}={v}" for k, v in sorted(params.items()))
        return head + "\n" + src

    def compile(self, spec: KernelSpec, params: Mapping[str, int], dtype: str) -> TritonCompiled:
        self._require_device()
        src = self.render(spec, params, dtype)
        return TritonCompiled(spec, dict(params), dtype, source_hash(src))

    def _require_device(self) -> None:
        import torch

        if not (torch.cuda.is_available() or interpreting()):
            raise BackendUnavailable("cuda-triton needs a CUDA device (or TRITON_INTERPRET=1 for correctness-only runs)")

    def device(self) -> str:
        import torch

        return "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"

    def synchronize(self) -> None:
        import torch

        if torch.cuda.is_available() and not interpreting():
            torch.cuda.synchronize()

    def facts(self) -> DeviceFacts:
        if self._facts is not None:
            return self._facts
        import torch

        if not torch.cuda.is_available() or interpreting():
            raise BackendUnavailable("cuda-triton device facts need a CUDA device; the interpreter is not timed")
        self._facts = measure_cuda()
        return self._facts

    def tile_capacity(self, facts: DeviceFacts) -> float:
        return float(facts.caches.get("SMEM", 228 << 10))

    def tiling_model(self, spec: KernelSpec, shape: Mapping[str, int], dtype: str, facts: DeviceFacts,
                     capacity: float | None = None) -> TilingModel:
        """Shared-memory MILP: STAGES copies of a BLOCK-wide slice of every argument within SMEM; roofline terms scaled by the
        occupancy of BLOCK over 32 x WARPS lanes, pipelined across stages (one stage exposes the smaller term,
        more stages hide it), per-slice loop cost and one launch."""
        from trex.kernels.roofline import classify
        from trex.kernels.suite.base import elem_bytes
        from trex.kernels.tiling import Group, TilingModel

        space = self.param_space(spec, shape)
        e = elem_bytes(dtype)
        roof = classify(spec, shape, dtype, facts)
        cap = float(capacity if capacity is not None else self.tile_capacity(facts))

        def eff(blk: int, warps: int) -> float:
            return 1.0 if 2 <= blk / (32.0 * warps) <= 16 else 0.6
        pairs = [(b, w) for b in space["BLOCK"] for w in space["WARPS"]]
        streams = len(spec.inputs) + len(spec.outputs)
        groups = (Group(("BLOCK", "WARPS"), compute={(b, w): roof.t_compute / eff(b, w) for b, w in pairs},
                        memory={(b, w): roof.t_memory / eff(b, w) for b, w in pairs}),
                  Group(("BLOCK", "STAGES"), footprint={(b, st): float(st * b * e * streams)
                                                        for b in space["BLOCK"] for st in space["STAGES"]}),
                  Group(("BLOCK",), overhead={(b,): max(1, -(-shape.get(spec.tile_dim, 1) // b)) * 2e-8
                                              for b in space["BLOCK"]}))
        return TilingModel(space=space, levels=(("SMEM", cap),), groups=groups, overlap={1: 0.25, 2: 0.05, 3: 0.0},
                           buffers="STAGES", launch_s=4e-6)

    def predict(self, spec: KernelSpec, shape: Mapping[str, int], dtype: str, params: Mapping[str, int],
                facts: DeviceFacts) -> float:
        """Roofline time plus launch, per-slice loop overhead and an occupancy penalty for odd warp counts."""
        from trex.kernels.roofline import classify

        roof = classify(spec, shape, dtype, facts)
        blk, warps = int(params["BLOCK"]), int(params["WARPS"])
        per_thread = blk / (32.0 * warps)
        eff = 1.0 if 2 <= per_thread <= 16 else 0.6
        slices = max(1, -(-shape.get(spec.tile_dim, 1) // blk))
        return roof.t_bound / eff + 4e-6 + slices * 2e-8 + (0.02 * roof.t_bound if params["STAGES"] == 1 else 0.0)


def measure_cuda() -> DeviceFacts:
    """Copy bandwidth, fp32 matmul peak (TF32 off), L2 and shared-memory sizes of GPU 0."""
    import time

    import torch

    props = torch.cuda.get_device_properties(0)
    n = 64 << 20
    a = torch.empty(n, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    bw = 2 * 4 * n * 10 / (time.perf_counter() - t0)
    torch.backends.cuda.matmul.allow_tf32 = False
    m = torch.randn(4096, 4096, device="cuda")
    m @ m
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        m @ m
    torch.cuda.synchronize()
    peak = 2 * 4096 ** 3 * 5 / (time.perf_counter() - t0)
    smem = int(getattr(props, "shared_memory_per_block_optin", 0) or 228 << 10)
    l2 = int(getattr(props, "L2_cache_size", 0) or 50 << 20)
    return DeviceFacts(name=f"cuda:{props.name}", peak_flops=peak, bandwidth=bw, caches={"SMEM": smem, "L2": l2},
                       level_bandwidth={}, cores=int(props.multi_processor_count), source="measured")
