"""The one place the trainer reads ``cfg.mode``: it builds the mode's :class:`~trex.trainer.objective.Objective`
(with the data or prompts it trains on), turning data and teacher problems into ConfigProblems naming the field."""

from __future__ import annotations

from typing import Any

from trex.runtime.device import torch_dtype
from trex.trainer.data.objective import LMObjective
from trex.trainer.data.sources import DataError
from trex.trainer.distill.objective import OPDObjective
from trex.trainer.objective import Objective, RunContext
from trex.trainer.parallel.decode import DecodeReplica, needs_replica
from trex.trainer.rl.objective import GRPOObjective
from trex.trainer.rl.prompts import build_prompts
from trex.trainer.rl.reward import Verifier
from trex.trainer.rl.step import default_verifier
from trex.trainer.rules import ConfigProblem


def build_objective(ctx: RunContext, verifier: Verifier | None = None) -> Objective:
    """The objective of ``ctx.cfg.mode``; ``verifier`` (mode grpo) replaces the OR verifier the config describes."""
    cfg = ctx.cfg
    vocab = cfg.model.args.vocab_size
    try:
        if cfg.mode not in ("grpo", "opd"):  # pretrain, cpt, sft: the language-model loss
            return LMObjective(ctx, vocab)
        tokenizer, items = build_prompts(cfg, ctx.ckpt_dir.parent / "tokenizer", vocab)
        replica, tp_group = sampling_layout(ctx)
        if cfg.mode == "grpo":
            return GRPOObjective(ctx, tokenizer, items, verifier or default_verifier(cfg), replica, tp_group)
    except DataError as e:
        raise ConfigProblem("data.train", str(e)) from None
    except ValueError as e:
        field_path, sep, rest = str(e).partition(": ")
        if sep and field_path.startswith("data."):
            raise ConfigProblem(field_path, rest) from None
        raise
    try:
        return OPDObjective(ctx, tokenizer, items, vocab, replica, tp_group)
    except ValueError as e:
        field_path, _, rest = str(e).partition(": ")
        raise ConfigProblem(field_path, rest) from None


def sampling_layout(ctx: RunContext) -> tuple[DecodeReplica | None, Any]:
    """The decoding replica (tensor / expert parallelism) and the tp group of the sampling modes (grpo, opd): the
    replica is the whole model in-process rollouts decode on (none with
    rollout.engine vllm); the tp ranks share this rank's batch and split its rollouts."""
    if ctx.meshes is None:
        return None, None
    cfg = ctx.cfg
    replica = (DecodeReplica(cfg.model.args, ctx.device, torch_dtype(cfg.model.dtype))
               if needs_replica(ctx.dims) and cfg.rollout.engine == "inprocess" else None)
    return replica, ctx.meshes.dense["tp"].get_group() if ctx.dims.tp > 1 else None
