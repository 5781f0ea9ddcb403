"""On-policy distillation: a fused full-vocabulary reverse KL and the teacher pass that feeds it."""
