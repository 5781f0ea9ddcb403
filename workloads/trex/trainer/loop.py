"""The training loop: device, seed, data, model, optimizers, resume; then guarded steps, checkpoints, telemetry.

One optimizer step = gradient accumulation over micro-batches (batch ramp), NaN/Inf guard, global
clip, Muon + AdamW step at the scheduled LR, aux-loss-free expert-bias update from the summed expert
counts, spike detection (which switches anticipatory routing on for a window of steps), metrics, and
periodic checkpoints. Process groups are passed in, never taken from globals.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trex.runtime.device import (
    DeviceInfo,
    rng_state,
    seed_everything,
    select_device,
    set_deterministic,
    set_rng_state,
    supports_dtype,
)
from trex.trainer.build import build_checkpointer, build_layout, build_model_and_optimizers, ns_dtype
from trex.trainer.config import (
    GRPO_NEEDS_PROMPTS,
    OPD_NEEDS_PROMPTS,
    TrainerConfig,
    resolved_model_values,
    rl_layout_problems,
    support_problems,
)
from trex.trainer.data.build import build_data
from trex.trainer.data.loader import PackedLoader, SampleLoader
from trex.trainer.data.sources import DataError
from trex.trainer.kernels import install_for
from trex.trainer.optim.build import Optimizers, apply_hparams, clip_grad_norm, schedule_factor
from trex.trainer.optim.schedule import global_batch_at, micro_steps, seq_len_at
from trex.trainer.optim.swap import SwapOptimizers, SwapStats
from trex.trainer.rl.prompts import build_prompts
from trex.trainer.rl.reward import Verifier
from trex.trainer.rl.step import WAL_DIR, GRPORun, GRPOStats, default_verifier
from trex.trainer.spike import AnticipatoryRouting, SpikeDetector, finite

if TYPE_CHECKING:
    from trex.trainer.distill.run import OPDRanks, OPDRun
    from trex.trainer.parallel.decode import DecodeReplica


class ConfigProblem(ValueError):
    """A configuration value that cannot work; ``field`` is its dotted camelCase path."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path


def config_problems(cfg: TrainerConfig, dp: int = 1) -> list[tuple[str, str]]:
    """Cross-field checks the schema cannot express: batch sizes vs micro-batch x dp, sequence lengths."""
    out: list[tuple[str, str]] = []
    per_step = cfg.data.micro_batch_size * dp
    if cfg.mode not in ("grpo", "opd") and cfg.data.global_batch_size % per_step:  # promptsPerStep x samples
        out.append(("data.globalBatchSize", f"{cfg.data.global_batch_size} is not a multiple of "
                    f"microBatchSize x dp = {per_step}"))
    for i, r in enumerate(cfg.optimizer.batch_ramp):
        if r.global_batch_size % per_step:
            out.append((f"optimizer.batchRamp[{i}].globalBatchSize", f"{r.global_batch_size} is not a multiple of "
                        f"data.microBatchSize x dp = {per_step}"))
    max_len = int(str(resolved_model_values(cfg.model)["max_seq_len"]))
    if cfg.data.seq_len > max_len:
        out.append(("data.seqLen", f"{cfg.data.seq_len} exceeds the model's maxSeqLen {max_len}"))
    for i, c in enumerate(cfg.data.seq_len_curriculum):
        if c.seq_len > max_len:
            out.append((f"data.seqLenCurriculum[{i}].seqLen", f"{c.seq_len} exceeds the model's maxSeqLen {max_len}"))
    out.extend(support_problems(cfg))  # pp > 1 and opd: the rule `trex validate` applies too
    if cfg.mode == "opd":
        from trex.trainer.distill.run import opd_problems

        out.extend(opd_problems(cfg.opd))
    if cfg.data.tokenizer.path is not None and not Path(cfg.data.tokenizer.path).is_file():
        out.append(("data.tokenizer.path", f"{cfg.data.tokenizer.path} does not exist"))
    if cfg.data.train is not None:
        from trex.trainer.data.sources import DataError, jsonl_files

        try:
            jsonl_files(cfg.data.train)
        except DataError as e:
            out.append(("data.train", str(e).removeprefix("data.train: ")))
    if cfg.checkpoint.export_hf_every:
        from trex.trainer.hf import check_hf_compatible
        from trex.trainer.model import ModelArgs

        try:
            check_hf_compatible(ModelArgs.from_config(cfg.model))
        except ValueError as e:
            out.append(("checkpoint.exportHfEvery", f"this model has no Hugging Face export: {e}"))
    if cfg.checkpoint.init_from_hf is not None and not Path(cfg.checkpoint.init_from_hf).is_dir():
        out.append(("checkpoint.initFromHf", f"{cfg.checkpoint.init_from_hf} is not a directory"))
    if cfg.mode == "grpo" and cfg.data.train is None:
        out.append(("data.train", GRPO_NEEDS_PROMPTS))
    if cfg.mode == "opd" and cfg.data.train is None:
        out.append(("data.train", OPD_NEEDS_PROMPTS))
    p = cfg.parallelism
    if p.dp is not None and p.dp != dp:
        out.append(("parallelism.dp", f"{p.dp} does not match the {dp} data-parallel rank(s) of this run"))
    return out


