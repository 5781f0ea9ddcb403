"""The training loop: device, seed, the mode's objective, model, optimizers, resume; then guarded steps,
checkpoints, telemetry.

One optimizer step = the objective's forward and backward (trex.trainer.objective: gradient accumulation over
the step's micro-batches, whatever the mode), NaN/Inf guard, global clip, Muon + AdamW step at the scheduled
LR, aux-loss-free expert-bias update from the summed expert counts, spike detection (which switches
anticipatory routing on for a window of steps), metrics, and periodic checkpoints. Process groups are passed
in, never taken from globals.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from trex.runtime.device import (
    DeviceInfo,
    rng_state,
    seed_everything,
    select_device,
    set_deterministic,
    set_rng_state,
    supports_dtype,
)
from trex.telemetry.exporter import Exporter
from trex.telemetry.jsonl import JsonlLog
from trex.trainer import mfu as mfu_mod
from trex.trainer.build import build_checkpointer, build_layout, build_model_and_optimizers, ns_dtype
from trex.trainer.config import TrainerConfig, resolved_model_values
from trex.trainer.hf import load_hf_into, load_hf_sharded
from trex.trainer.kernels import install_for, tuned_vs_untuned
from trex.trainer.model import compute_loss, update_expert_bias
from trex.trainer.modes import build_objective
from trex.trainer.objective import RunContext, Series, load_cv
from trex.trainer.optim.build import Optimizers, apply_hparams, clip_grad_norm, schedule_factor
from trex.trainer.optim.swap import SwapStats
from trex.trainer.parallel.grads import clip_grads
from trex.trainer.parallel.mesh import ParallelDims, context_coordinate, dense_coordinates
from trex.trainer.phases import PhaseMeter
from trex.trainer.rules import ConfigProblem, job_problems
from trex.trainer.spike import AnticipatoryRouting, SpikeDetector, finite

if TYPE_CHECKING:
    from trex.trainer.rl.reward import Verifier


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
    metrics: dict[str, float] = field(default_factory=dict)
    """The objective's own JSONL fields (rewards, KL, ...; empty for lm)."""
    series: list[Series] = field(default_factory=list)
    """The objective's own Prometheus samples."""
    tallies: dict[str, dict[str, int]] = field(default_factory=dict)
    """The objective's counts by category (JSONL objects)."""
    stats: Any = None
    """The objective's typed statistics (GRPOStats for grpo, OPDStepInfo for opd, None for lm)."""


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
        for s in [*(Series(k, v) for k, v in swap.items()), *rec.series]:
            metric = e.metric(f"trex_train_{s.name}", job_name=job, **s.labels)
            if s.counter:
                metric.inc(s.value)
            else:
                metric.set(s.value)
        self.jsonl.write({
            "step": rec.step, "loss": rec.loss, **{f"loss_{k}": v for k, v in rec.parts.items()},
            "grad_norm": rec.grad_norm, **{f"lr_{k}": v for k, v in rec.lr.items()}, "tokens": rec.tokens,
            "step_seconds": rec.seconds, "compute_seconds": rec.compute_seconds,
            "optimizer_seconds": rec.optimizer_seconds, "tokens_per_second": rec.tokens / max(rec.seconds, 1e-9), "mfu": mfu,
            "skipped": rec.skipped, "spike": rec.spike, "anticipatory": rec.anticipatory,
            "expert_load_cv": rec.load_cv, "seq_len": rec.seq_len, "global_batch": rec.global_batch, **swap,
            **rec.metrics, **rec.tallies,
        })


