"""The parallel MoE trainer (pretrain / CPT / SFT / on-policy distillation)."""
