"""Rollouts: KV-cache decoding of the trainer's model, batched sampling and a token-level write-ahead log."""

from trex.trainer.rollout.cache import DecodeCache
from trex.trainer.rollout.engine import Rollout, generate
from trex.trainer.rollout.sampling import SamplingParams
from trex.trainer.rollout.wal import RolloutLog

__all__ = ["DecodeCache", "Rollout", "RolloutLog", "SamplingParams", "generate"]
