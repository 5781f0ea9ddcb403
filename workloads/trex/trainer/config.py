"""TrainerConfig: everything one training run needs; the same section is `spec.trainer` of a TrainJob."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from trex.config_base import TrexModel, check_dns1123_label
from trex.reasoning import ReasoningMode, mode_problems
from trex.trainer.model_args import ModelArgs
from trex.trainer.presets import resolve_model_values

Preset = Literal["tiny", "tiny-vllm", "small-cpu", "small-gpu", "v4-flash", "v4-pro"]
PRESETS: tuple[str, ...] = ("tiny", "tiny-vllm", "small-cpu", "small-gpu", "v4-flash", "v4-pro")


class ModelOverrides(TrexModel):
    """Fields that replace the preset's values; unset fields keep the preset's."""

    vocab_size: int | None = Field(default=None, gt=0, le=1_048_576)
    """Vocabulary size (tokens)."""
    hidden_size: int | None = Field(default=None, gt=0, le=65_536)
    """Model width d_model."""
    num_layers: int | None = Field(default=None, gt=0, le=512)
    """Number of transformer blocks."""
    num_heads: int | None = Field(default=None, gt=0, le=1024)
    """Attention heads."""
    attention: Literal["mla", "csa"] | None = None
    """Attention kind: `mla` (DeepSeek-V3 multi-head latent) or `csa` (V4 compressed sparse + sliding window)."""
    q_lora_rank: int | None = Field(default=None, ge=0)
    """Query low-rank dimension (0 = no query compression)."""
    kv_lora_rank: int | None = Field(default=None, gt=0)
    """Compressed KV latent dimension."""
    qk_nope_head_dim: int | None = Field(default=None, gt=0)
    """Per-head query/key dimension without rotary embedding."""
    qk_rope_head_dim: int | None = Field(default=None, gt=0)
    """Per-head query/key dimension carrying rotary embedding."""
    v_head_dim: int | None = Field(default=None, gt=0)
    """Per-head value dimension."""
    csa_compress_every: int | None = Field(default=None, gt=0)
    """csa: one compressed KV entry every m tokens."""
    csa_top_k: int | None = Field(default=None, gt=0)
    """csa: compressed entries the lightning indexer selects per query."""
    csa_window: int | None = Field(default=None, gt=0)
    """csa: sliding-window length (tokens)."""
    csa_indexer_heads: int | None = Field(default=None, gt=0, le=1024)
    """csa: heads of the lightning indexer that scores compressed entries."""
    csa_indexer_dim: int | None = Field(default=None, gt=0, le=4096)
    """csa: per-head dimension of the lightning indexer."""
    hca_compress_every: int | None = Field(default=None, gt=0)
    """csa: one heavily compressed KV entry every m' tokens in hca layers."""
    layer_types: list[Literal["sliding", "csa", "hca"]] | None = None
    """csa: attention kind per layer (trunk, then optionally MTP blocks); unset = the released schedule."""
    o_groups: int | None = Field(default=None, gt=0)
    """csa: head groups of the grouped low-rank output projection."""
    o_lora_rank: int | None = Field(default=None, gt=0)
    """csa: per-group width of the grouped output projection."""
    compress_rope_theta: float | None = Field(default=None, gt=0)
    """csa: rotary base of csa/hca layers and their compressed entries (sliding layers use rope_theta)."""
    intermediate_size: int | None = Field(default=None, gt=0)
    """Dense FFN hidden size (first dense layers)."""
    moe_intermediate_size: int | None = Field(default=None, gt=0)
    """Hidden size of one routed expert."""
    n_dense_layers: int | None = Field(default=None, ge=0)
    """Leading layers with a dense FFN instead of MoE."""
    n_routed_experts: int | None = Field(default=None, gt=0, le=4096)
    """Routed experts per MoE layer."""
    n_shared_experts: int | None = Field(default=None, ge=0, le=16)
    """Shared experts per MoE layer."""
    experts_per_token: int | None = Field(default=None, gt=0, le=64)
    """Routed experts each token is sent to (top-k)."""
    scoring: Literal["sigmoid", "sqrt-softplus"] | None = None
    """Router scoring function: sigmoid (V3) or sqrt-softplus (V4)."""
    n_groups: int | None = Field(default=None, gt=0)
    """Expert groups for group-limited routing (1 = off)."""
    topk_groups: int | None = Field(default=None, gt=0)
    """Groups a token may route into when group-limited routing is on."""
    routed_scaling_factor: float | None = Field(default=None, gt=0)
    """Scale applied to the renormalised routing weights."""
    norm_topk_prob: bool | None = None
    """Renormalise the chosen experts' scores to sum to 1 before scaling (V3/V4 releases: true)."""
    n_hash_layers: int | None = Field(default=None, ge=0)
    """Leading MoE layers routed by a fixed token-id hash table (V4)."""
    swiglu_limit: float | None = Field(default=None, ge=0)
    """SwiGLU clamp in routed experts (0 = off)."""
    hc_mult: int | None = Field(default=None, gt=0, le=16)
    """mHC residual streams (1 = plain residual)."""
    sinkhorn_iters: int | None = Field(default=None, gt=0, le=100)
    """Sinkhorn iterations normalising the mHC mixing matrix."""
    hc_eps: float | None = Field(default=None, gt=0)
    """mHC numerical floor added to the pre/mixing weights and the Sinkhorn denominators."""
    mtp_depth: int | None = Field(default=None, ge=0, le=8)
    """Multi-token-prediction heads."""
    max_seq_len: int | None = Field(default=None, gt=0)
    """Longest sequence the rotary tables are built for (tokens)."""
    rope_theta: float | None = Field(default=None, gt=0)
    """Rotary base frequency."""
    rope_interleave: bool | None = None
    """mla: rotate interleaved pairs (DeepSeek's layout, true) or the two halves (HF rope_interleave false)."""


