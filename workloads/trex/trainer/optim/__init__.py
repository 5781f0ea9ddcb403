"""Optimizers: Muon for GEMM weights, AdamW for the rest, one LR schedule, batch ramp and clipping."""
