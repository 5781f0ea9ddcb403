"""The validity rules of a training job: every check across fields the schema (trex.trainer.config) cannot
express, with one entry, :func:`job_problems`, that `trex validate`, the admission webhook, the operator and
`trex train` share (once per run).

The rules that need only the config and the world size (parallel layout, support, sampling layout, memory) run
everywhere; those that read this machine's files (data, tokenizer, teachers, initFromHf) and the batch
arithmetic of the data-parallel ranks run where the job trains (``local=True``: `trex train` and the Trainer).
Each problem is a (dotted camelCase field path, message) pair.
"""

from __future__ import annotations

from pathlib import Path

from trex.trainer.config import OPDConfig, TrainerConfig
from trex.trainer.data.sources import DataError, jsonl_files
from trex.trainer.distill.folders import resolve_teacher_dir
from trex.trainer.engine_plan import trainer_plan, whole_model_bytes
from trex.trainer.hf import check_hf_compatible
from trex.trainer.mfu import DeviceSku
from trex.trainer.plan import MemoryPlan, gib, plan_lifecycle, with_swap

Problem = tuple[str, str]
"""(dotted camelCase field path, message)."""

GRPO_NEEDS_PROMPTS = ("mode 'grpo' needs prompts with ground truths: an ORDataJob's prompts rendering (dataFrom) "
                      "or a benchmark file")
OPD_NEEDS_PROMPTS = "mode 'opd' needs prompts: an ORDataJob's prompts rendering (dataFrom) or a benchmark file"


