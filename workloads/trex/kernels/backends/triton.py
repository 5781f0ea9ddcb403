"""cuda-triton backend: Triton kernels with tunable tiles (BLOCK; MB/NB/KB for the grouped GEMM), num_warps
(WARPS) and num_stages (STAGES).

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
from trex.kernels.roofline import classify
from trex.kernels.suite.base import KernelSpec, elem_bytes
from trex.kernels.tiling import LEVEL, Group, TilingModel, stage_time

if TYPE_CHECKING:
    import torch

TRITON_KERNELS: tuple[str, ...] = (
    "rmsnorm_fwd", "swiglu_clamp_fwd", "swiglu_clamp_bwd", "rope_fwd", "rope_inv", "cross_entropy", "kl_div",
    "router_topk", "grouped_gemm", "mhc_pre",
)
_FN = {"rmsnorm_fwd": "rmsnorm_fwd_kernel", "swiglu_clamp_fwd": "swiglu_fwd_kernel",
       "swiglu_clamp_bwd": "swiglu_bwd_kernel", "rope_fwd": "rope_kernel", "rope_inv": "rope_kernel",
       "cross_entropy": "cross_entropy_kernel", "kl_div": "kl_div_kernel", "router_topk": "router_topk_kernel",
       "grouped_gemm": "grouped_gemm_kernel", "mhc_pre": "mhc_pre_kernel"}
_WARPS: tuple[int, ...] = (1, 2, 4, 8, 16)
_STAGES: tuple[int, ...] = (1, 2, 3)
LOOP_S = 2e-8
"""Seconds charged per loop iteration of one program (issue and address arithmetic of one slice)."""

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

        k, s, n, p = self._kernel, self.spec.scalars, self.spec.name, self.params
        i, o = inputs, outputs
        blk = int(p.get("BLOCK", 0))
        const: dict[str, int] = {"BLOCK": blk} if blk else {}
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
        elif n == "kl_div":
            args, grid = (i["p_logits"], i["q_logits"], o["kl"], shape["vocab"]), (shape["rows"],)
        elif n == "router_topk":
            rule = self.spec.dims_problem
            why = rule(shape) if rule is not None else None
            if why:
                raise ValueError(f"dims.{why}")
            args = (i["logits"], i["bias"], o["idx"], o["weights"], shape["tokens"], shape["experts"])
            const |= {"K": shape["k"], "SCORE": shape["score"], "EP": pow2(shape["experts"]), "KP": pow2(shape["k"])}
            grid = (triton.cdiv(shape["tokens"], blk),)
        elif n == "grouped_gemm":
            args = (i["x"], i["w"], i["offsets"], o["y"], shape["hidden"], shape["out"])
            const |= {"MB": int(p["MB"]), "NB": int(p["NB"]), "KB": int(p["KB"])}
            grid = (triton.cdiv(shape["out"], int(p["NB"])), shape["experts"])
        else:
            args = (i["x"], i["gamma"], i["w"], o["h"], shape["streams"] * shape["hidden"], shape["iters"],
                    float(s["eps"]))
            const |= {"N": shape["streams"], "NNP": pow2(shape["streams"] ** 2)}
            grid = (shape["tokens"],)
        opts = {**const, "num_warps": int(p["WARPS"]), "num_stages": int(p.get("STAGES", 1))}
        return _launcher(k, grid, args, opts)


def pow2(n: int) -> int:
    """Smallest power of two >= n, at least 2 (a tl.arange length must be a power of two)."""
    return max(2, 1 << max(0, int(n) - 1).bit_length())


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
        """BLOCK: the slice a program walks (features, vocabulary, elements) or, for the router, the tokens
        per program; MB/NB/KB: the GEMM's row, column and depth tiles; WARPS/STAGES: num_warps/num_stages
        (the router has no loop to pipeline, so no STAGES)."""
        if spec.name == "grouped_gemm":
            return {"MB": (16, 32, 64, 128), "NB": (16, 32, 64, 128), "KB": (16, 32, 64), "WARPS": (1, 2, 4, 8),
                    "STAGES": _STAGES}
        if spec.name == "router_topk":
            return {"BLOCK": (2, 4, 8, 16, 32, 64, 128), "WARPS": (1, 2, 4, 8)}
        if spec.name == "mhc_pre":
            return {"BLOCK": (32, 64, 128, 256, 512, 1024), "WARPS": (1, 2, 4, 8), "STAGES": _STAGES}
        return {"BLOCK": (64, 128, 256, 512, 1024, 2048, 4096), "WARPS": _WARPS, "STAGES": _STAGES}

    def default_params(self, spec: KernelSpec, shape: Mapping[str, int]) -> Params:
        if spec.name == "grouped_gemm":
            return {"MB": 32, "NB": 64, "KB": 32, "WARPS": 4, "STAGES": 2}
        if spec.name == "router_topk":
            return {"BLOCK": 16, "WARPS": 4}
        if spec.name == "mhc_pre":
            return {"BLOCK": 256, "WARPS": 4, "STAGES": 2}
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
        """Shared-memory MILP: STAGES copies of each program's slices within SMEM; roofline terms scaled by the
        occupancy of a program's tile over 32 x WARPS lanes, pipelined across stages (one stage exposes the
        smaller term, more stages hide it), per-iteration loop cost and one launch. The MoE kernels get
        their own terms (``moe_groups``)."""

        space = self.param_space(spec, shape)
        e = elem_bytes(dtype)
        roof = classify(spec, shape, dtype, facts)
        cap = float(capacity if capacity is not None else self.tile_capacity(facts))
        overlap = {1: 0.25, 2: 0.05, 3: 0.0}
        if spec.name in ("router_topk", "grouped_gemm", "mhc_pre"):
            groups = moe_groups(spec, shape, e, roof.t_compute, roof.t_memory, facts, space)
            buffers = "STAGES" if "STAGES" in space else None
            return TilingModel(space=space, levels=(("SMEM", cap),), groups=groups,
                               overlap=overlap if buffers else {1: 0.25}, buffers=buffers, launch_s=4e-6)

        pairs = [(b, w) for b in space["BLOCK"] for w in space["WARPS"]]
        streams = len(spec.inputs) + len(spec.outputs)
        groups = (Group(("BLOCK", "WARPS"), compute={(b, w): roof.t_compute / lane_eff(b, w) for b, w in pairs},
                        memory={(b, w): roof.t_memory / lane_eff(b, w) for b, w in pairs}),
                  Group(("BLOCK", "STAGES"), footprint={(b, st): float(st * b * e * streams)
                                                        for b in space["BLOCK"] for st in space["STAGES"]}),
                  Group(("BLOCK",), overhead={(b,): max(1, -(-shape.get(spec.tile_dim, 1) // b)) * LOOP_S
                                              for b in space["BLOCK"]}))
        return TilingModel(space=space, levels=(("SMEM", cap),), groups=groups, overlap=overlap,
                           buffers="STAGES", launch_s=4e-6)

    def predict(self, spec: KernelSpec, shape: Mapping[str, int], dtype: str, params: Mapping[str, int],
                facts: DeviceFacts) -> float:
        """Roofline time plus launch, per-slice loop overhead and an occupancy penalty for odd warp counts;
        the MoE kernels use their tiling model's terms (whether or not the stage fits)."""

        if spec.name in ("router_topk", "grouped_gemm", "mhc_pre"):

            return stage_time(self.tiling_model(spec, shape, dtype, facts), {**params, LEVEL: 0})
        roof = classify(spec, shape, dtype, facts)
        blk, warps = int(params["BLOCK"]), int(params["WARPS"])
        slices = max(1, -(-shape.get(spec.tile_dim, 1) // blk))
        return roof.t_bound / lane_eff(blk, warps) + 4e-6 + slices * LOOP_S \
            + (0.02 * roof.t_bound if params["STAGES"] == 1 else 0.0)


def lane_eff(elems: float, warps: int, lo: float = 2.0, hi: float = 16.0) -> float:
    """Occupancy factor of a program holding ``elems`` values over 32 x ``warps`` lanes: 1 when each lane
    holds between ``lo`` and ``hi`` (enough to hide latency, few enough to stay in registers), else 0.6."""
    return 1.0 if lo <= elems / (32.0 * warps) <= hi else 0.6


def moe_groups(spec: KernelSpec, shape: Mapping[str, int], e: int, t_compute: float, t_memory: float,
               facts: DeviceFacts, space: ParamSpace) -> tuple[Group, ...]:
    """Cost groups of the router, grouped-GEMM and mHC Triton kernels. Programs run ``facts.cores`` at a time
    (waves); loop cost is iterations per program times waves."""

    cores = max(1, facts.cores)

    def waves(programs: int) -> int:
        return -(-max(1, programs) // cores)

    w_all = space["WARPS"]
    if spec.name == "router_topk":
        t, ep = shape["tokens"], pow2(shape["experts"])
        bw = [(b, w) for b in space["BLOCK"] for w in w_all]
        eff = {(b, w): lane_eff(b * ep, w, 2.0, 32.0) for b, w in bw}
        return (Group(("BLOCK", "WARPS"), compute={c: t_compute / eff[c] for c in bw},
                      memory={c: t_memory / eff[c] for c in bw}),
                # logits, scores and selection keys of the BLOCK x EP tile held on chip
                Group(("BLOCK",), footprint={(b,): 3.0 * 4 * b * ep for b in space["BLOCK"]},
                      overhead={(b,): waves(-(-t // b)) * shape["k"] * LOOP_S for b in space["BLOCK"]}))
    if spec.name == "grouped_gemm":
        t, ex, h, o = shape["tokens"], shape["experts"], shape["hidden"], shape["out"]
        mnw = [(m, n, w) for m in space["MB"] for n in space["NB"] for w in w_all]
        # each expert's rows round up to whole MB tiles (half a tile wasted on average)
        rows = {m: t + ex * (m - 1) / 2.0 for m in space["MB"]}
        re_bw = facts.bandwidth_for(float(ex * h * o * 4))
        return (Group(("MB", "NB", "WARPS"), compute={
                    (m, n, w): t_compute * rows[m] / t / lane_eff(m * n, w, 4.0, 64.0) for m, n, w in mnw}),
                # beyond the compulsory bytes: x re-read per column tile, W re-read per row tile
                Group(("NB",), memory={(n,): t_memory + 4.0 * t * h * (-(-o // n) - 1) / re_bw for n in space["NB"]}),
                Group(("MB",), memory={(m,): 4.0 * h * o * max(0.0, rows[m] / m - ex) / re_bw for m in space["MB"]}),
                Group(("MB", "NB", "KB", "STAGES"), footprint={
                    (m, n, k, st): float(st * (m * k + k * n) * 4) for m in space["MB"] for n in space["NB"]
                    for k in space["KB"] for st in space["STAGES"]}),
                Group(("MB", "NB", "KB"), overhead={
                    (m, n, k): waves(-(-o // n) * ex) * (rows[m] / ex / m + 1) * -(-h // k) * LOOP_S
                    for m in space["MB"] for n in space["NB"] for k in space["KB"]}))
    f, nnp = shape["streams"] * shape["hidden"], pow2(shape["streams"] ** 2)
    bw = [(b, w) for b in space["BLOCK"] for w in w_all]
    eff = {(b, w): lane_eff(b * nnp, w, 2.0, 64.0) for b, w in bw}
    return (Group(("BLOCK", "WARPS"), compute={c: t_compute / eff[c] for c in bw},
                  memory={c: t_memory / eff[c] for c in bw}),
            # x, gamma and the BLOCK x NNP slice of w per stage
            Group(("BLOCK", "STAGES"), footprint={(b, st): float(st * b * (2 + nnp) * 4)
                                                  for b in space["BLOCK"] for st in space["STAGES"]}),
            Group(("BLOCK",), overhead={(b,): waves(shape["tokens"]) * 2 * -(-f // b) * LOOP_S
                                        for b in space["BLOCK"]}))


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
