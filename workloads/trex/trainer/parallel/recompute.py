"""Activation recompute (trainer.recompute) applied from outside the model, as the parallel layer applies
its layout: a module's forward runs under torch.utils.checkpoint (non-reentrant), so the backward
recomputes it from its inputs instead of keeping its saved tensors.

* ``selective``: every attention module (projections, the attention core, CSA compressor and indexer) and
  every routed-experts module (token permutation, the expert-parallel dispatch and combine, the expert
  GEMMs);
* ``full``: every transformer block (trunk and MTP).

The forward is wrapped on the module instance, so parameter names (checkpoints) and FSDP2's hooks on the
module call are unchanged; collectives inside a recomputed module (the MoE all-to-alls) run again in the
backward, in the same order on every rank.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from trex.trainer.model.model import DeepSeekModel, blocks
from trex.trainer.model.moe import MoE

MODES = ("none", "selective", "full")


def checkpointed(module: nn.Module) -> None:
    """Run ``module``'s forward under non-reentrant activation checkpointing from now on."""
    from torch.utils.checkpoint import checkpoint

    inner = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    module.forward = forward


def apply_recompute(model: DeepSeekModel, mode: str) -> None:
    """Wrap the modules ``mode`` recomputes (none, selective or full; see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"trainer.recompute must be one of {', '.join(MODES)}, got {mode!r}")
    for block in blocks(model):
        if mode == "full":
            checkpointed(block)
        elif mode == "selective":
            checkpointed(block.self_attn)
            if isinstance(block.mlp, MoE):
                checkpointed(block.mlp.experts)