class ModelConfig(TrexModel):
    """Model shape: a named preset plus overrides."""

    preset: Preset = "tiny"
    """Preset: tiny (CPU tests), small-cpu (benchmarks), small-gpu (~1B), v4-flash, v4-pro (published shapes)."""
    overrides: ModelOverrides = Field(default_factory=ModelOverrides)
    """Per-field overrides of the preset."""
    dtype: Literal["fp32", "bf16", "fp64"] = "fp32"
    """Parameter and compute dtype (bf16 on accelerators, fp32 on CPU; fp64 on CPU for reference runs, where
    Muon's Newton-Schulz runs in fp64 too)."""
    qat: Literal["none", "fp4-experts"] = "none"
    """Quantization-aware training: "fp4-experts" runs routed experts and the csa indexer's query/key
    path through FP4 (e2m1, 1x32 blocks) -> FP8 (e4m3) -> matmul with straight-through gradients, as
    DeepSeek-V4 trains them; the fp32 master weights stay unquantized."""
    autocast: Literal["off", "bf16"] = "off"
    """Mixed precision (opt-in): "bf16" runs forward and loss under torch.autocast(bfloat16) while
    parameters, gradients and optimizer states keep ``dtype``; about 30 % faster forward+backward on
    CPUs with AVX512-BF16/AMX, with bf16-level numerics. Default "off" (every op in ``dtype``)."""

    @model_validator(mode="after")
    def _shape(self) -> ModelConfig:
        """The resolved shape must build: the model's own checks, at validate time (no torch import)."""
        try:
            _ = self.args
        except ValueError as e:
            raise ValueError(f"overrides: {e}") from None
        return self

    @property
    def args(self) -> ModelArgs:
        """The resolved shape the model is built with: the preset's values, the overrides and the qat mode."""
        return ModelArgs.from_values({**resolved_model_values(self), "qat": self.qat})


class ParallelismConfig(TrexModel):
    """Parallel degrees. Attention mesh: dp x cp x tp x pp; MoE mesh (folded): edp x ep x etp x pp, same world."""

    dp: int | None = Field(default=None, gt=0, le=65_536)
    """Data-parallel degree; unset = world / (cp x tp x pp) (leave it unset under cp > 1)."""
    tp: int = Field(default=1, gt=0, le=64)
    """Tensor-parallel degree of attention and dense layers."""
    pp: int = Field(default=1, gt=0, le=128)
    """Pipeline-parallel stages."""
    ep: int = Field(default=1, gt=0, le=4096)
    """Expert-parallel degree; must divide the routed expert count."""
    etp: int = Field(default=1, gt=0, le=64)
    """Expert-tensor-parallel degree (splits each expert's hidden size)."""
    dp_replicate: int = Field(default=1, gt=0, le=65_536)
    """Replicated data-parallel groups (HSDP): dense parameters are sharded over dp / dpReplicate ranks
    and replicated over dpReplicate groups (1 = plain FSDP over all dp ranks)."""
    cp: int = Field(default=1, gt=0, le=1024)
    """Context-parallel degree: each sequence is split over cp ranks (load-balanced causal split: rank r holds
    chunks r and 2cp-1-r of 2cp); attention gathers the keys' latents over them. For expert routing the cp
    ranks count as data ranks."""
    reshard_after_forward: bool = True
    """FSDP2: free each block's gathered parameters after its forward and gather them again for the
    backward (less memory, one more all-gather per block)."""


