"""EvalConfig: benchmarks, model and protocol of one evaluation; `spec.evaluation` of an EvalJob."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trex.config_base import TrexModel
from trex.reasoning import ReasoningMode, mode_problems

BENCHMARK_NAMES: tuple[str, ...] = (
    "nl4opt", "mamo_easy", "mamo_complex", "optibench", "nl4opt_e", "industryor", "industryor_fixed",
    "optmath", "bench4opt", "ordata",
)
BenchmarkName = Literal[
    "nl4opt", "mamo_easy", "mamo_complex", "optibench", "nl4opt_e", "industryor", "industryor_fixed",
    "optmath", "bench4opt", "ordata",
]
Protocol = Literal["strict", "orlm", "mamo", "optibench", "sirl"]


class BenchmarkSpec(TrexModel):
    """One benchmark file or folder and how to score it."""

    name: BenchmarkName
    """Benchmark (also selects the loader unless `format` says otherwise)."""
    path: str
    """File or folder (Bench4Opt: instance folders or its tarball)."""
    format: Literal["auto", "nl4opt", "mamo", "optibench", "industryor", "optmath", "bench4opt", "ordata"] = "auto"
    """Loader; auto detects it from the content."""
    protocol: Protocol | None = None
    """Scoring protocol for this benchmark (unset = the run's protocol)."""
    limit: int | None = Field(default=None, gt=0, le=1_000_000)
    """Evaluate only the first N items."""


class SamplingConfig(TrexModel):
    """Pinned sampling parameters."""

    temperature: float = Field(default=0.0, ge=0, le=2)
    """Sampling temperature (0 = greedy)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass."""
    max_tokens: int = Field(default=4096, gt=0, le=262_144)
    """Completion token limit."""
    seed: int = Field(default=0, ge=0)
    """Sampling seed sent to the endpoint."""


class ModelSpec(TrexModel):
    """The model under evaluation."""

    kind: Literal["openai", "transformers", "trex-checkpoint", "reference"] = "openai"
    """openai (any OpenAI-compatible endpoint), transformers (local HF dir), trex-checkpoint, reference."""
    url: str | None = None
    """openai: base URL (…/v1)."""
    name: str | None = None
    """openai: model name sent to the endpoint."""
    path: str | None = None
    """transformers / trex-checkpoint: local directory."""
    api_key_env: str | None = None
    """Environment variable holding the API key."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Sampling parameters."""
    concurrency: int = Field(default=8, gt=0, le=1024)
    """Requests in flight."""
    retries: int = Field(default=3, ge=0, le=20)
    """Retries per request on transport errors (exponential backoff); never on answers."""

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        # url may be left unset in an EvalJob whose operator-managed server provides it;
        # local runs check it before the first request.
        if self.kind == "openai" and not self.name:
            raise ValueError("name: required when kind is 'openai'")
        if self.kind in ("transformers", "trex-checkpoint") and not self.path:
            raise ValueError(f"path: required when kind is {self.kind!r}")
        return self


class TimeoutConfig(TrexModel):
    """Time limits."""

    request_s: float = Field(default=300.0, gt=0, le=86_400)
    """Per model request (s)."""
    execution_s: float = Field(default=60.0, gt=0, le=86_400)
    """Per sandboxed program run (s)."""


class ExecutionConfig(TrexModel):
    """Sandboxed execution of the generated programs."""

    workers: int = Field(default=2, gt=0, le=256)
    """Programs executed at once (each is one sandboxed process)."""
    memory_mb: int = Field(default=4096, gt=0, le=1_048_576)
    """Address-space limit per program (MiB)."""
    max_output_kb: int = Field(default=1024, gt=0, le=1_048_576)
    """Captured stdout/stderr per program and stream (KiB); more kills the program."""


class SandboxPolicy(TrexModel):
    """How untrusted programs must be isolated."""

    min_isolation: Literal["kernel-fs", "namespaces", "audit"] = "namespaces"
    """Weakest sandbox isolation the job accepts (kernel-fs: bubblewrap); below it the job fails at start."""


class EvalConfig(TrexModel):
    """One evaluation run."""

    benchmarks: list[BenchmarkSpec] = Field(min_length=1)
    """Benchmarks to run."""
    model: ModelSpec
    """Model under evaluation."""
    protocol: Protocol = "strict"
    """Default scoring protocol."""
    k: list[int] = Field(default_factory=lambda: [1], min_length=1, max_length=16)
    """pass@k values reported (samples per item = max(k)); at most 16, which also bounds the CRD rule over them."""
    timeouts: TimeoutConfig = Field(default_factory=TimeoutConfig)
    """Time limits."""
    orgeval: bool = True
    """Bench4Opt: also decide structural equivalence with ORGEval."""
    bench4opt_text: Literal["wp", "wp_concise"] = "wp"
    """Bench4Opt: which problem statement is the question (wp.txt or wp_concise.txt)."""
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    """Sandboxed execution."""
    sandbox: SandboxPolicy = Field(default_factory=SandboxPolicy)
    """Sandbox isolation policy."""
    accept_printed_answers: bool = False
    """Score the printed TREX_RESULT line (ORLM-style, for comparison with published numbers) instead of
    the solve the sandbox recorded from the solver."""
    metrics_port: int | None = Field(default=None, ge=0, le=65_535)
    """Serve Prometheus metrics on this port (unset: TREX_METRICS_PORT if set, else not served)."""
    output: str = "eval-out"
    """Output directory."""
    reasoning_mode: ReasoningMode | None = None
    """DeepSeek-V4 reasoning mode (trex.reasoning): non-think, think-high or think-max (think-high plus
    thinkMaxPrompt before the system prompt); the answer scored is the text after </think>. Unset = the
    plain chat layout. Local models render it with their chat template (reasoning_mode / thinking
    arguments); OpenAI-compatible servers get chat_template_kwargs {thinking, reasoning_mode}."""
    think_max_prompt: str | None = None
    """think-max: its special system prompt (examples/evaljob-think-max.yaml holds the published text)."""

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        problems = mode_problems(self.reasoning_mode, self.think_max_prompt, self.model.sampling.max_tokens, "",
                                 "model.sampling.maxTokens")
        if problems:  # one line, naming the field; the next problem shows once this one is fixed
            raise ValueError(f"{problems[0][0]}: {problems[0][1]}")
        for i, kv in enumerate(self.k):
            if not 1 <= kv <= 1024:
                raise ValueError(f"k.{i}: must be in [1, 1024], got {kv}")
        if self.protocol == "strict" and max(self.k) > 1 and self.model.sampling.temperature == 0:
            raise ValueError("model.sampling.temperature: k > 1 needs temperature > 0 (greedy samples are identical)")
        return self