@dataclass
class StepRecord:
    """Metrics of one optimizer step."""

    step: int
    loss: float
    parts: dict[str, float]
    grad_norm: float
    lr: dict[str, float]
    tokens: int
    seconds: float
    skipped: bool
    spike: bool
    anticipatory: bool
    load_cv: float
    seq_len: int
    global_batch: int
    compute_seconds: float = 0.0
    """Data, forward and backward of all micro-batches."""
    optimizer_seconds: float = 0.0
    """Gradient sync, clipping, optimizer step and expert-bias update."""
    swap: SwapStats | None = None
    """The swap optimizer's transfers in this step (None: swap off or the step was skipped)."""
    grpo: GRPOStats | None = None
    """mode grpo: rewards, KL, clipping, lengths, verifier outcomes and the rollout / verify / train split."""
    opd: OPDStepInfo | None = None
    """Distillation statistics (mode opd)."""


@dataclass(frozen=True)
class OPDStepInfo:
    """What an opd step adds to the record: its OPDStats and the teacher pool's counters."""

    kl: dict[str, float]
    entropy: float
    response_length: float
    seconds: dict[str, float]
    cache_hit_bytes: int
    cache_spilled_bytes: int
    teacher_switches: int
    teacher_loads: int


@dataclass
class TrainResult:
    """How a run ended."""

    final_step: int
    loss: float | None
    mfu: float | None
    last_checkpoint: int | None
    skipped_steps: int
    spikes: int
    interrupted: bool = False
    history: list[StepRecord] = field(default_factory=list)


def load_cv(counts: torch.Tensor) -> float:
    """Mean over MoE layers of std/mean of per-expert token counts (0 = perfectly balanced)."""
    if counts.numel() == 0:
        return 0.0
    c = counts.double()
    mean = c.mean(-1).clamp(min=1e-12)
    return float((c.std(-1, unbiased=False) / mean).mean())


@dataclass
class Telemetry:
    """Prometheus gauges, the JSONL log and the MFU denominator of one run."""

    exporter: Any
    jsonl: Any
    job: str
    device_label: str
    convention: str
    flops_per_token: float
    peak_flops: float
    peak_source: str

    def record(self, rec: StepRecord, mfu: float, last_ckpt: int | None) -> None:
        """Publish one step."""
        e, job = self.exporter, self.job
        e.metric("trex_train_step", job_name=job).set(rec.step)
        if not rec.skipped:
            e.metric("trex_train_loss", job_name=job).set(rec.loss)
            e.metric("trex_train_grad_norm", job_name=job).set(rec.grad_norm)
        e.metric("trex_train_lr", job_name=job).set(rec.lr.get("muon", rec.lr.get("adamw", 0.0)))
        e.metric("trex_train_tokens_per_second", job_name=job).set(rec.tokens / max(rec.seconds, 1e-9))
        e.metric("trex_train_step_seconds", job_name=job).set(rec.seconds)
        e.metric("trex_train_mfu", job_name=job, device=self.device_label, flops_convention=self.convention).set(mfu)
        e.metric("trex_train_expert_load_cv", job_name=job).set(rec.load_cv)
        e.metric("trex_train_anticipatory_routing", job_name=job).set(1.0 if rec.anticipatory else 0.0)
        if rec.skipped:
            e.metric("trex_train_skipped_steps_total", job_name=job).inc()
        if rec.spike:
            e.metric("trex_train_spikes_total", job_name=job).inc()
        if last_ckpt is not None:
            e.metric("trex_train_last_checkpoint_step", job_name=job).set(last_ckpt)
        swap = {}
        if rec.swap is not None:
            swap = {"swap_exposed_seconds": rec.swap.exposed_seconds, "swap_overlap_ratio": rec.swap.overlap_ratio,
                    "swap_device_bytes_saved": rec.swap.bytes_saved}
            for name, value in swap.items():
                e.metric(f"trex_train_{name}", job_name=job).set(value)
        opd = {}
        if rec.opd is not None:
            o = rec.opd
            for teacher, kl in o.kl.items():
                e.metric("trex_train_opd_kl", job_name=job, teacher=teacher).set(kl)
            e.metric("trex_train_opd_student_entropy", job_name=job).set(o.entropy)
            e.metric("trex_train_opd_cache_hit_bytes_total", job_name=job).inc(o.cache_hit_bytes)
            e.metric("trex_train_opd_cache_spilled_bytes_total", job_name=job).inc(o.cache_spilled_bytes)
            e.metric("trex_train_opd_teacher_switches", job_name=job).set(o.teacher_switches)
            opd = {**{f"opd_kl_{t}": v for t, v in o.kl.items()}, "opd_entropy": o.entropy,
                   "opd_response_length": o.response_length,
                   **{f"opd_{k}_seconds": v for k, v in o.seconds.items()},
                   "opd_cache_hit_bytes": o.cache_hit_bytes, "opd_cache_spilled_bytes": o.cache_spilled_bytes,
                   "opd_teacher_switches": o.teacher_switches, "opd_teacher_loads": o.teacher_loads}
        rl: dict[str, float] = {}
        if rec.grpo is not None:
            rl = grpo_record(rec.grpo)
            for name, value in rl.items():
                e.metric(f"trex_train_{name}", job_name=job).set(value)
            for outcome, n in rec.grpo.outcomes.items():
                e.metric("trex_train_verifier_outcomes_total", job_name=job, outcome=outcome).inc(n)
        self.jsonl.write({
            "step": rec.step, "loss": rec.loss, **{f"loss_{k}": v for k, v in rec.parts.items()},
            "grad_norm": rec.grad_norm, **{f"lr_{k}": v for k, v in rec.lr.items()}, "tokens": rec.tokens,
            "step_seconds": rec.seconds, "compute_seconds": rec.compute_seconds,
            "optimizer_seconds": rec.optimizer_seconds, "tokens_per_second": rec.tokens / max(rec.seconds, 1e-9), "mfu": mfu,
            "skipped": rec.skipped, "spike": rec.spike, "anticipatory": rec.anticipatory,
            "expert_load_cv": rec.load_cv, "seq_len": rec.seq_len, "global_batch": rec.global_batch, **swap, **rl, **opd,
            **({"verifier_outcomes": rec.grpo.outcomes} if rec.grpo is not None else {}),
        })