class NewtonSchulzStage(TrexModel):
    """A run of Newton-Schulz iterations with one quintic coefficient triple."""

    steps: int = Field(gt=0, le=50)
    """Iterations in this stage."""
    coefficients: list[float] = Field(min_length=3, max_length=3)
    """(a, b, c) of X <- aX + b(XX^T)X + c(XX^T)^2 X."""


def _default_ns() -> list[NewtonSchulzStage]:
    return [
        NewtonSchulzStage(steps=8, coefficients=[3.4445, -4.7750, 2.0315]),
        NewtonSchulzStage(steps=2, coefficients=[2.0, -1.5, 0.5]),
    ]


class MuonConfig(TrexModel):
    """Muon for every 2-D GEMM weight (stacked experts orthogonalised per expert)."""

    enabled: bool = True
    """Muon for the GEMM weights; false = AdamW (optimizer.adamw) for every parameter, as most fine-tuning recipes
    use (twice Muon's optimizer-state bytes for those weights, no Newton-Schulz)."""
    lr: float = Field(default=2e-2, gt=0, le=10)
    """Peak learning rate."""
    momentum: float = Field(default=0.95, ge=0, lt=1)
    """Momentum coefficient."""
    nesterov: bool = True
    """Nesterov momentum."""
    newton_schulz: list[NewtonSchulzStage] = Field(default_factory=_default_ns, min_length=1)
    """Hybrid Newton-Schulz schedule; default 8 x (3.4445, -4.7750, 2.0315) then 2 x (2, -1.5, 0.5)."""
    update_rms: float = Field(default=0.18, gt=0)
    """Target update RMS: the orthogonalised update is scaled by sqrt(max(n, m)) x update_rms."""
    weight_decay: float = Field(default=0.1, ge=0)
    """Decoupled weight decay."""
    distributed: Literal["owner", "gather"] = "owner"
    """Newton-Schulz on sharded matrices: `owner` sends each matrix's shards to one owner rank (balanced by
    cost) in one packed all-to-all and scatters the result back; `gather` all-gathers every matrix on every
    rank (the reference: same result, more traffic and compute)."""
    ns_dtype: Literal["auto", "fp32", "bf16"] = "auto"
    """Compute dtype of every Newton-Schulz stage but the last, which always runs in fp32 (auto: bf16 where
    bf16 GEMMs are fast: NPUs, bf16-capable GPUs, CPUs with AVX512-BF16 or AMX; fp32 elsewhere). Singular
    values end within about 5e-4 of 1 either way; bf16 stages let the singular vectors of ill-conditioned
    updates drift from the polar factor (0.016 at condition 10, 0.6 at 1e3, spectral norm)."""


class AdamWConfig(TrexModel):
    """AdamW for embeddings, output head, norm weights and mHC static biases."""

    lr: float = Field(default=2e-3, gt=0, le=10)
    """Peak learning rate."""
    betas: list[float] = Field(default_factory=lambda: [0.9, 0.95], min_length=2, max_length=2)
    """(beta1, beta2)."""
    eps: float = Field(default=1e-20, gt=0)
    """Denominator epsilon."""
    weight_decay: float = Field(default=0.1, ge=0)
    """Decoupled weight decay."""


class ScheduleConfig(TrexModel):
    """One LR schedule for both optimizers: linear warmup, constant, cosine decay to min_lr_ratio."""

    warmup_steps: int = Field(default=10, ge=0)
    """Linear warmup steps."""
    constant_steps: int = Field(default=0, ge=0)
    """Steps at the peak after warmup."""
    decay: Literal["cosine", "none"] = "cosine"
    """Decay shape after the constant phase."""
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    """Final LR as a fraction of the peak (10 % by default)."""


class BatchRampStep(TrexModel):
    """From `step` on, use `globalBatchSize` sequences per step."""

    step: int = Field(ge=0)
    """First step with this batch size."""
    global_batch_size: int = Field(gt=0)
    """Sequences per optimizer step."""


class SwapConfig(TrexModel):
    """Double-buffered swap optimizer: optimizer states live in host memory, streamed per bucket."""

    enabled: bool = False
    """Keep optimizer states off-device and stream them in and out."""
    buffers: int = Field(default=2, ge=2, le=4)
    """Device buffers used for overlap (2 = double buffering)."""
    bucket_mb: int = Field(default=256, gt=0, le=65_536)
    """Bucket size (MiB) per transfer."""


