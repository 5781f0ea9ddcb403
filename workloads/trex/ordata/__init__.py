"""Solver-verified synthetic OR data: generate, solve, verify, render, reconstruct, gate, dedup, shard."""
