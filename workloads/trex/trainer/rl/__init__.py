"""Reinforcement learning pieces: GRPO's objective (grpo) and verifier rewards (reward)."""