class OptimizerConfig(TrexModel):
    """Muon + AdamW, their shared schedule, batch ramp, clipping and swap."""

    muon: MuonConfig = Field(default_factory=MuonConfig)
    """Muon settings."""
    adamw: AdamWConfig = Field(default_factory=AdamWConfig)
    """AdamW settings."""
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    """Learning-rate schedule."""
    batch_ramp: list[BatchRampStep] = Field(default_factory=list)
    """Global batch size ramp (empty = constant data.globalBatchSize)."""
    grad_clip: float = Field(default=1.0, ge=0)
    """Global gradient-norm clip (0 = off)."""
    swap: SwapConfig = Field(default_factory=SwapConfig)
    """Swap optimizer."""


class RoutingConfig(TrexModel):
    """Expert balancing and routing stability."""

    bias_update_speed: float = Field(default=1e-3, ge=0)
    """Aux-loss-free bias update speed (sign rule)."""
    sequence_balance_weight: float = Field(default=1e-4, ge=0)
    """Weight of the sequence-level balance loss."""
    mtp_loss_weight: float = Field(default=0.3, ge=0)
    """MTP loss weight until mtpWeightDropStep."""
    mtp_loss_weight_late: float = Field(default=0.1, ge=0)
    """MTP loss weight from mtpWeightDropStep on."""
    mtp_weight_drop_step: int | None = Field(default=None, ge=0)
    """Step at which the MTP weight drops; unset = where the LR schedule starts to decay (warmupSteps +
    constantSteps, DeepSeek-V4's recipe), never with decay "none"."""


class SpikeConfig(TrexModel):
    """Loss-spike detector (trend + z-score) that turns on anticipatory routing."""

    enabled: bool = True
    """Detect spikes and react."""
    warmup_steps: int = Field(default=50, ge=0)
    """Steps observed before spikes can fire."""
    window: int = Field(default=50, gt=1)
    """Steps in the trend/z-score window."""
    z_threshold: float = Field(default=4.0, gt=0)
    """z-score above the trend that counts as a spike."""
    cooldown_steps: int = Field(default=20, ge=0)
    """Steps after a spike before another can fire."""
    anticipatory_delta: int = Field(default=2, gt=0)
    """Anticipatory routing uses router parameters from this many steps earlier (Δt)."""
    anticipatory_window: int = Field(default=50, gt=0)
    """Steps anticipatory routing stays on after a spike."""


class TokenizerConfig(TrexModel):
    """Load a tokenizer.json or train a byte-level BPE on the training corpus."""

    path: str | None = None
    """Path to a tokenizer.json; unset = train a byte-level BPE on data.train."""
    vocab_size: int = Field(default=4096, gt=256, le=1_048_576)
    """Vocabulary size when training a BPE."""


class SeqLenStep(TrexModel):
    """From `step` on, pack sequences of `seqLen` tokens."""

    step: int = Field(ge=0)
    """First step with this length."""
    seq_len: int = Field(gt=0, le=1_048_576)
    """Sequence length (tokens)."""


class DataConfig(TrexModel):
    """Training data: JSONL text (pretrain/CPT) or JSONL chat (SFT), packed into fixed-length sequences."""

    train: str | None = None
    """JSONL file, directory of JSONL shards, or a glob such as dir/sft-*.jsonl; unset = the built-in demo corpus."""
    format: Literal["text", "chat", "auto"] = "auto"
    """Record format: {"text": ...} or {"messages": [...]} (auto = detect)."""
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    """Tokenizer."""
    store_dir: str | None = None
    """Directory of pre-tokenised token stores (`trex data prepare` writes one there, training reads it; each is
    named by a hash of the sources, tokenizer and encoding settings); unset = the run's tokenizer cache."""
    seq_len: int = Field(default=128, gt=0, le=1_048_576)
    """Packed sequence length (tokens)."""
    seq_len_curriculum: list[SeqLenStep] = Field(default_factory=list)
    """Sequence-length curriculum (empty = constant seqLen)."""
    micro_batch_size: int = Field(default=4, gt=0, le=65_536)
    """Sequences per forward/backward on one rank."""
    global_batch_size: int = Field(default=4, gt=0, le=16_777_216)
    """Sequences per optimizer step over all data-parallel ranks."""
    seed: int = Field(default=1234, ge=0)
    """Shuffle seed."""
    reasoning_mode: ReasoningMode | None = None
    """Chat (SFT) samples in DeepSeek-V4's layout for this mode (non-think, think-high, think-max; trex.reasoning):
    think tags, assistant reasoning_content, DSML tool calls, tool results; unset = the plain chat layout.
    Evaluate with the same evaluation.reasoningMode."""
    think_max_prompt: str | None = None
    """think-max: the special system prompt put before each sample's system message
    (examples/evaljob-think-max.yaml holds the published text)."""

    @model_validator(mode="after")
    def _reasoning(self) -> DataConfig:
        longest = max([self.seq_len, *(s.seq_len for s in self.seq_len_curriculum)])
        where = "seqLen" if longest == self.seq_len else "seqLenCurriculum"
        problems = mode_problems(self.reasoning_mode, self.think_max_prompt, longest, "", where)
        if self.reasoning_mode is not None and self.format == "text":
            problems.append(("reasoningMode", "applies to chat records; format is 'text'"))
        if problems:  # one line, naming the field; the next problem shows once this one is fixed
            raise ValueError(f"{problems[0][0]}: {problems[0][1]}")
        return self