class ConfigProblem(ValueError):
    """A configuration value that cannot work; ``field`` is its dotted camelCase path."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path


def job_problems(cfg: TrainerConfig, world_size: int, device: DeviceSku | None = None,
                 capacity: int | None = None, *, local: bool = False, host_capacity: int | None = None,
                 load: bool | None = None) -> list[Problem]:
    """The one validity rule: the parallel degrees fit the world and the model (parallelism_problems), every field
    is one the trainer runs (support_problems), the sampling modes' prompts split over the ranks
    (rl_layout_problems); with ``local``, what this machine's files and the data-parallel batch arithmetic allow
    (local_problems); and the memory plan fits ``device`` (``capacity`` bytes per process, default the device's
    memory; no device or an unknown capacity: not checked), with the optimizer states in host memory when
    optimizer.swap is on; with ``host_capacity`` (host bytes per rank: the pod's resources.limits.memory / its
    ranks) every phase of the lifecycle plan fits it (host_problems; ``load``: the job starts from a Hugging Face
    folder, default checkpoint.initFromHf is set). Empty means valid."""
    layout = parallelism_problems(cfg, world_size)
    out = (layout + support_problems(cfg) + offload_problems(cfg) + context_problems(cfg)
           + rl_layout_problems(cfg, world_size) + weight_push_problems(cfg, device))
    if cfg.kernels.registry and Path(cfg.kernels.registry).is_file():  # readable here: it must cover the run
        from trex.trainer.kernels import registry_problem
        out += [p for p in [registry_problem(cfg)] if p is not None]
    if local and not layout:
        p = cfg.parallelism
        out += local_problems(cfg, world_size // (p.tp * p.pp * p.cp))
    if out or device is None or (capacity is None and device.memory_bytes is None):
        return out
    try:
        plan = trainer_plan(cfg, world_size, device, capacity)
        replica = inprocess_replica_problem(cfg, device, capacity if capacity is not None else device.memory_bytes)
    except ValueError as e:
        return [("model.overrides", str(e))]
    if replica is not None:
        return [replica]
    if plan.fits:
        return out + host_problems(cfg, world_size, plan, host_capacity, load)
    has = f"{device.name} has {gib(plan.capacity or 0)}"
    if cfg.optimizer.swap.enabled:
        out.append(("parallelism", f"needs {gib(plan.total)} per device even with the optimizer states in host "
                    f"memory (optimizer.swap); {has}: {_memory_advice(plan, cfg)}"))
        return out
    off = with_swap(plan, True)
    hint = f", or enable optimizer.swap (brings it to {gib(off.total)})" if off.fits else ""
    out.append(("parallelism", f"needs {gib(plan.total)} per device; {has}: {_memory_advice(plan, cfg)}{hint}"))
    return out


def host_problems(cfg: TrainerConfig, world_size: int, plan: MemoryPlan, host_capacity: int | None,
                  load: bool | None = None) -> list[Problem]:
    """The phase of the lifecycle plan (trex.trainer.plan.plan_lifecycle) whose host memory exceeds
    ``host_capacity`` bytes per rank, as one problem on resources.limits.memory (none when it is unknown)."""
    if host_capacity is None:
        return []
    life = plan_lifecycle(cfg, world_size, plan, host_capacity, load=load)
    if life.fits:
        return []
    peak = life.peak
    fix = ("disable optimizer.swap or add replicas (the host-side masters and optimizer states shrink per rank)"
           if plan.swap and peak.name in ("step", "checkpoint", "resume") else "add replicas")
    return [("resources.limits.memory", f"phase {peak.name} needs {gib(peak.host_bytes)} of host memory per rank; "
             f"the pod's memory limit gives {gib(host_capacity)} per rank: raise resources.limits.memory to at least "
             f"{gib(peak.host_bytes)} x the ranks per pod, or {fix}")]


def parallelism_problems(cfg: TrainerConfig, world_size: int) -> list[Problem]:
    """Check the parallel degrees against the world size and model shape (MoE parallel folding).

    Rules: pp divides world; tp x pp divides world, cp divides world / (tp x pp) and dp = world / (cp x tp x pp)
    when dp is unset;
    ep x etp x pp divides world (the MoE mesh is folded onto the same ranks as attention, so
    edp = world / (ep x etp x pp)); ep divides the routed expert count; etp divides the expert
    hidden size; tp divides the head count; pp does not exceed the layer count.
    """
    p = cfg.parallelism
    m = cfg.model.args
    out: list[Problem] = []
    base = "parallelism"
    if world_size % p.pp:
        out.append((f"{base}.pp", f"pp={p.pp} does not divide the world size {world_size}"))
    if world_size % (p.tp * p.pp):
        out.append((f"{base}.tp", f"tp x pp = {p.tp * p.pp} does not divide the world size {world_size}"))
    elif world_size // (p.tp * p.pp) % p.cp:
        out.append((f"{base}.cp", f"cp={p.cp} does not divide world / (tp x pp) = {world_size // (p.tp * p.pp)}"))
    elif p.dp is not None and p.cp > 1:
        out.append((f"{base}.dp", f"leave dp unset under cp > 1 (it is world / (cp x tp x pp) = "
                    f"{world_size // (p.tp * p.pp * p.cp)})"))
    elif p.dp is not None and p.dp * p.tp * p.pp != world_size:
        out.append(
            (f"{base}.dp", f"dp x tp x pp = {p.dp * p.tp * p.pp} must equal the world size {world_size} "
             f"(replicas x devicesPerReplica); allowed dp: {world_size // (p.tp * p.pp)} or unset")
        )
    if world_size % (p.ep * p.etp * p.pp):
        out.append(
            (f"{base}.ep", f"ep x etp x pp = {p.ep * p.etp * p.pp} does not divide the world size {world_size} "
             "(MoE parallel folding needs edp = world / (ep x etp x pp) to be whole)")
        )
    if m.n_routed_experts % p.ep:
        out.append((f"{base}.ep", f"ep={p.ep} does not divide the routed expert count {m.n_routed_experts}"))
    if m.moe_intermediate_size % p.etp:
        out.append((f"{base}.etp", f"etp={p.etp} does not divide the expert hidden size {m.moe_intermediate_size}"))
    if m.num_heads % p.tp:
        out.append((f"{base}.tp", f"tp={p.tp} does not divide the attention head count {m.num_heads}"))
    if m.attention == "csa" and m.o_groups % p.tp:
        out.append((f"{base}.tp", f"tp={p.tp} does not divide the output groups oGroups={m.o_groups} of the "
                    "DeepSeek-V4 attention (each tp rank projects whole groups)"))
    dp = (p.dp if p.dp is not None else world_size // (p.tp * p.pp * p.cp)
          if world_size % (p.tp * p.pp * p.cp) == 0 else 0)
    if dp and dp % p.dp_replicate:
        out.append((f"{base}.dpReplicate", f"dpReplicate={p.dp_replicate} does not divide dp={dp}"))
    if p.tp > 1:
        out += tp_token_problems(cfg, p.tp)
    if p.pp > m.num_layers:
        out.append((f"{base}.pp", f"pp={p.pp} exceeds the layer count {m.num_layers}"))
    return out


def tp_token_problems(cfg: TrainerConfig, tp: int) -> list[Problem]:
    """What sequence parallelism needs of ``tp`` (each tp rank holds a slice of every micro-batch's tokens outside
    the attention and dense-FFN GEMMs: the residual stream, norms, mHC and the MoE layers; trex.trainer.parallel
    .parallelize): every micro-batch's tokens divide by it. The language-model modes' micro-batches are
    microBatchSize x seqLen tokens (each curriculum stage's too; under cp a rank holds 1/cp of them); the sampling
    modes' rows are as long as their longest response, so there tp divides the rows (microBatchSize;
    rl_layout_problems checks a rank's responses)."""
    if tp == 1:
        return []
    mb, cp = cfg.data.micro_batch_size, cfg.parallelism.cp
    why = "(each tp rank holds a slice of every micro-batch's tokens: sequence parallelism)"
    if cfg.mode in ("grpo", "opd"):
        if mb % tp:
            return [("parallelism.tp", f"tp={tp} does not divide data.microBatchSize {mb}: mode {cfg.mode}'s "
                     f"responses vary in length, so each micro-batch's rows must split evenly {why}")]
        return []
    lengths = [("data.seqLen", cfg.data.seq_len)] + [
        (f"data.seqLenCurriculum[{i}].seqLen", c.seq_len) for i, c in enumerate(cfg.data.seq_len_curriculum)]
    for name, seq in lengths:
        tokens = mb * seq // cp
        if seq % cp == 0 and tokens % tp:  # seq % cp: context_problems says it
            per = f" / parallelism.cp {cp}" if cp > 1 else ""
            return [("parallelism.tp", f"tp={tp} does not divide the {tokens} tokens of a micro-batch "
                     f"(data.microBatchSize {mb} x {name} {seq}{per}) {why}")]
    return []


def support_problems(cfg: TrainerConfig) -> list[Problem]:
    """Fields the schema has that `trex train` does not run yet (each lands with its own work)."""
    out: list[Problem] = []
    if cfg.parallelism.pp > 1:
        out.append(("parallelism.pp", f"{cfg.parallelism.pp}: pipeline parallelism is not run by `trex train` yet; "
                    "set 1"))
    return out


def weight_push_problems(cfg: TrainerConfig, device: DeviceSku | None = None) -> list[Problem]:
    """rollout.weightPush transfer sends over NCCL (vLLM's nccl weight-transfer backend): refused where the trainer
    has no NCCL, a device other than cuda (cfg.device) or a job on other than GPUs (``device``)."""
    if cfg.rollout.weight_push != "transfer":
        return []
    where = cfg.device if cfg.device in ("cpu", "npu") else (
        device.device_type if device is not None and device.device_type != "gpu" else None)
    if where is None:
        return []
    return [("rollout.weightPush", f"'transfer' sends over NCCL (vLLM's nccl weight-transfer backend), which needs "
             f"the trainer and the servers on GPUs; this job runs on {where}: use weightPush: disk")]


def offload_problems(cfg: TrainerConfig) -> list[Problem]:
    """trainer.activationOffload needs recompute full: it offloads the block inputs, which only full recompute
    reduces a block's saved tensors to."""
    if not cfg.activation_offload or cfg.recompute == "full":
        return []
    return [("activationOffload", f"needs recompute: full (got {cfg.recompute}): it moves to host memory the block "
             "inputs full recompute keeps; with less recompute the blocks keep their insides on the device")]


def context_problems(cfg: TrainerConfig) -> list[Problem]:
    """What context parallelism (cp > 1) needs and does not cover yet: sequences that split into 2 cp equal
    chunks (the load-balanced causal split) and a language-model mode (pretrain, cpt, sft); both attention kinds
    (mla, DeepSeek-V4's sliding / csa / hca) run under it."""
    cp = cfg.parallelism.cp
    if cp == 1:
        return []
    out: list[Problem] = []
    split = (f"not a multiple of 2 x parallelism.cp = {2 * cp} (each cp rank holds a head and a tail chunk of "
             "every sequence)")
    if cfg.data.seq_len % (2 * cp):
        out.append(("data.seqLen", f"{cfg.data.seq_len} is {split}"))
    for i, c in enumerate(cfg.data.seq_len_curriculum):
        if c.seq_len % (2 * cp):
            out.append((f"data.seqLenCurriculum[{i}].seqLen", f"{c.seq_len} is {split}"))
    if cfg.mode in ("grpo", "opd"):
        out.append(("parallelism.cp", f"mode {cfg.mode} under cp > 1 is not supported yet (the language-model "
                    "modes pretrain, cpt and sft split sequences); set cp 1"))
    return out


def rl_layout_problems(cfg: TrainerConfig, world_size: int) -> list[Problem]:
    """What the sampling modes (grpo, opd) need of the layout: whole prompts on every data-parallel rank; under tp,
    a batch of responses the MoE layers can split over the tp ranks (their token split needs whole responses per
    rank, since response lengths vary: tp_token_problems), and for opd a vocabulary the KL can shard."""
    p = cfg.parallelism
    if cfg.mode not in ("grpo", "opd") or world_size % (p.tp * p.pp):  # the last: parallelism_problems says it
        return []
    dp = world_size // (p.tp * p.pp)
    section, prompts, samples, name = (
        ("grpo", cfg.grpo.prompts_per_step, cfg.grpo.group_size, "groupSize") if cfg.mode == "grpo"
        else ("opd", cfg.opd.prompts_per_step, cfg.opd.samples_per_prompt, "samplesPerPrompt"))
    if prompts % dp:
        return [(f"{section}.promptsPerStep", f"{prompts} is not a multiple of the {dp} data-parallel rank(s) "
                 "(each rank samples whole prompts)")]
    out: list[Problem] = []
    if p.tp > 1:
        m = cfg.model.args
        per_rank = prompts // dp * samples
        if per_rank % p.tp:
            out.append((f"{section}.{name}", f"each data-parallel rank trains on promptsPerStep / dp x {name} = "
                        f"{per_rank} responses, not a multiple of tp={p.tp} (each tp rank holds a slice of every "
                        "micro-batch's tokens, whole responses per rank: their lengths vary)"))
        if cfg.mode == "opd" and m.vocab_size % p.tp:
            out.append(("parallelism.tp", f"tp={p.tp} does not divide the vocabulary {m.vocab_size} (mode opd's KL "
                        "shards the vocabulary over tp)"))
    return out


def inprocess_replica_problem(cfg: TrainerConfig, device: DeviceSku, capacity: int | None) -> Problem | None:
    """The in-process engine decodes on a whole unsharded replica per rank (DecodeReplica): refused when that
    replica alone exceeds the device, with the vLLM engine as the fix."""
    if cfg.mode not in ("grpo", "opd") or cfg.rollout.engine != "inprocess" or capacity is None:
        return None
    whole = whole_model_bytes(cfg)
    if whole <= capacity:
        return None
    return ("rollout.engine", f"'inprocess' decodes on a whole unsharded replica per rank ({gib(whole)} in "
            f"model.dtype); {device.name} has {gib(capacity)}: set trainer.rollout.engine: vllm and "
            "spec.rollout.server (vLLM servers shard the model over their own devices)")


def local_problems(cfg: TrainerConfig, dp: int = 1) -> list[Problem]:
    """What the job needs where it trains: batch sizes vs micro-batch x dp, sequence lengths within the model's,
    the files it reads (data, tokenizer, teachers, initFromHf) and a Hugging Face export the shape has."""
    out: list[Problem] = []
    per_step = cfg.data.micro_batch_size * dp
    if cfg.mode not in ("grpo", "opd") and cfg.data.global_batch_size % per_step:  # promptsPerStep x samples
        out.append(("data.globalBatchSize", f"{cfg.data.global_batch_size} is not a multiple of "
                    f"microBatchSize x dp = {per_step}"))
    for i, r in enumerate(cfg.optimizer.batch_ramp):
        if r.global_batch_size % per_step:
            out.append((f"optimizer.batchRamp[{i}].globalBatchSize", f"{r.global_batch_size} is not a multiple of "
                        f"data.microBatchSize x dp = {per_step}"))
    max_len = cfg.model.args.max_seq_len
    if cfg.data.seq_len > max_len:
        out.append(("data.seqLen", f"{cfg.data.seq_len} exceeds the model's maxSeqLen {max_len}"))
    for i, c in enumerate(cfg.data.seq_len_curriculum):
        if c.seq_len > max_len:
            out.append((f"data.seqLenCurriculum[{i}].seqLen", f"{c.seq_len} exceeds the model's maxSeqLen {max_len}"))
    if cfg.mode == "opd":
        out.extend(opd_problems(cfg.opd))
    if cfg.data.tokenizer.path is not None and not Path(cfg.data.tokenizer.path).is_file():
        out.append(("data.tokenizer.path", f"{cfg.data.tokenizer.path} does not exist"))
    if cfg.data.train is not None:
        try:
            jsonl_files(cfg.data.train)
        except DataError as e:
            out.append(("data.train", str(e).removeprefix("data.train: ")))
    if cfg.checkpoint.export_hf_every:
        try:
            check_hf_compatible(cfg.model.args)
        except ValueError as e:
            out.append(("checkpoint.exportHfEvery", f"this model has no Hugging Face export: {e}"))
    if cfg.checkpoint.init_from_hf is not None and not Path(cfg.checkpoint.init_from_hf).is_dir():
        out.append(("checkpoint.initFromHf", f"{cfg.checkpoint.init_from_hf} is not a directory"))
    if cfg.mode == "grpo" and cfg.data.train is None:
        out.append(("data.train", GRPO_NEEDS_PROMPTS))
    if cfg.mode == "opd" and cfg.data.train is None:
        out.append(("data.train", OPD_NEEDS_PROMPTS))
    return out


def opd_problems(cfg: OPDConfig) -> list[Problem]:
    """What mode opd cannot start with: a teacher without a model folder (a TrainJob name outside a TrainJob,
    or a path that holds no export)."""
    out: list[Problem] = []
    for i, t in enumerate(cfg.teachers):
        if t.path is None:
            out.append((f"opd.teachers.{i}.name", f"{t.name!r}: a TrainJob teacher gets its path from the operator; "
                        "outside a TrainJob give path (the teacher's model folder)"))
            continue
        try:
            resolve_teacher_dir(t.path)
        except FileNotFoundError as e:
            out.append((f"opd.teachers.{i}.path", str(e)))
    return out


def _memory_advice(plan: MemoryPlan, cfg: TrainerConfig) -> str:
    """What to change, led by the part that dominates the plan (at micro-batch 1: the sequence split, cp, when
    the job can run it; tp where the model's heads and every micro-batch's tokens split over twice the tp)."""
    states = plan.persistent
    if plan.activations > states:
        more = "" if plan.recompute == "full" else ", or set trainer.recompute (selective or full)"
        tp = cfg.parallelism.tp * 2
        m = cfg.model.args
        tp_can = not (m.num_heads % tp or (m.attention == "csa" and m.o_groups % tp) or tp_token_problems(cfg, tp))
        raise_tp = f", or raise parallelism.tp (to {tp})" if tp_can else ""
        if cfg.data.micro_batch_size == 1:
            cp = cfg.parallelism.cp * 2
            split = cfg.model_copy(update={"parallelism": cfg.parallelism.model_copy(update={"cp": cp})})
            can = not context_problems(split)
            raise_cp = f", or raise parallelism.cp (to {cp}: each rank holds 1/{cp} of every sequence)" if can else ""
            return f"shorten data.seqLen (and its curriculum){raise_cp}{raise_tp}{more} (activations take the most)"
        return (f"shorten data.seqLen (and its curriculum) or data.microBatchSize{raise_tp}"
                f"{more} (activations take the most)")
    return "raise ep or add replicas (parameters, gradients and optimizer states take the most)"