def grpo_record(st: GRPOStats) -> dict[str, float]:
    """A GRPO step's gauges (trex_train_<name>) and JSONL fields."""
    return {"reward_mean": st.reward_mean, "reward_std": st.reward_std, "kl": st.kl,
            "clip_fraction": st.clip_fraction, "response_length": st.response_length,
            "rollout_seconds": st.rollout_seconds, "verify_seconds": st.verify_seconds,
            "rl_train_seconds": st.train_seconds}


class Trainer:
    """Owns one run's objects. ``group`` is the job's world process group (None: single process); the
    parallel layout (trex.trainer.parallel) comes from config.parallelism and the world size. ``verifier``
    (mode grpo) replaces the OR verifier the config describes."""

    def __init__(self, cfg: TrainerConfig, out_dir: str | Path = ".", *, group: Any = None,
                 log: Callable[[str], None] | None = None, job_name: str = "local", metrics_port: int | None = None,
                 measure_peak: bool = True, verifier: Verifier | None = None) -> None:
        import torch.distributed as dist

        from trex.trainer.parallel.mesh import ParallelDims, dense_coordinates

        self.group = group
        self.world = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        try:
            self.dims = ParallelDims.from_config(cfg, self.world)
        except ValueError as e:
            field_path, _, rest = str(e).partition(": ")
            raise ConfigProblem(field_path, rest) from None
        self.dp_rank, _tp_rank = dense_coordinates(self.dims, self.rank)  # tp ranks read the same batch
        problems = config_problems(cfg, dp=self.dims.dp) + rl_layout_problems(cfg, self.world)
        if problems:
            raise ConfigProblem(*problems[0])
        self.cfg = cfg
        self.compute_dtype = "bf16" if "bf16" in (cfg.model.dtype, cfg.model.autocast) else "fp32"
        """The GEMM dtype of forward and backward (bf16 parameters or bf16 autocast), for the MFU peak."""
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.job = job_name
        out = Path(out_dir)
        ckpt = Path(cfg.checkpoint.dir)
        self.ckpt_dir = ckpt if ckpt.is_absolute() else out / ckpt
        self.device: DeviceInfo = select_device(cfg.device, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
        if not supports_dtype(self.device.kind, cfg.model.dtype):
            raise ConfigProblem("model.dtype", f"{cfg.model.dtype} is not supported on {self.device.kind}")
        set_deterministic(cfg.deterministic, self.device.kind)
        seed_everything(cfg.seed, self.device.kind)
        self.layout = build_layout(self.dims, self.world, self.device.kind)
        self.meshes = self.layout.meshes
        self.dp_group: Any = self.layout.dp_group
        self.parallel: Any = None
        self.reference: nn.Module | None = None
        try:
            self.loader: PackedLoader | SampleLoader | None = None
            self.grpo: GRPORun | None = None
            self.opd: OPDRun | None = None
            vocab = int(str(resolved_model_values(cfg.model)["vocab_size"]))
            self.replica: DecodeReplica | None = None
            """The whole model rollouts decode on under tensor / expert parallelism (modes grpo and opd)."""
            self.tp_group: Any = None
            """The tp ranks sharing this rank's batch (they split its rollouts), None when tp = 1."""
            if cfg.mode in ("grpo", "opd"):
                self.tokenizer, items = build_prompts(cfg, self.ckpt_dir.parent / "tokenizer", vocab)
                self.format = "prompts"
                self.replica, self.tp_group = self._sampling_layout()
            if cfg.mode == "grpo":
                self.grpo = GRPORun(cfg, self.tokenizer, items, verifier or default_verifier(cfg),
                                    self.ckpt_dir / WAL_DIR, self.dp_rank, self.dims.dp, self._sum_over_ranks,
                                    self.tp_group)
            elif cfg.mode == "opd":
                self.opd = self._opd_run(items, vocab)
            else:
                self.tokenizer, self.loader, self.format = build_data(cfg.data, self.ckpt_dir.parent / "tokenizer",
                                                                      vocab)
        except DataError as e:
            raise ConfigProblem("data.train", str(e)) from None
        except ValueError as e:
            field_path, sep, rest = str(e).partition(": ")
            if sep and field_path.startswith("data."):
                raise ConfigProblem(field_path, rest) from None
            raise
        self.model, self.opts = self._fresh()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.detector = SpikeDetector(cfg.stability.window, cfg.stability.z_threshold, cfg.stability.warmup_steps,
                                      cfg.stability.cooldown_steps)
        self.anticipatory = self._anticipatory()
        self.ckpt = build_checkpointer(cfg, self.ckpt_dir, group, self.log)
        self.step = 0
        self.skipped = 0
        self.spikes = 0
        self.tokens_seen = 0
        self.last_checkpoint: int | None = None
        self._stop = False
        self.telemetry = self._telemetry(out, metrics_port, measure_peak) if self.rank == 0 else None
        self.kernels = install_for(cfg, self.device.kind, self.log)
        if self.telemetry is not None:
            self.kernels.export(self.telemetry.exporter, self.job)

    # --- construction -------------------------------------------------------------------------
    def _fresh(self) -> tuple[nn.Module, Optimizers]:
        built = build_model_and_optimizers(self.cfg, self.device, self.layout)
        self.parallel = built.parallel
        return built.model, built.opts

    def _opd_run(self, items: list[Any], vocab: int) -> OPDRun:
        """The prompts' teachers, the teacher pool and the sampling of mode opd (problems named by their field)."""
        from trex.runtime.device import torch_dtype
        from trex.trainer.distill.run import OPDRun

        try:
            return OPDRun(self.cfg, self.tokenizer, items, self.device.torch_device(), torch_dtype(self.cfg.model.dtype),
                          self.ckpt_dir, vocab, self._opd_ranks())
        except ValueError as e:
            field_path, _, rest = str(e).partition(": ")
            raise ConfigProblem(field_path, rest) from None

    def _sampling_layout(self) -> tuple[DecodeReplica | None, Any]:
        """The decoding replica (tensor / expert parallelism) and the tp group of the sampling modes."""
        from trex.runtime.device import torch_dtype
        from trex.trainer.model import ModelArgs
        from trex.trainer.parallel.decode import DecodeReplica, needs_replica

        if self.meshes is None:
            return None, None
        replica = (DecodeReplica(ModelArgs.from_config(self.cfg.model), self.device.torch_device(),
                                 torch_dtype(self.cfg.model.dtype)) if needs_replica(self.dims) else None)
        return replica, self.meshes.dense["tp"].get_group() if self.dims.tp > 1 else None

    def _opd_ranks(self) -> OPDRanks:
        """Where this rank of a parallel opd run stands: its data-parallel share, the layout the teachers are
        distributed by, the vocabulary-parallel KL over tp, and the decoding replica."""
        from trex.trainer.distill.opd import VocabParallel
        from trex.trainer.distill.run import OPDRanks
        from trex.trainer.distill.teacher import TeacherLayout

        if self.meshes is None:
            return OPDRanks()
        from trex.trainer.distill.kl import shard_rows
        from trex.trainer.parallel.parallelize import shared_over_tp

        tp_mesh, tp_group = self.meshes.dense["tp"], self.tp_group
        vocab = None
        if tp_group is not None:
            vocab = VocabParallel(tp_group, lambda w: shard_rows(shared_over_tp(w, tp_mesh), tp_group))
        return OPDRanks(self.dp_rank, self.dims.dp, self._sum_over_ranks, TeacherLayout(self.dims, self.meshes, tp_group),
                        vocab, self.replica, tp_group)

    def _anticipatory(self) -> AnticipatoryRouting:
        model: Any = self.model
        s = self.cfg.stability
        return AnticipatoryRouting(model.moe_gates, model.set_anticipatory_router_weights, s.anticipatory_delta,
                                   s.anticipatory_window)

    def _telemetry(self, out: Path, port: int | None, measure_peak: bool) -> Telemetry:
        from trex.telemetry.exporter import Exporter
        from trex.telemetry.jsonl import JsonlLog
        from trex.trainer import mfu as mfu_mod

        exporter = Exporter()
        if port is not None:
            self.log(f"metrics on :{exporter.serve(port)}/metrics")
        jsonl_path = Path(self.cfg.logging.jsonl) if self.cfg.logging.jsonl else self.ckpt_dir / "metrics.jsonl"
        fpt = self._fpt(self.cfg.data.seq_len)
        peak, source = mfu_mod.peak_flops(self.device, measure_peak, dtype=self.compute_dtype)
        convention = str(mfu_mod.FLOPS_CONVENTION)
        label = f"{self.device.kind}:{self.device.name}"
        exporter.metric("trex_train_peak_flops", job_name=self.job, device=label, source=source).set(peak)
        exporter.metric("trex_train_flops_per_token", job_name=self.job, flops_convention=convention).set(fpt)
        exporter.metric("trex_train_max_steps", job_name=self.job).set(self.cfg.max_steps)
        for counter in ("trex_train_skipped_steps_total", "trex_train_spikes_total"):
            exporter.metric(counter, job_name=self.job)  # from 0: "none so far" is data, not a gap
        self.log(f"device {label}; peak {peak / 1e12:.3f} TFLOP/s ({source}); {fpt / 1e6:.2f} MFLOP/token ({convention})")
        return Telemetry(exporter, JsonlLog(jsonl_path), self.job, label, convention, fpt, peak, source)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state on CPU, gathered from any layout (a collective on every rank; ranks other
        than 0 get an empty mapping when the model is distributed)."""
        if self.meshes is None:
            return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        on = self.opts.masters_on_device() if isinstance(self.opts, SwapOptimizers) else contextlib.nullcontext()
        with on:  # the gathers run on the device backend
            state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}

    def export_model(self) -> nn.Module | None:
        """A plain (undistributed) copy of the model for the Hugging Face export: the model itself in one
        process; with a distributed model, a CPU copy on rank 0 and None elsewhere (call on every rank)."""
        if self.meshes is None:
            return self.model
        state = self.full_state_dict()
        if self.rank != 0:
            return None
        from trex.runtime.device import torch_dtype
        from trex.trainer.model import build_model

        plain = build_model(self.cfg.model, device="meta", dtype=torch_dtype(self.cfg.model.dtype), seed=self.cfg.seed)
        plain = plain.to_empty(device="cpu")
        plain.load_state_dict(state)  # copies cast the fp32 masters to the model dtype
        return plain

    def _exporter(self) -> Callable[[Path], None] | None:
        """The checkpoint's before-commit hook writing a Hugging Face export into it (modelFrom.step)."""
        if not self.cfg.checkpoint.export_hf_every:
            return None
        from trex.trainer.export import staged_export

        return staged_export(self, self.ckpt.root / f"hf-step-{self.step:08d}")  # every rank writes its part now

    # --- state --------------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        """Everything besides model and optimizers that a bit-identical resume needs."""
        return {"step": self.step, "data": self.loader.state_dict() if self.loader is not None else {}, "spike": self.detector.state_dict(),
                "anticipatory": self.anticipatory.state_dict(), "rng": rng_state(self.device.kind),
                "counters": {"skipped": self.skipped, "spikes": self.spikes, "tokens": self.tokens_seen},
                "scheduler": {"step": self.step}}

    def save(self) -> None:
        """Checkpoint the current step."""
        self.ckpt.save(self.step, self.model, self.opts.all(), self.extra_state(),
                       before_commit=self._exporter())
        self.last_checkpoint = self.step
        if self.telemetry is not None:
            e = self.telemetry.exporter
            e.metric("trex_train_last_checkpoint_step", job_name=self.job).set(self.step)
            e.metric("trex_train_last_checkpoint_timestamp_seconds", job_name=self.job).set(time.time())

    def resume(self) -> bool:
        """Load the newest verified checkpoint (falling back past corrupt ones); True when one was loaded."""
        def rebuild() -> tuple[nn.Module, list[torch.optim.Optimizer]]:
            self.model, self.opts = self._fresh()
            return self.model, self.opts.all()

        loaded, _, _ = self.ckpt.load_latest(self.model, self.opts.all(), rebuild=rebuild)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.anticipatory = self._anticipatory()
        if loaded is None:
            return False
        # Optimizer states come from the checkpoint; hyper-parameters from the current config.
        apply_hparams(self.opts, self.cfg.optimizer, ns_dtype(self.cfg, self.device.kind))
        if isinstance(self.opts, SwapOptimizers):
            self.opts.restored()  # the loaded states and masters go to host memory now, not at the first step
        x = loaded.extra
        self.step = int(x["step"])
        if self.loader is not None:
            self.loader.load_state_dict(x["data"])
        self.detector.load_state_dict(x["spike"])
        self.anticipatory.load_state_dict(x["anticipatory"])
        set_rng_state(x["rng"], self.device.kind)
        self.skipped = int(x["counters"]["skipped"])
        self.spikes = int(x["counters"]["spikes"])
        self.tokens_seen = int(x["counters"]["tokens"])
        self.last_checkpoint = self.step
        self.log(f"resumed from {loaded.path} (step {self.step})")
        return True

    # --- one step -----------------------------------------------------------------------------
    def train_step(self) -> StepRecord:
        """One optimizer step (with accumulation, guard, clipping, bias update and spike handling)."""
        from trex.trainer.model import update_expert_bias

        cfg, s = self.cfg, self.step
        t0 = time.perf_counter()
        self.anticipatory.snapshot()
        anticipatory = self.anticipatory.prepare(s)
        grpo: GRPOStats | None = None
        opd: OPDStepInfo | None = None
        if self.grpo is not None:
            parts_sum, counts, total_valid, tokens, seq_len, gbatch, grpo = self._grpo_backward(s)
            loss_key = "grpo"
        elif self.opd is not None:
            parts_sum, counts, total_valid, tokens, seq_len, gbatch, opd = self._opd_backward(s)
            loss_key = "opd"
        else:
            parts_sum, counts, total_valid, tokens, seq_len, gbatch = self._lm_backward(s)
            loss_key = "lm"
        model: Any = self.model
        dev = self.device.torch_device()
        t_compute = time.perf_counter()
        if self.meshes is not None:
            from trex.trainer.parallel.grads import clip_grads

            keys = sorted(set(parts_sum) | {"lm", "mtp", "balance", "indexer", "total"})
            parts_sum = dict(zip(keys, self._sum_over_ranks([parts_sum.get(k, 0.0) for k in keys]), strict=True))
            if counts is None:
                counts = torch.zeros(model.args.n_moe_layers, model.args.n_routed_experts, dtype=torch.long,
                                     device=dev)
            grad_norm = clip_grads(self.params, cfg.optimizer.grad_clip)
        else:
            grad_norm = clip_grad_norm(self.params, cfg.optimizer.grad_clip)
        lm_loss = parts_sum.get(loss_key, float("nan")) if total_valid > 0 else float("nan")
        skipped = not finite(lm_loss, parts_sum.get("total", lm_loss), grad_norm)
        spike = False
        self.opts.set_lr_factor(schedule_factor(cfg.optimizer, s, cfg.max_steps))
        if skipped:
            self.skipped += 1
            why = ("no loss tokens in the global batch" if total_valid == 0 else
                   f"non-finite loss or gradient norm (loss={lm_loss}, grad_norm={grad_norm})")
            self.log(f"step {s}: {why}; step skipped")
        else:
            self.opts.step()
            if counts is not None and counts.numel():
                update_expert_bias(model, counts, cfg.routing.bias_update_speed, group=self.group)
                if self.group is not None:  # the same global counts for the load statistics
                    import torch.distributed as dist

                    dist.all_reduce(counts, group=self.group)
            # GRPO and OPD losses are no language-model loss (their level moves with the rewards or the
            # teachers), so no spike detection.
            if cfg.stability.enabled and loss_key == "lm" and self.detector.observe(s, lm_loss):
                spike = True
                self.spikes += 1
                self.anticipatory.trigger(s)
                self.log(f"step {s}: loss spike ({lm_loss:.4f}); anticipatory routing for "
                         f"{cfg.stability.anticipatory_window} steps (Δt={cfg.stability.anticipatory_delta})")
        self.opts.zero_grad()
        t_end = time.perf_counter()
        self.tokens_seen += tokens
        self.step += 1
        return StepRecord(step=self.step, loss=lm_loss, parts=parts_sum, grad_norm=grad_norm, lr=self.opts.lr(),
                          tokens=tokens, seconds=t_end - t0, skipped=skipped, spike=spike,
                          anticipatory=anticipatory, load_cv=load_cv(counts) if counts is not None else 0.0,
                          seq_len=seq_len, global_batch=gbatch, compute_seconds=t_compute - t0,
                          optimizer_seconds=t_end - t_compute,
                          swap=self.opts.last if isinstance(self.opts, SwapOptimizers) and not skipped else None,
                          grpo=grpo, opd=opd)

    def _lm_backward(self, s: int) -> tuple[dict[str, float], torch.Tensor | None, float, int, int, int]:
        """Forward and backward of the language-model loss over the step's micro-batches (batch ramp, sequence
        curriculum). Returns (loss parts, expert counts, valid tokens over all ranks, tokens, seqLen, batch)."""
        from trex.trainer.model import compute_loss

        cfg, model, dev = self.cfg, self.model, self.device.torch_device()
        seq_len = seq_len_at(s, [(c.step, c.seq_len) for c in cfg.data.seq_len_curriculum], cfg.data.seq_len)
        gbatch = global_batch_at(s, [(r.step, r.global_batch_size) for r in cfg.optimizer.batch_ramp],
                                 cfg.data.global_batch_size)
        dp = self.dims.dp
        n_micro = micro_steps(gbatch, cfg.data.micro_batch_size, dp)
        assert self.loader is not None
        batches = [self.loader.next_batch(cfg.data.micro_batch_size, seq_len, self.dp_rank, dp)
                   for _ in range(n_micro)]
        # Token-weighted mean over the whole global batch: micro-batch i weighs (its loss tokens) / (all of
        # them on every rank), so SFT batches with few assistant tokens do not count as much as full ones.
        valid = [float(b["loss_mask"].sum()) for b in batches]
        total_valid = self._sum_over_ranks([sum(valid)])[0]
        counts: torch.Tensor | None = None
        parts_sum: dict[str, float] = {}
        for batch_cpu, n_valid in zip(batches, valid, strict=True):
            # In one process a micro-batch without loss tokens is skipped; across ranks it still runs (with
            # weight 0 and its expert counts left out) because its forward and backward hold collectives.
            if n_valid == 0 and (self.meshes is None or total_valid == 0):
                continue
            weight = n_valid / total_valid
            batch = {k: v.to(dev) for k, v in batch_cpu.items()}
            with self._autocast(dev):
                out = model(batch["input_ids"], batch["position_ids"], batch["doc_ids"], logits=False)
                loss, parts = compute_loss(out, batch["labels"], batch["loss_mask"], cfg.routing, s)
            torch.autograd.backward(loss * weight)
            c = out.expert_counts.detach() * (1 if n_valid else 0)
            counts = c if counts is None else counts + c
            for k, v in parts.items():
                parts_sum[k] = parts_sum.get(k, 0.0) + v * weight
        tokens = cfg.data.micro_batch_size * n_micro * seq_len * dp
        return parts_sum, counts, total_valid, tokens, seq_len, gbatch

    def _grpo_backward(self, s: int) -> tuple[dict[str, float], torch.Tensor | None, float, int, int, int,
                                              GRPOStats]:
        """mode grpo: rollouts of the step's prompts with the current weights, their rewards, and the backward of
        the GRPO loss (trex.trainer.rl.step). Same returns as _lm_backward, plus the step's statistics."""
        run = self.grpo
        assert run is not None
        dev = self.device.torch_device()
        t0 = time.perf_counter()
        from trex.trainer.parallel.decode import decoding

        with decoding(self.model, self.replica) as model:
            rollouts, items = run.rollout(model, s)
        t1 = time.perf_counter()
        rewards = run.score(rollouts, items)
        t2 = time.perf_counter()
        parts, counts, loss_stats = run.backward(self.model, self.reference, rollouts, rewards, dev,
                                                 lambda: self._autocast(dev))
        t3 = time.perf_counter()
        stats = run.stats(rollouts, rewards, loss_stats, (t1 - t0, t2 - t1, t3 - t2))
        seq_len = max(len(r.prompt) + len(r.tokens) for r in rollouts)
        return ({**parts, "total": parts["grpo"]}, counts, float(stats.valid_tokens), stats.forward_tokens, seq_len,
                stats.responses, stats)

    def _opd_backward(self, s: int) -> tuple[dict[str, float], torch.Tensor | None, float, int, int, int,
                                             OPDStepInfo]:
        """mode opd: rollouts of the step's prompts with the current weights, the teachers' pass and the backward of
        the reverse KL (trex.trainer.distill). Same returns as _lm_backward, plus the step's statistics."""
        run = self.opd
        assert run is not None
        with self._autocast(self.device.torch_device()):
            stats = run.step(self.model, s)
        cache, teachers = run.pool.cache.take_stats(), run.pool.take_stats()
        info = OPDStepInfo(kl=stats.kl, entropy=stats.entropy, response_length=stats.response_length,
                           seconds=stats.seconds, cache_hit_bytes=cache.hit_bytes,
                           cache_spilled_bytes=cache.spilled_bytes, teacher_switches=teachers.switches,
                           teacher_loads=teachers.trunk_loads)
        parts = {"opd": stats.loss, "total": stats.loss}
        responses = self.cfg.opd.prompts_per_step * self.cfg.opd.samples_per_prompt
        return parts, stats.expert_counts, float(stats.tokens), stats.sequence_tokens, stats.seq_len, responses, info

    def _autocast(self, dev: torch.device) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast around forward and loss when model.autocast asks for it, else nothing."""
        if self.cfg.model.autocast == "bf16":
            return torch.autocast(dev.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        """Element-wise sum over the data-parallel ranks (identity in a single process)."""
        if self.dp_group is None:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.dp_group)
        return [float(v) for v in t.tolist()]

    # --- the run ------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Resume from the newest verified checkpoint, else initialise from Hugging Face weights when configured
        (mode grpo with a KL term: build the reference policy first)."""
        cfg = self.cfg
        if self.grpo is not None and cfg.grpo.kl_coef > 0:
            self.reference = self._reference()
        if cfg.checkpoint.resume and self.resume():
            return
        if cfg.checkpoint.init_from_hf:
            from trex.trainer.hf import load_hf_into, load_hf_sharded

            if self.meshes is None:
                load_hf_into(self.model, cfg.checkpoint.init_from_hf)  # type: ignore[arg-type]
            else:  # every rank reads the folder and keeps its own shards
                load_hf_sharded(self.model, cfg.checkpoint.init_from_hf)  # type: ignore[arg-type]
            if isinstance(self.opts, SwapOptimizers):
                self.opts.restored()  # masters loaded in host memory: cast their bf16 copies
            self.log(f"initialised from Hugging Face weights in {cfg.checkpoint.init_from_hf}")

    def _reference(self) -> nn.Module:
        """GRPO's frozen reference policy: the run's initial weights (its seed's initialisation, or
        checkpoint.initFromHf), rebuilt on every start so a resumed run keeps the same reference. One whole copy per
        process, in the model dtype."""
        from trex.runtime.device import torch_dtype
        from trex.trainer.model import build_model

        cfg = self.cfg
        ref = build_model(cfg.model, device=self.device.torch_device(), dtype=torch_dtype(cfg.model.dtype),
                          seed=cfg.seed)
        if cfg.checkpoint.init_from_hf:
            from trex.trainer.hf import load_hf_into

            load_hf_into(ref, cfg.checkpoint.init_from_hf)
        ref.requires_grad_(False)
        return ref.eval()

    def request_stop(self, *_: Any) -> None:
        """Finish the current step, checkpoint and return (SIGTERM handler)."""
        self._stop = True

    def _stop_agreed(self) -> bool:
        """Whether any rank was asked to stop (all ranks stop at the same step)."""
        if self.group is None:
            return self._stop
        import torch.distributed as dist

        flag = torch.tensor([1.0 if self._stop else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        self._stop = bool(flag.item() > 0)
        return self._stop

    def run(self, max_steps: int | None = None, progress: Any = None) -> TrainResult:
        """Train until ``max_steps`` (default config.maxSteps) or a stop request."""
        cfg = self.cfg
        total = max_steps or cfg.max_steps
        self.prepare()
        history: list[StepRecord] = []
        last_mfu: float | None = None
        last_loss: float | None = None
        since_log = 0
        while self.step < total and not self._stop_agreed():
            rec = self.train_step()
            history.append(rec)
            if not rec.skipped:
                last_loss = rec.loss
            if self.telemetry is not None:
                t = self.telemetry
                fpt = t.flops_per_token if rec.seq_len == cfg.data.seq_len else self._fpt(rec.seq_len)
                last_mfu = fpt * rec.tokens / max(rec.seconds, 1e-9) / (t.peak_flops * self.world)
                t.record(rec, last_mfu, self.last_checkpoint)
            if self.step % cfg.checkpoint.interval_steps == 0 or self.step == total:
                self.save()
            since_log += 1
            if progress is not None and (progress.tty or since_log >= cfg.logging.interval_steps or self.step == total):
                progress.update(since_log, loss=rec.loss, gnorm=rec.grad_norm,
                                tok_s=rec.tokens / max(rec.seconds, 1e-9), mfu=last_mfu or 0.0)
                since_log = 0
        interrupted = self._stop and self.step < total
        if interrupted and self.last_checkpoint != self.step:
            self.save()
        if self.telemetry is not None:
            self.telemetry.jsonl.close()
        if self.opd is not None:
            self.opd.close()
        return TrainResult(self.step, last_loss, last_mfu, self.last_checkpoint, self.skipped, self.spikes,
                           interrupted, history)

    def _fpt(self, seq_len: int) -> float:
        from trex.trainer import mfu as mfu_mod

        return float(mfu_mod.flops_per_token(resolved_model_values(self.cfg.model), seq_len))


def install_sigterm(trainer: Trainer) -> None:
    """SIGTERM (eviction, preemption) checkpoints after the current step and stops."""
    signal.signal(signal.SIGTERM, trainer.request_stop)


def finite_or_none(x: float | None) -> float | None:
    """None for missing or non-finite values (JSON-friendly summaries)."""
    return x if x is not None and math.isfinite(x) else None