class CheckpointConfig(TrexModel):
    """Sharded, atomic, resumable checkpoints."""

    dir: str = "checkpoints"
    """Checkpoint root directory."""
    interval_steps: int = Field(default=100, gt=0)
    """Save every N steps (and at the end)."""
    keep_last: int = Field(default=3, gt=0, le=1000)
    """Checkpoints kept."""
    resume: bool = True
    """Resume from the latest verified checkpoint when one exists."""
    init_from_hf: str | None = None
    """Directory of safetensors to initialise from: DeepSeek-V3 (HF names) or DeepSeek-V4 (HF or DeepSeek's
    original names, detected from the tensors), quantized (FP8/FP4 with scales) or not."""
    export_hf: bool = True
    """At the end of a successful run, write a Hugging Face export (DeepSeek-V3 or -V4 safetensors, tokenizer,
    chat template) to <dir>/hf when the model has a transformers equivalent (mla: DeepseekV3 with sigmoid
    routing, hcMult 1, no hash layers; csa: DeepseekV4); other shapes are skipped with a log line."""
    export_quant: Literal["none", "fp8", "fp8-fp4"] = "none"
    """Weights of the Hugging Face export: none (the model dtype), fp8 (GEMM weights as FP8 e4m3 with one scale
    per 128 x 128 block, `weight_scale_inv`) or fp8-fp4 (also the routed experts as FP4 e2m1, two per byte, one
    scale per 1 x 32): DeepSeek's release layout, which initFromHf reads back."""
    export_hf_every: bool = False
    """Also write the Hugging Face export into every saved checkpoint (<dir>/step-N/hf, covered by its
    manifest), so an EvalJob can evaluate one step (modelFrom.step). Costs one model-sized write per
    checkpoint; needs a shape with a transformers equivalent (DeepseekV3 or DeepseekV4)."""


class LoggingConfig(TrexModel):
    """Progress output and metrics."""

    interval_steps: int = Field(default=10, gt=0)
    """Log a line every N steps (non-TTY)."""
    jsonl: str | None = None
    """JSONL metrics log path (unset = <checkpoint.dir>/metrics.jsonl)."""
    metrics_port: int = Field(default=0, ge=0, le=65_535)
    """Prometheus port (0 = TREX_METRICS_PORT or off)."""


class KernelsConfig(TrexModel):
    """Tuned kernels from a KernelTuneJob (see trex.trainer.kernels)."""

    registry: str | None = None
    """Kernel registry (a KernelTuneJob's registry.json, or the kernels.json its kernelsFrom mounts: a TrainJob's
    kernelsFrom sets it); unset = every op eager."""


class RewardWeightsConfig(TrexModel):
    """Weights of the OR verifier's three reward terms (SIRL's 0.5 / 1 / 1 by default) and its checks."""

    format: float = Field(default=0.5, ge=0)
    """One fenced python block that compiles."""
    execution: float = Field(default=1.0, ge=0)
    """The program exited 0 and the sandbox recorded a solve its re-solve confirms."""
    objective: float = Field(default=1.0, ge=0)
    """The recorded solve matches the ground truth under ``protocol``."""
    structure: bool = True
    """Where the prompt has a reference model (an ORData prompt's reference answer, a Bench4Opt reference LP),
    the execution and objective terms also need the recorded model to be that model (ORGEval equivalence): a
    pinned or trivial model earns the format term only."""
    import_gate: bool = True
    """Run only programs within the ORData import contract (allowed names of allowed modules, no private
    attributes); any other program earns the format term only."""


