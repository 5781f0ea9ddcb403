"""The one list of metric names every workload and the operator export (prefix ``trex_``).

Pure data: importing this module imports no client library. Dashboards, alerts and the operator's
progress scraper all refer to these names; a test checks that every PromQL expression shipped
with the chart names only metrics defined here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["gauge", "counter", "histogram"]


@dataclass(frozen=True)
class MetricSpec:
    """Name, type, help text and label names of one metric."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()


_JOB = ("job_name",)
_RESULT = ("job_kind", "job_name", "namespace")

METRICS: tuple[MetricSpec, ...] = (
    # --- trainer -------------------------------------------------------------------------
    MetricSpec("trex_train_step", "gauge", "Last completed optimizer step.", _JOB),
    MetricSpec("trex_train_max_steps", "gauge", "Configured number of optimizer steps.", _JOB),
    MetricSpec("trex_train_loss", "gauge", "Training loss of the last step (main LM loss).", _JOB),
    MetricSpec("trex_train_grad_norm", "gauge", "Global gradient norm before clipping.", _JOB),
    MetricSpec("trex_train_lr", "gauge", "Learning rate of the last step (peak-relative schedule applied).", _JOB),
    MetricSpec("trex_train_tokens_per_second", "gauge", "Training tokens per second (this rank).", _JOB),
    MetricSpec("trex_train_step_seconds", "gauge", "Wall time of the last optimizer step.", _JOB),
    MetricSpec(
        "trex_train_mfu", "gauge",
        "Model FLOPs utilisation: achieved FLOP/s over trex_train_peak_flops, FLOPs convention in the label.",
        ("job_name", "device", "flops_convention"),
    ),
    MetricSpec("trex_train_peak_flops", "gauge", "Peak FLOP/s the MFU is computed against.", ("job_name", "device", "source")),
    MetricSpec("trex_train_flops_per_token", "gauge", "Model FLOPs per token used for MFU.", ("job_name", "flops_convention")),
    MetricSpec("trex_train_expert_load_cv", "gauge", "Coefficient of variation of routed-expert load.", _JOB),
    MetricSpec("trex_train_skipped_steps_total", "counter", "Steps skipped by the NaN/Inf guard.", _JOB),
    MetricSpec("trex_train_spikes_total", "counter", "Loss spikes detected.", _JOB),
    MetricSpec("trex_train_kernel_active", "gauge",
               "1 per tuned kernel (kernel/dtype/shape class) the trainer runs instead of the eager op.",
               (*_JOB, "kernel")),
    MetricSpec("trex_train_kernel_refused", "gauge",
               "1 per registry kernel refused at load (build failure or disagreement with the eager op).",
               (*_JOB, "kernel")),
    MetricSpec("trex_train_kernel_coverage", "gauge",
               "Shape classes per kernel: the run's (classes=run), called so far, tuned in the registry, active, "
               "refused.", (*_JOB, "kernel", "classes")),
    MetricSpec("trex_train_anticipatory_routing", "gauge", "1 while anticipatory routing is on.", _JOB),
    MetricSpec("trex_train_last_checkpoint_step", "gauge", "Step of the last verified checkpoint.", _JOB),
    MetricSpec("trex_train_last_checkpoint_timestamp_seconds", "gauge", "Unix time of the last verified checkpoint.", _JOB),
    MetricSpec("trex_train_swap_exposed_seconds", "gauge",
               "Swap optimizer: copy time of the last step not hidden behind the bucket updates.", _JOB),
    MetricSpec("trex_train_swap_overlap_ratio", "gauge",
               "Swap optimizer: hidden copy time / total copy time of the last step.", _JOB),
    MetricSpec("trex_train_swap_device_bytes_saved", "gauge",
               "Swap optimizer: optimizer-state bytes in host memory minus the device bucket buffers.", _JOB),
    MetricSpec("trex_train_opd_kl", "gauge",
               "On-policy distillation: mean reverse KL(student || teacher) per token of the last step, per teacher.",
               (*_JOB, "teacher")),
    MetricSpec("trex_train_opd_student_entropy", "gauge",
               "On-policy distillation: the student's mean entropy over the last step's response tokens.", _JOB),
    MetricSpec("trex_train_opd_cache_hit_bytes_total", "counter",
               "On-policy distillation: teacher hidden-state bytes served from host memory.", _JOB),
    MetricSpec("trex_train_opd_cache_spilled_bytes_total", "counter",
               "On-policy distillation: teacher hidden-state bytes spilled to disk (cache size limit reached).", _JOB),
    MetricSpec("trex_train_opd_teacher_switches", "gauge",
               "On-policy distillation: teacher-head changes in the last step (teachers used - 1 when sorted).", _JOB),
    MetricSpec("trex_train_reward_mean", "gauge", "GRPO: mean verifier reward of the last step's responses.", _JOB),
    MetricSpec("trex_train_reward_std", "gauge", "GRPO: standard deviation of the last step's rewards.", _JOB),
    MetricSpec("trex_train_kl", "gauge", "GRPO: mean k3 KL to the reference policy over response tokens.", _JOB),
    MetricSpec("trex_train_clip_fraction", "gauge",
               "GRPO: fraction of response tokens whose importance ratio was clipped.", _JOB),
    MetricSpec("trex_train_response_length", "gauge", "GRPO: mean response length (tokens) of the last step.", _JOB),
    MetricSpec("trex_train_rollout_seconds", "gauge", "GRPO: rollout (decoding) time of the last step.", _JOB),
    MetricSpec("trex_train_rollout_policy_version", "gauge",
               "vLLM rollouts: the policy version pushed to the servers before the last step's rollouts.", _JOB),
    MetricSpec("trex_train_rollout_push_bytes", "gauge", "vLLM rollouts: bytes of the last weight push's export.", _JOB),
    MetricSpec("trex_train_rollout_push_export_seconds", "gauge",
               "vLLM rollouts: time the last push spent writing the Hugging Face export.", _JOB),
    MetricSpec("trex_train_rollout_push_reload_seconds", "gauge",
               "vLLM rollouts: time the servers were paused reloading the last push (or starting, the first).", _JOB),
    MetricSpec("trex_train_rollout_requests_cut", "gauge",
               "vLLM rollouts: requests of the last step's rollouts that were cut and sent again.", _JOB),
    MetricSpec("trex_train_rollout_tokens_kept", "gauge",
               "vLLM rollouts: tokens the last step's cut or restarted rollouts kept from their token log.", _JOB),
    MetricSpec("trex_train_rollout_server_restarts_total", "counter",
               "vLLM rollouts: restarts of the trainer's own server (rollout.spawnLocal) after its process exited.",
               _JOB),
    MetricSpec("trex_train_rollout_logprob_mismatch_mean", "gauge",
               "vLLM rollouts: mean |trainer - engine| log-prob of the last step's sampled tokens.", _JOB),
    MetricSpec("trex_train_rollout_logprob_mismatch_max", "gauge",
               "vLLM rollouts: max |trainer - engine| log-prob of the last step's sampled tokens.", _JOB),
    MetricSpec("trex_train_rollout_logprob_mismatch_corr", "gauge",
               "vLLM rollouts: correlation of trainer and engine log-probs of the last step's sampled tokens.", _JOB),
    MetricSpec("trex_train_rollout_logprob_mismatch_alert", "gauge",
               "vLLM rollouts: 1 when the mean log-prob mismatch exceeds rollout.mismatchAlert.", _JOB),
    MetricSpec("trex_train_verify_seconds", "gauge", "GRPO: verifier time of the last step.", _JOB),
    MetricSpec("trex_train_rl_train_seconds", "gauge",
               "GRPO: loss forward and backward time of the last step (reference pass included).", _JOB),
    MetricSpec("trex_train_verifier_outcomes_total", "counter", "GRPO: scored responses by verifier outcome.",
               (*_JOB, "outcome")),
    # --- kernels -------------------------------------------------------------------------
    MetricSpec("trex_kernel_speedup", "gauge", "Verified speedup of the best variant over the baseline.",
               ("kernel", "shape", "dtype", "device", "baseline")),
    MetricSpec("trex_kernel_roofline_fraction", "gauge", "Best variant's fraction of the roofline bound.",
               ("kernel", "shape", "dtype", "device")),
    MetricSpec("trex_kernel_trials_total", "counter", "Candidates tried, by outcome.", ("kernel", "outcome")),
    MetricSpec("trex_kernel_best_seconds", "gauge", "Median time of the best verified variant.",
               ("kernel", "shape", "dtype", "device")),
    MetricSpec("trex_kernel_bandwidth_fraction", "gauge",
               "Best variant's compulsory bytes per second over the measured bandwidth of the level holding them.",
               ("kernel", "shape", "dtype", "device")),
    MetricSpec("trex_kernel_model_spearman", "gauge",
               "Spearman rank correlation of the tiling cost model's predicted against measured candidate times.",
               ("kernel", "shape", "dtype", "device")),
    # --- ordata --------------------------------------------------------------------------
    MetricSpec("trex_ordata_samples_total", "counter", "Instances by pipeline outcome (accepted or a rejection reason).",
               ("family", "outcome")),
    MetricSpec("trex_ordata_stage_seconds_total", "counter", "Time spent per pipeline stage.", ("stage",)),
    MetricSpec("trex_ordata_shards_done", "gauge", "Shards finished in this process.", ()),
    MetricSpec("trex_ordata_progress_ratio", "gauge", "Fraction of this shard's instances processed.", ()),
    MetricSpec("trex_ordata_accepted_per_second", "gauge", "Accepted samples per second of this shard's run so far.", ()),
    MetricSpec("trex_ordata_sampling_attempts_total", "counter",
               "Candidate draws by the generators (resampled until feasible and bounded).", ("family",)),
    MetricSpec("trex_ordata_sandbox_isolation", "gauge",
               "1 for the sandbox isolation the generated programs run under (kernel-fs, namespaces or audit).",
               ("mode",)),
    # --- evaluation ----------------------------------------------------------------------
    MetricSpec("trex_eval_pass_at_k", "gauge", "Unbiased pass@k per benchmark.", ("benchmark", "k", "protocol")),
    MetricSpec("trex_eval_samples_total", "counter", "Scored samples by verdict category.", ("benchmark", "category")),
    MetricSpec("trex_eval_structural_accuracy", "gauge", "ORGEval structural equivalence rate.", ("benchmark",)),
    MetricSpec("trex_eval_progress_ratio", "gauge", "Fraction of samples scored.", ("benchmark",)),
    MetricSpec("trex_eval_tokens_total", "counter", "Model tokens used.", ("benchmark", "direction")),
    MetricSpec("trex_eval_failed_requests_total", "counter",
               "Model requests that failed after retries (those samples stay missing until a rerun).", ("benchmark",)),
    MetricSpec("trex_eval_sandbox_isolation", "gauge",
               "1 for the sandbox isolation the model's programs run under (kernel-fs, namespaces or audit).", ("mode",)),
    # --- job results (the operator, from each job's status.results, while the job exists) ----------
    MetricSpec("trex_job_pass_at_1", "gauge", "Pass@1 per benchmark of an EvalJob's results.", (*_RESULT, "benchmark")),
    MetricSpec("trex_job_accepted_samples", "gauge", "Accepted samples of an ORDataJob's merged corpus.", _RESULT),
    MetricSpec("trex_job_kernel_speedup", "gauge",
               "Verified speedup per kernel/dtype of a KernelTuneJob (kernel=\"geomean\": their geometric mean).",
               (*_RESULT, "kernel")),
    MetricSpec("trex_job_mfu", "gauge", "Final model FLOPs utilisation of a TrainJob.", _RESULT),
    MetricSpec("trex_job_loss", "gauge", "Final training loss of a TrainJob.", _RESULT),
    # --- operator ------------------------------------------------------------------------
    MetricSpec("trex_operator_reconciles_total", "counter", "Reconciliations by kind and result.", ("kind", "result")),
    MetricSpec("trex_operator_reconcile_seconds", "histogram", "Reconciliation latency.", ("kind",)),
    MetricSpec("trex_operator_jobs", "gauge", "Jobs by kind and phase.", ("kind", "phase")),
    MetricSpec("trex_operator_restarts_total", "counter", "Gang restarts by cause.", ("kind", "cause")),
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}


def spec(name: str) -> MetricSpec:
    """Look a metric up by name; unknown names are a programming error."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not defined in trex.telemetry.metrics") from None


def exposed_names() -> set[str]:
    """Every series name Prometheus will see (counters gain _total, histograms _bucket/_sum/_count)."""
    out: set[str] = set()
    for m in METRICS:
        if m.kind == "histogram":
            out |= {m.name + s for s in ("_bucket", "_sum", "_count")}
        else:
            out.add(m.name)
    return out
