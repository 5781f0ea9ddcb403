"""KernelTuneConfig: what AuraKernel tunes, where, and with which budget; `spec.kernels` of a KernelTuneJob."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from trex.config_base import TrexModel

KERNEL_NAMES: tuple[str, ...] = (
    "rmsnorm_fwd", "rmsnorm_bwd", "swiglu_clamp_fwd", "swiglu_clamp_bwd", "rope_fwd", "rope_inv",
    "router_topk", "grouped_gemm", "cross_entropy", "kl_div", "mhc_pre",
)
KernelName = Literal[
    "rmsnorm_fwd", "rmsnorm_bwd", "swiglu_clamp_fwd", "swiglu_clamp_bwd", "rope_fwd", "rope_inv",
    "router_topk", "grouped_gemm", "cross_entropy", "kl_div", "mhc_pre",
]
Backend = Literal["cpu-c", "cuda-triton", "npu-ascendc"]
DType = Literal["fp32", "bf16"]
DEFAULT_DTYPES: tuple[DType, ...] = ("fp32",)


class KernelShape(TrexModel):
    """One problem shape for one kernel, as named dimensions (e.g. rows, cols, experts)."""

    kernel: KernelName
    """Kernel the shape applies to."""
    dims: dict[str, int]
    """Named dimensions; each positive and at most 2^31."""

    @model_validator(mode="after")
    def _positive(self) -> KernelShape:
        for k, v in self.dims.items():
            if not 0 < v <= 2**31:
                raise ValueError(f"dims.{k}: must be in [1, 2^31], got {v}")
        return self


class ShapesFrom(TrexModel):
    """The run whose shapes a KernelTuneJob tunes."""

    train_job: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    """Name of a TrainJob in the same namespace: its model, micro-batch, sequence lengths and tp/ep/etp layout give
    the shape classes (one rank's local shard shapes) each kernel is tuned at."""


class BudgetConfig(TrexModel):
    """Search budget; whichever runs out first ends the search."""

    trials: int = Field(default=200, gt=0, le=1_000_000)
    """Candidates compiled, checked and profiled in total."""
    seconds: float = Field(default=1800.0, gt=0, le=7 * 86400)
    """Wall-clock budget (s)."""
    samples: int = Field(default=30, ge=30, le=10_000)
    """Timing samples per candidate and per baseline (interleaved)."""


class LLMConfig(TrexModel):
    """Optional hypothesis generator through an OpenAI-compatible endpoint."""

    url: str
    """Base URL of the endpoint (…/v1)."""
    model: str
    """Model name."""
    api_key_env: str | None = None
    """Environment variable holding the API key."""


class KernelTuneConfig(TrexModel):
    """One tuning run."""

    suite: Literal["default", "none"] = "default"
    """`default` tunes every kernel of the suite the backend supports; `none` tunes only `kernels`."""
    kernels: list[KernelName] = Field(default_factory=list)
    """Kernels to tune (empty with suite=default = all)."""
    backend: Backend = "cpu-c"
    """Backend: cpu-c (gcc + OpenMP), cuda-triton, npu-ascendc."""
    shapes: list[KernelShape] = Field(default_factory=list)
    """Shapes to tune; kernels without an entry use the suite's default shapes."""
    shapes_from: ShapesFrom | None = None
    """Tune the shape classes this TrainJob's trainer calls (the same derivation the trainer loads kernels for):
    the operator reads the TrainJob's spec and sets ``shapes`` (and, when ``kernels`` is empty, the kernels the run
    calls that the backend tunes in ``dtypes``); `trex kernels tune --shapes-from FILE` does the same from a
    TrainJob manifest or trainer YAML. Exclusive with ``shapes``."""
    dtypes: list[DType] = Field(default_factory=lambda: list(DEFAULT_DTYPES), min_length=1)
    """Data types."""
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    """Search budget."""
    threads: int = Field(default=0, ge=0, le=1024)
    """Threads for CPU kernels and the baselines (0 = all cores)."""
    skills_path: str | None = None
    """Skill library (JSONL) to read and extend; unset = <output>/skills.jsonl."""
    soc: Literal["ascend910b", "ascend910c", "ascend310p"] = "ascend910b"
    """npu-ascendc: SoC whose Unified Buffer sizes constrain tiling."""
    llm: LLMConfig | None = None
    """Optional LLM hypothesis generator (the default search needs none)."""
    seed: int = Field(default=0, ge=0)
    """Seed for inputs and search tie-breaks."""
    output: str = "kernels-out"
    """Output directory (registry, report, search state)."""
    milp_starts: int = Field(default=3, ge=1, le=20)
    """MILP-ranked starting configurations measured before the search; the fastest correct one is the root."""
    gate_seeds: int = Field(default=5, ge=5, le=100)
    """Seeds per tail shape in the correctness gate (at least 5)."""
    compare_compile: bool = True
    """Also time torch.compile (default mode) as a baseline; its compile time is reported separately."""
    cache_dir: str | None = None
    """Compiled-kernel and machine-facts cache; unset = $TREX_KERNEL_CACHE or ~/.cache/trex/kernels."""

    @model_validator(mode="after")
    def _check(self) -> KernelTuneConfig:
        if self.shapes_from is not None and self.shapes:
            raise ValueError("shapesFrom: sets shapes from the TrainJob; set one of the two")
        if self.suite == "none" and not self.kernels:
            raise ValueError("kernels: must name at least one kernel when suite is 'none'")
        problem = coverage_problem(self.backend, self.kernels, self.dtypes, [(s.kernel, s.dims) for s in self.shapes])
        if problem:
            raise ValueError(problem)
        return self


def coverage_problem(backend: str, kernels: Sequence[str], dtypes: Sequence[str],
                     shapes: Sequence[tuple[str, dict[str, int]]]) -> str | None:
    """One line naming the field that asks for something the backend cannot tune (a kernel without a
    template, a dtype no selected kernel has, a shape with the wrong dimension names or values the kernel
    does not compute), or None."""
    from trex.kernels.backends import coverage
    from trex.kernels.suite import SUITE

    have = coverage(backend)
    for i, (name, dims) in enumerate(shapes):
        want = SUITE[name].dim_names
        if set(dims) != set(want):
            return f"shapes[{i}].dims: {name} takes dims {list(want)}, got {sorted(dims)}"
        rule = SUITE[name].dims_problem
        why = rule(dims) if rule is not None else None
        if why:
            return f"shapes[{i}].dims.{why}"
    for name in kernels:
        if name not in have:
            return f"kernels: backend {backend} has no template for {name} (it has {', '.join(have)})"
        missing = [d for d in dtypes if d not in have[name]]
        if missing:
            return (f"dtypes: backend {backend} has no {'/'.join(missing)} template for {name} "
                    f"(it has {'/'.join(have[name])})")
    if not kernels:
        unused = [d for d in dtypes if not any(d in ds for ds in have.values())]
        if unused:
            offered = sorted({d for ds in have.values() for d in ds})
            return f"dtypes: backend {backend} has no {'/'.join(unused)} template for any kernel (it has {'/'.join(offered)})"
    return None