class GRPOConfig(TrexModel):
    """mode grpo: G sampled responses per prompt, rewards from the OR verifier (the program run in the sandbox,
    the solver-recorded result scored), group-normalised advantages, the clipped ratio objective and a k3 KL
    to the frozen initial policy (trex.trainer.rl)."""

    prompts_per_step: int = Field(default=4, gt=0, le=65_536)
    """Prompts per optimizer step over all data-parallel ranks (a multiple of dp)."""
    group_size: int = Field(default=8, ge=2, le=1024)
    """Responses sampled per prompt (G)."""
    max_new_tokens: int = Field(default=512, gt=0, le=1_048_576)
    """Response length cap (tokens; also capped by the model's positions)."""
    temperature: float = Field(default=1.0, gt=0, le=10)
    """Sampling temperature; the loss's log-probs use the same temperature as the behaviour log-probs."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling (1 = off)."""
    top_k: int = Field(default=0, ge=0)
    """Top-k sampling (0 = off)."""
    clip_eps: float = Field(default=0.2, gt=0, lt=1)
    """Lower (and by default upper) clip of the importance ratio."""
    clip_eps_high: float | None = Field(default=None, gt=0)
    """Upper clip (unset = clipEps; DAPO's clip-higher uses e.g. 0.28)."""
    kl_coef: float = Field(default=0.001, ge=0)
    """Coefficient of the k3 KL to the reference policy (the run's initial weights; 0 = no reference pass)."""
    reward: RewardWeightsConfig = Field(default_factory=RewardWeightsConfig)
    """Reward term weights."""
    protocol: str = "sirl"
    """Objective-match protocol of the verifier (a `trex eval` scoring protocol)."""
    prompt_format: str = "ordata"
    """Format of data.train's prompt records: ordata ({id, question, answer}, what an ORDataJob's prompts rendering
    and held-out file hold) or a benchmark format `trex eval` reads (nl4opt, mamo, optibench, industryor, optmath)."""
    prompt_set: str = "trex"
    """Prompt set of the user turn (trex.prompt_contract; the one SFT samples and `trex eval` use)."""
    verifier_workers: int = Field(default=0, ge=0, le=1024)
    """Programs verified at once (0 = the CPUs this process may use)."""
    verifier_timeout_s: float = Field(default=60.0, gt=0)
    """Wall-clock limit of one program."""
    wal_fsync_every: int = Field(default=64, ge=0)
    """Rollout log: fsync after this many tokens (0 = at the end of each rollout only)."""

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        from trex.verify.protocols import PROTOCOLS

        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol: unknown {self.protocol!r}; allowed: {', '.join(PROTOCOLS)}")
        check_prompt_source(self.prompt_format, self.prompt_set)
        return self


def check_prompt_source(prompt_format: str, prompt_set: str) -> None:
    """promptFormat must be a format `trex eval` reads whose records hold a question (not bench4opt) and promptSet
    a prompt set of the contract; ValueError naming the field otherwise."""
    from trex.prompt_contract import PROMPT_SETS
    from trex.verify.formats import FORMATS

    if prompt_format not in FORMATS or prompt_format == "bench4opt":
        allowed = [f for f in FORMATS if f != "bench4opt"]
        raise ValueError(f"promptFormat: unknown {prompt_format!r}; allowed: {', '.join(allowed)}")
    if prompt_set not in PROMPT_SETS:
        raise ValueError(f"promptSet: unknown {prompt_set!r}; allowed: {', '.join(PROMPT_SETS)}")


