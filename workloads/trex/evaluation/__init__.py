"""Zero-shot OR benchmark harness with pinned scoring protocols."""
