"""ORDataConfig: the OR data pipeline's settings; `spec.ordata` of an ORDataJob."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trex.config_base import TrexModel

FAMILY_NAMES: tuple[str, ...] = (
    "diet", "production_planning", "staff_scheduling", "transportation", "blending", "network_flow",
    "portfolio", "cutting_stock", "knapsack", "assignment", "facility_location", "capital_budgeting",
    "set_covering", "bin_packing", "tsp", "vrp",
)
FamilyName = Literal[
    "diet", "production_planning", "staff_scheduling", "transportation", "blending", "network_flow",
    "portfolio", "cutting_stock", "knapsack", "assignment", "facility_location", "capital_budgeting",
    "set_covering", "bin_packing", "tsp", "vrp",
]

Style = Literal["formal", "narrative", "bulleted"]
Form = Literal["long", "concise"]
OutputKind = Literal["cpt", "sft"]
STYLES: tuple[Style, ...] = ("formal", "narrative", "bulleted")
FORMS: tuple[Form, ...] = ("long", "concise")
OUTPUT_KINDS: tuple[OutputKind, ...] = ("cpt", "sft")


class SizeRange(TrexModel):
    """Inclusive range of the family's size parameter (items, nodes, products, ...)."""

    min: int = Field(default=3, gt=0, le=10_000)
    """Smallest size."""
    max: int = Field(default=6, gt=0, le=10_000)
    """Largest size."""

    @model_validator(mode="after")
    def _order(self) -> SizeRange:
        if self.min > self.max:
            raise ValueError(f"min: {self.min} must be <= max ({self.max})")
        return self


class FamilySpec(TrexModel):
    """One problem family in the mix."""

    name: FamilyName
    """Family."""
    weight: float = Field(default=1.0, gt=0, le=1e6)
    """Relative sampling weight."""
    size: SizeRange = Field(default_factory=SizeRange)
    """Size range."""


def _all_families() -> list[FamilySpec]:
    return [FamilySpec(name=n) for n in FAMILY_NAMES]  # type: ignore[arg-type]


class ToleranceConfig(TrexModel):
    """Numerical tolerances for verification and gating."""

    feasibility: float = Field(default=1e-6, gt=0, le=1)
    """Largest allowed constraint violation (absolute)."""
    objective_rel: float = Field(default=1e-6, gt=0, le=1)
    """Relative objective agreement |a - b| / (|b| + 1)."""
    integrality: float = Field(default=1e-6, gt=0, le=0.5)
    """Largest distance of an integer variable from an integer."""


class EndpointConfig(TrexModel):
    """An OpenAI-compatible chat endpoint."""

    url: str
    """Base URL (…/v1)."""
    model: str
    """Model name."""
    api_key_env: str | None = None
    """Environment variable holding the API key."""
    temperature: float = Field(default=0.0, ge=0, le=2)
    """Sampling temperature."""
    max_tokens: int = Field(default=2048, gt=0, le=131_072)
    """Completion token limit."""
    timeout_s: float = Field(default=120.0, gt=0, le=3600)
    """Per-request timeout (s)."""


class ReconstructionConfig(TrexModel):
    """Who writes the formulation and code from the natural-language problem."""

    mode: Literal["reference", "llm"] = "reference"
    """`reference` derives code from the instance IR; `llm` asks the endpoint."""
    endpoint: EndpointConfig | None = None
    """Endpoint for mode=llm (and optional LLM review)."""
    code_solver: Literal["gurobipy", "highspy", "both"] = "gurobipy"
    """Library the reconstructed code uses."""
    layout: Literal["inline", "data"] = "inline"
    """Reference answers' layout: `inline` writes the coefficients into each constraint (every family);
    `data` restates the problem's data once as positional lists in the problem's order (the entity names, then
    one list per data line), then builds the model over list positions, with a symbolic formulation
    (copy-friendly; gurobipy, families with a data layout: knapsack)."""

    @model_validator(mode="after")
    def _check(self) -> ReconstructionConfig:
        if self.mode == "llm" and self.endpoint is None:
            raise ValueError("endpoint: required when mode is 'llm'")
        if self.layout == "data" and self.mode != "reference":
            raise ValueError("layout: 'data' is the reference reconstruction's layout; mode must be 'reference'")
        if self.layout == "data" and self.code_solver != "gurobipy":
            raise ValueError(f"layout: 'data' is written for gurobipy; codeSolver must be 'gurobipy', "
                             f"got {self.code_solver!r}")
        return self