class TeacherConfig(TrexModel):
    """One teacher of on-policy distillation: a model folder and its weight in the loss."""

    name: str | None = None
    """A TrainJob in the same namespace: the operator waits for it to succeed, mounts its checkpoint volume
    read-only and sets path to its checkpoint folder (its final Hugging Face export); also the teacher's label."""
    path: str | None = None
    """A Hugging Face export folder (config.json + safetensors) or a trex checkpoint folder (its hf/ export,
    else its newest completed step with one, checkpoint.exportHfEvery), or one step-N folder of it."""
    weight: float = Field(default=1.0, gt=0, le=1e6)
    """w_i: this teacher's reverse-KL weight in the loss sum_i w_i KL(student || teacher_i)."""
    items: str | None = None
    """The prompts this teacher scores: a shell-style pattern matched against each prompt's id and its category
    (an ORData family such as "diet", a benchmark's type); unset = every prompt. Every prompt needs a teacher."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return None if v is None else check_dns1123_label(v, "")

    @model_validator(mode="after")
    def _source(self) -> TeacherConfig:
        if self.name is None and self.path is None:
            raise ValueError("name: give name (a TrainJob) or path (a model folder)")
        return self

    @property
    def label(self) -> str:
        """How prompts name this teacher and metrics label it."""
        return self.name if self.name is not None else str(self.path)


class OPDSampling(TrexModel):
    """How the student samples its own responses to the prompts (trex.trainer.rollout)."""

    temperature: float = Field(default=1.0, ge=0, le=100)
    """Sampling temperature (0 = greedy)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus mass (1 = off)."""
    top_k: int = Field(default=0, ge=0, le=1_048_576)
    """Top-k (0 = off)."""
    max_new_tokens: int = Field(default=64, gt=0, le=1_048_576)
    """Response length cap (tokens)."""
    stop_tokens: list[int] = Field(default_factory=list)
    """Token ids ending a response (kept as its last token)."""


class OPDConfig(TrexModel):
    """On-policy distillation (mode opd): the student samples responses to prompts and minimises
    sum_i w_i KL(p_student || p_teacher_i) over the response tokens, exactly over the whole vocabulary."""

    teachers: list[TeacherConfig] = Field(default_factory=list, max_length=64)
    """Teachers (at least one with mode opd); each scores the prompts its ``items`` pattern selects."""
    estimator: Literal["full-vocab", "sampled-token"] = "full-vocab"
    """full-vocab: the exact KL over the vocabulary (chunked, fused with both heads); sampled-token: the
    log-ratio at the sampled token with its score-function gradient (for comparison)."""
    prompts_per_step: int = Field(default=4, gt=0, le=65_536)
    """Prompts per optimizer step."""
    samples_per_prompt: int = Field(default=2, gt=0, le=1024)
    """Responses sampled per prompt."""
    sampling: OPDSampling = Field(default_factory=OPDSampling)
    """Sampling of the responses."""
    chunk_size: int = Field(default=1024, gt=0, le=1_048_576)
    """Tokens per chunk of the fused KL ([chunkSize, V] logits per model at a time)."""
    cache_bytes: int = Field(default=1 << 30, ge=0)
    """Host memory for the teachers' cached hidden states; beyond it they spill to disk."""
    cache_dir: str | None = None
    """Spill folder of the hidden-state cache (unset = <checkpoint.dir>/teacher-cache)."""
    prompt_format: str = "ordata"
    """Format of data.train's prompt records, as for mode grpo: ordata (an ORDataJob's prompts rendering) or a
    benchmark format `trex eval` reads (nl4opt, mamo, optibench, industryor, optmath)."""
    prompt_set: str = "trex"
    """Prompt set of the user turn (trex.prompt_contract; the one SFT samples and `trex eval` use)."""
    wal_fsync_every: int = Field(default=64, ge=0)
    """Rollout log: fsync after this many tokens (0 = at the end of each rollout only), as grpo.walFsyncEvery."""

    @model_validator(mode="after")
    def _check(self) -> OPDConfig:
        check_prompt_source(self.prompt_format, self.prompt_set)
        labels = [t.label for t in self.teachers]
        for i, label in enumerate(labels):
            if label in labels[:i]:
                raise ValueError(f"teachers.{i}: teacher {label!r} is listed twice")
        return self


class RolloutConfig(TrexModel):
    """Where mode grpo and mode opd sample: in process (the trainer's own model, the reference engine) or on vLLM
    servers fed with the trainer's weights after every optimizer step (trex.trainer.rollout.vllm_engine)."""

    engine: Literal["inprocess", "vllm"] = "inprocess"
    """inprocess: batched KV-cache decoding of the trainer's model; vllm: the servers below."""
    servers: list[str] = Field(default_factory=list, max_length=1024)
    """Base URLs of the vLLM servers (http://host:port; started in dev mode, VLLM_SERVER_DEV_MODE=1)."""
    spawn_local: bool = False
    """Start one vLLM server on 127.0.0.1 from ``vllmVenv`` instead of connecting to ``servers``."""
    vllm_venv: str = ".venv-vllm"
    """The vLLM environment ``spawnLocal`` starts the server from (scripts/vllm-venv.sh makes it)."""
    max_model_len: int = Field(default=2048, gt=0, le=1_048_576)
    """``spawnLocal``: the server's context length (prompt + response)."""
    weights_dir: str | None = None
    """Folder of the per-version weight exports, readable by the servers at the same path (unset =
    <checkpoint.dir>/rollout-weights)."""
    weight_push: Literal["disk", "transfer"] = "disk"
    """How each step's weights reach the servers. disk: the sharded Hugging Face export into a step folder, reloaded
    by every server (reload_weights; works everywhere, CPU included). transfer: the same tensors in buckets through
    vLLM's weight-transfer API over NCCL, nothing on disk (servers started with --weight-transfer-config
    '{"backend": "nccl"}'; trainer and servers on GPUs; trex.trainer.rollout.weight_transfer)."""
    transfer_bucket_bytes: int = Field(default=1 << 30, gt=0)
    """weightPush transfer: bytes per bucket, one /update_weights request and one packed broadcast each (a larger
    tensor goes alone). Trainer rank 0 holds one bucket at a time, each server worker up to two."""
    keep_weights: int = Field(default=1, ge=1, le=1000)
    """Weight folders kept (the newest)."""
    concurrency: int = Field(default=64, gt=0, le=65_536)
    """Requests in flight at once over all servers."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Limit of one request (a completion, a reload)."""
    segment_tokens: int = Field(default=64, ge=0, le=1_048_576)
    """Tokens per completion request: a sample is generated in segments, each seeded by its start, so a request cut
    at temperature > 0 continues from the token log drawing what an uninterrupted run draws (0: one request per
    response; a cut one then re-draws its logged tokens from the start)."""
    retry_seconds: float = Field(default=600.0, gt=0)
    """How long a cut request waits for a server to answer /health again before the rollout fails."""
    tis_cap: float | None = Field(default=None, gt=0)
    """mode grpo: truncated importance sampling, each token's loss weighted by min(pi_trainer / pi_rollout, tisCap)
    against the gap between the engine's and the trainer's log-probs of the same policy (unset = off)."""
    mismatch_alert: float = Field(default=0.05, gt=0)
    """The rollout_logprob_mismatch_alert gauge is 1 when the mean |trainer - engine| log-prob exceeds this."""

    @model_validator(mode="after")
    def _check(self) -> RolloutConfig:
        if self.engine == "vllm" and not self.servers and not self.spawn_local:
            raise ValueError("servers: engine vllm needs at least one server URL (or spawnLocal: true)")
        if self.weight_push == "transfer" and self.spawn_local:
            raise ValueError("weightPush: 'transfer' sends over NCCL to servers on GPUs; spawnLocal starts a CPU "
                             "server (no NCCL there): use weightPush: disk")
        for i, url in enumerate(self.servers):
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"servers.{i}: {url!r} is not an http(s) URL")
        return self


