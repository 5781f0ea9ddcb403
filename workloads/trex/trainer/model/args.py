"""ModelArgs, re-exported for the model package (defined torch-free in trex.trainer.model_args)."""

from trex.trainer.model_args import LAYER_KINDS, LayerKind, ModelArgs, default_layer_types

__all__ = ["LAYER_KINDS", "LayerKind", "ModelArgs", "default_layer_types"]