class Trainer:
    """Owns one run's objects. ``group`` is the job's world process group (None: single process); the
    parallel layout (trex.trainer.parallel) comes from config.parallelism and the world size. ``verifier``
    (mode grpo) replaces the OR verifier the config describes. ``checked``: the caller already applied
    trex.trainer.rules.job_problems with ``local=True`` for this world (`trex train` does), so it is not run again."""

    def __init__(self, cfg: TrainerConfig, out_dir: str | Path = ".", *, group: Any = None,
                 log: Callable[[str], None] | None = None, job_name: str = "local", metrics_port: int | None = None,
                 measure_peak: bool = True, verifier: Verifier | None = None, checked: bool = False) -> None:
        self.group = group
        self.world = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        if not checked:
            problems = job_problems(cfg, self.world, local=True)
            if problems:
                raise ConfigProblem(*problems[0])
        self.dims = ParallelDims.from_config(cfg, self.world)
        self.dp_rank, _tp_rank = dense_coordinates(self.dims, self.rank)  # tp ranks read the same batch
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
        self.context = RunContext(cfg, self.device.torch_device(), self.dims, self.meshes, self.dp_rank,
                                  self.dp_group, self.ckpt_dir, self.rank, context_coordinate(self.dims, self.rank))
        self.objective = build_objective(self.context, verifier)
        """The mode's side of each step (trex.trainer.modes)."""
        self.tokenizer = self.objective.tokenizer
        self.model, self.opts = self._fresh()
        self.context.export = self._export_to
        self.context.weights = self._transfer_weights
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
        self.phases = PhaseMeter(getattr(torch, self.device.kind) if self.device.kind in ("cuda", "npu") else None)
        """Host peak, bytes read and written and seconds per phase (the termination summary's ``phases``)."""
        self.telemetry = self._telemetry(out, metrics_port, measure_peak) if self.rank == 0 else None
        self.kernels = install_for(cfg, self.device.kind, self.log)
        if self.telemetry is not None:
            self.kernels.export(self.telemetry.exporter, self.job)

    # --- construction -------------------------------------------------------------------------
    def _fresh(self) -> tuple[nn.Module, Optimizers]:
        built = build_model_and_optimizers(self.cfg, self.device, self.layout)
        self.parallel = built.parallel
        return built.model, built.opts

    def _anticipatory(self) -> AnticipatoryRouting:
        model: Any = self.model
        s = self.cfg.stability
        return AnticipatoryRouting(model.moe_gates, model.set_anticipatory_router_weights, s.anticipatory_delta,
                                   s.anticipatory_window)

    def _telemetry(self, out: Path, port: int | None, measure_peak: bool) -> Telemetry:
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
        with self.opts.masters_on_device():  # the gathers run on the device backend
            state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}

    def _exporter(self) -> Callable[[Path], None] | None:
        """The checkpoint's before-commit hook writing a Hugging Face export into it (modelFrom.step)."""
        if not self.cfg.checkpoint.export_hf_every:
            return None
        from trex.trainer.export import staged_export

        return staged_export(self, self.ckpt.root / f"hf-step-{self.step:08d}")  # every rank writes its part now

    def _export_to(self, directory: Path) -> Path:
        """The model's Hugging Face export into ``directory`` (every rank writes its shards): the rollout engine's
        weight push."""
        from trex.trainer.export import export_trainer

        return export_trainer(self, directory)

    def _transfer_weights(self) -> contextlib.AbstractContextManager[Any]:
        """The model's weights as a weight-transfer push reads them (every rank): rollout.weightPush transfer."""
        from trex.trainer.rollout.weight_transfer import trainer_weights

        return trainer_weights(self)

    # --- state --------------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        """Everything besides model and optimizers that a bit-identical resume needs."""
        return {"step": self.step, "data": self.objective.state_dict(), "spike": self.detector.state_dict(),
                "anticipatory": self.anticipatory.state_dict(), "rng": rng_state(self.device.kind),
                "counters": {"skipped": self.skipped, "spikes": self.spikes, "tokens": self.tokens_seen},
                "scheduler": {"step": self.step}}

    def save(self) -> None:
        """Checkpoint the current step."""
        with self.phases.measure("checkpoint"):
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

        with self.phases.measure("resume"):
            loaded, _, _ = self.ckpt.load_latest(self.model, self.opts.all(), rebuild=rebuild)
        if loaded is None:
            self.phases.phases.pop("resume", None)  # nothing to resume: not a phase of this run
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.anticipatory = self._anticipatory()
        if loaded is None:
            return False
        # Optimizer states come from the checkpoint; hyper-parameters from the current config.
        apply_hparams(self.opts, self.cfg.optimizer, ns_dtype(self.cfg, self.device.kind))
        self.opts.restored()  # swap: the loaded states and masters go to host memory now, not at the first step
        x = loaded.extra
        self.step = int(x["step"])
        self.objective.load_state_dict(x["data"])
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
        cfg, s = self.cfg, self.step
        t0 = time.perf_counter()
        self.anticipatory.snapshot()
        anticipatory = self.anticipatory.prepare(s)
        out = self.objective.backward(self.model, s)
        parts_sum, counts, total_valid = out.parts, out.counts, out.valid_tokens
        model: Any = self.model
        dev = self.device.torch_device()
        t_compute = time.perf_counter()
        if self.meshes is not None:
            keys = sorted(set(parts_sum) | {"lm", "mtp", "balance", "indexer", "total"})
            parts_sum = dict(zip(keys, self.context.sum_over_ranks([parts_sum.get(k, 0.0) for k in keys]), strict=True))
            if counts is None:
                counts = torch.zeros(model.args.n_moe_layers, model.args.n_routed_experts, dtype=torch.long,
                                     device=dev)
            grad_norm = clip_grads(self.params, cfg.optimizer.grad_clip)
        else:
            grad_norm = clip_grad_norm(self.params, cfg.optimizer.grad_clip)
        lm_loss = parts_sum.get(self.objective.loss_key, float("nan")) if total_valid > 0 else float("nan")
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
                    dist.all_reduce(counts, group=self.group)
            if cfg.stability.enabled and self.objective.watch_spikes and self.detector.observe(s, lm_loss):
                spike = True
                self.spikes += 1
                self.anticipatory.trigger(s)
                self.log(f"step {s}: loss spike ({lm_loss:.4f}); anticipatory routing for "
                         f"{cfg.stability.anticipatory_window} steps (Δt={cfg.stability.anticipatory_delta})")
        self.opts.zero_grad()
        t_end = time.perf_counter()
        self.tokens_seen += out.tokens
        self.step += 1
        return StepRecord(step=self.step, loss=lm_loss, parts=parts_sum, grad_norm=grad_norm, lr=self.opts.lr(),
                          tokens=out.tokens, seconds=t_end - t0, skipped=skipped, spike=spike,
                          anticipatory=anticipatory, load_cv=load_cv(counts) if counts is not None else 0.0,
                          seq_len=out.seq_len, global_batch=out.global_batch, compute_seconds=t_compute - t0,
                          optimizer_seconds=t_end - t_compute, swap=None if skipped else self.opts.last_stats,
                          metrics=out.metrics, series=out.series, tallies=out.tallies, stats=out.stats)

    # --- the run ------------------------------------------------------------------------------
    def prepare(self) -> None:
        """The objective's own preparation (grpo: its reference policy), then resume from the newest verified
        checkpoint, else initialise from Hugging Face weights when configured."""
        cfg = self.cfg
        self.objective.prepare()
        if cfg.checkpoint.resume and self.resume():
            return
        if cfg.checkpoint.init_from_hf:
            with self.phases.measure("load"):
                if self.meshes is None:
                    load_hf_into(self.model, cfg.checkpoint.init_from_hf)  # type: ignore[arg-type]
                else:  # every rank reads the boxes of its own shards
                    load_hf_sharded(self.model, cfg.checkpoint.init_from_hf)  # type: ignore[arg-type]
                self.opts.restored()  # swap: masters loaded in host memory, cast their bf16 copies
            self.log(f"initialised from Hugging Face weights in {cfg.checkpoint.init_from_hf}")

    def request_stop(self, *_: Any) -> None:
        """Finish the current step, checkpoint and return (SIGTERM handler)."""
        self._stop = True

    def _stop_agreed(self) -> bool:
        """Whether any rank was asked to stop (all ranks stop at the same step)."""
        if self.group is None:
            return self._stop
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
            with self.phases.measure("step"):
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
        self.objective.close()
        return TrainResult(self.step, last_loss, last_mfu, self.last_checkpoint, self.skipped, self.spikes,
                           interrupted, history)

    def kernel_baseline(self) -> dict[str, float] | None:
        """Tokens/s of one micro-batch's forward and backward (seeded random tokens at the run's sequence length)
        with the run's tuned kernels and with none, timed side by side in this process; None when no kernel is
        active. Gradients are cleared afterwards: it runs after the last step, outside training."""
        if not self.kernels.active:
            return None
        cfg = self.cfg
        mb, seq = cfg.data.micro_batch_size, cfg.data.seq_len
        gen = torch.Generator().manual_seed(cfg.seed)
        ids = torch.randint(0, cfg.model.args.vocab_size, (mb, seq + 1), generator=gen).to(self.context.device)
        pos = torch.arange(seq, device=self.context.device).expand(mb, seq)
        docs = torch.zeros(mb, seq, dtype=torch.long, device=self.context.device)

        def step() -> None:
            with self.context.autocast():
                out = self.model(ids[:, :-1], pos, docs, logits=False)
                loss, _ = compute_loss(out, ids[:, 1:], None, cfg.routing, self.step)
            torch.autograd.backward(loss)
        try:
            return tuned_vs_untuned(step, mb * seq)
        finally:
            self.model.zero_grad(set_to_none=True)

    def _fpt(self, seq_len: int) -> float:
        """FLOPs per token at ``seq_len`` (the curriculum's shorter sequences)."""
        return float(mfu_mod.flops_per_token(resolved_model_values(self.cfg.model), seq_len))


def install_sigterm(trainer: Trainer) -> None:
    """SIGTERM (eviction, preemption) checkpoints after the current step and stops."""
    signal.signal(signal.SIGTERM, trainer.request_stop)