class TrainerConfig(TrexModel):
    """One training run."""

    mode: Literal["pretrain", "cpt", "sft", "grpo", "opd"] = "pretrain"
    """pretrain, continued pretraining, supervised fine-tuning, GRPO with verified rewards (prompts and truths in
    data.train), or on-policy distillation."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """Model shape."""
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig)
    """Parallel degrees."""
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    """Optimizers and schedule."""
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    """Expert balancing and MTP weights."""
    stability: SpikeConfig = Field(default_factory=SpikeConfig)
    """Spike detection and anticipatory routing."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Training data."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Checkpoints."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """Logging and metrics."""
    kernels: KernelsConfig = Field(default_factory=KernelsConfig)
    """Tuned kernels replacing RMSNorm, clamped SwiGLU, half-split RoPE, router top-k and the grouped expert GEMM
    where the registry has them."""
    max_steps: int = Field(default=100, gt=0, le=100_000_000)
    """Optimizer steps to run."""
    seed: int = Field(default=0, ge=0)
    """Model initialisation and dropout seed."""
    device: Literal["auto", "npu", "cuda", "cpu"] = "auto"
    """Device: auto picks npu > cuda > cpu."""
    deterministic: bool = False
    """Deterministic kernels (slower; bit-identical resume on CPU)."""
    recompute: Literal["none", "selective", "full"] = "none"
    """Activation recompute (torch.utils.checkpoint): selective recomputes the attention and the routed
    experts (with their token dispatch) in the backward, full every transformer block."""
    activation_offload: bool = False
    """With recompute full: the block inputs it keeps move to host memory after the forward and stream back for the
    backward (pinned buffers and a side copy stream on accelerators), so the device holds one or two of them."""
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    """mode grpo: rollouts, rewards and the GRPO objective."""
    opd: OPDConfig = Field(default_factory=OPDConfig)
    """On-policy distillation (mode opd): teachers, estimator, prompts and sampling."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """The rollout engine of modes grpo and opd."""

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        if self.routing.mtp_weight_drop_step is None:
            start = lr_decay_start(self.optimizer.schedule)
            self.routing.mtp_weight_drop_step = NEVER if start is None else start
        if self.mode == "opd" and not self.opd.teachers:
            raise ValueError("opd.teachers: at least one teacher is required when mode is 'opd'")
        if self.mode not in ("grpo", "opd") and self.data.global_batch_size % self.data.micro_batch_size:
            raise ValueError(
                f"data.globalBatchSize: {self.data.global_batch_size} must be a multiple of "
                f"data.microBatchSize ({self.data.micro_batch_size})"
            )
        return self


NEVER = 2**62
"""A step no run reaches (mtpWeightDropStep when the schedule never decays)."""


def lr_decay_start(schedule: ScheduleConfig) -> int | None:
    """First step of the LR decay (None when the schedule does not decay)."""
    return None if schedule.decay == "none" else schedule.warmup_steps + schedule.constant_steps


def resolved_model_values(cfg: ModelConfig) -> dict[str, object]:
    """The model's effective shape as a snake_case mapping (the memory plan, FLOP and kernel-shape counts read it):
    preset values with overrides applied."""
    return resolve_model_values(cfg.preset, cfg.overrides.model_dump())