class RenderConfig(TrexModel):
    """Natural-language rendering."""

    styles: list[Style] = Field(default_factory=lambda: list(STYLES), min_length=1)
    """Paraphrase styles sampled per instance."""
    forms: list[Form] = Field(default_factory=lambda: list(FORMS), min_length=1)
    """Long and/or concise forms."""


class SandboxLimits(TrexModel):
    """Resource limits for executing reconstructed code."""

    timeout_s: float = Field(default=20.0, gt=0, le=3600)
    """Wall-clock limit (s)."""
    cpu_s: int = Field(default=20, gt=0, le=3600)
    """CPU-time limit (s)."""
    memory_mb: int = Field(default=2048, ge=64, le=262_144)
    """Address-space limit (MiB)."""
    min_isolation: Literal["kernel-fs", "namespaces", "audit"] = "namespaces"
    """Weakest sandbox isolation the job accepts (kernel-fs: bubblewrap); below it the job fails at start."""


class DedupConfig(TrexModel):
    """Exact and near-duplicate removal and benchmark decontamination."""

    near_threshold: float = Field(default=0.85, gt=0, le=1)
    """MinHash Jaccard threshold for near duplicates."""
    num_perm: int = Field(default=128, ge=16, le=1024)
    """MinHash permutations."""
    decontaminate: list[str] = Field(default_factory=list)
    """Benchmark files or folders whose problems must not appear in the output."""


class ShardConfig(TrexModel):
    """Sharding of the output (one Indexed Job completion per shard)."""

    num_shards: int = Field(default=1, gt=0, le=100_000)
    """Shards; each is generated independently and deterministically."""
    samples_per_file: int = Field(default=1000, gt=0, le=10_000_000)
    """Samples per JSONL file within a shard."""


class ORDataConfig(TrexModel):
    """One data generation run."""

    families: list[FamilySpec] = Field(default_factory=_all_families, min_length=1, max_length=len(FAMILY_NAMES))
    """Families in the mix with weights and sizes (default: all 16, equal weights)."""
    count: int = Field(default=160, gt=0, le=100_000_000)
    """Instances to attempt in total over all shards."""
    seed: int = Field(default=0, ge=0)
    """Master seed; each instance's seed derives from it."""
    solver: Literal["gurobi", "highs", "auto"] = "auto"
    """Solver: gurobi when the model fits its licence (auto), highs otherwise."""
    cross_check_fraction: float = Field(default=0.1, ge=0, le=1)
    """Fraction of instances solved by both solvers, which must agree."""
    time_limit_s: float = Field(default=30.0, gt=0, le=86_400)
    """Solver time limit per instance (s)."""
    tolerances: ToleranceConfig = Field(default_factory=ToleranceConfig)
    """Verification tolerances."""
    render: RenderConfig = Field(default_factory=RenderConfig)
    """Natural-language rendering."""
    reconstruction: ReconstructionConfig = Field(default_factory=ReconstructionConfig)
    """Formulation and code reconstruction."""
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    """Sandbox limits."""
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    """Deduplication and decontamination."""
    shards: ShardConfig = Field(default_factory=ShardConfig)
    """Sharding."""
    outputs: list[OutputKind] = Field(default_factory=lambda: list(OUTPUT_KINDS), min_length=1)
    """Renderings written: CPT text documents and/or SFT chat samples."""
    output: str = "ordata-out"
    """Output directory."""
    heldout_fraction: float = Field(default=0.0, ge=0, le=0.5)
    """Share of merged samples kept out of the training files and written to heldout/heldout.jsonl (the
    evaluation harness's `ordata` format), chosen by a hash of each sample id so the split is stable."""

    @model_validator(mode="after")
    def _check(self) -> ORDataConfig:
        names = [f.name for f in self.families]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"families: {', '.join(dup)} listed more than once; allowed: each family once")
        if self.reconstruction.layout == "data":
            from trex.ordata.reconstruct import DATA_LAYOUT_FAMILIES

            lacking = [n for n in names if n not in DATA_LAYOUT_FAMILIES]
            if lacking:
                raise ValueError(f"reconstruction.layout: 'data' has no layout for {', '.join(lacking)}; families "
                                 f"with one: {', '.join(DATA_LAYOUT_FAMILIES)}")
        return self
