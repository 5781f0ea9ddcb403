"""The DeepSeek-V3/V4-style MoE model (torch): args, layers, attention, MoE, mHC, model, loss."""

from trex.trainer.model.args import ModelArgs
from trex.trainer.model.loss import compute_loss
from trex.trainer.model.model import (
    DeepSeekModel,
    ModelOutput,
    build_model,
    build_model_from_args,
    update_expert_bias,
)

__all__ = [
    "DeepSeekModel",
    "ModelArgs",
    "ModelOutput",
    "build_model",
    "build_model_from_args",
    "compute_loss",
    "update_expert_bias",
]
