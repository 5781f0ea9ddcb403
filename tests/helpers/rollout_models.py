"""Small float64 models for the rollout tests: one per attention kind the model has, and a worker
entry point that rolls out with a log and parks itself mid-rollout to be killed."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from trex.trainer.model import DeepSeekModel, ModelArgs, build_model_from_args
from trex.trainer.rollout import Rollout, RolloutLog, SamplingParams, generate

KINDS: dict[str, dict[str, Any]] = {
    "mla": dict(attention="mla", q_lora_rank=16),
    "mla-mhc-dense-hash": dict(attention="mla", q_lora_rank=0, hc_mult=2, num_layers=3, n_dense_layers=1,
                               n_hash_layers=1, mtp_depth=2),
    "sliding-mhc": dict(attention="csa", q_lora_rank=16, v_head_dim=24, csa_window=5, hc_mult=2,
                        layer_types=["sliding", "sliding"]),
    "csa-hca": dict(attention="csa", q_lora_rank=16, v_head_dim=24, csa_compress_every=4, csa_top_k=2,
                    csa_window=5, hca_compress_every=6, layer_types=["csa", "hca"]),
    "csa-mhc-hash": dict(attention="csa", q_lora_rank=16, v_head_dim=24, csa_compress_every=3, csa_top_k=2,
                         csa_window=4, hca_compress_every=5, hc_mult=4, n_hash_layers=1, scoring="sqrt-softplus",
                         layer_types=["sliding", "csa", "hca"], num_layers=3),
    # one index head: many entries tie at score 0, so the decode cache's top-k must break ties as training does
    "csa-ties": dict(attention="csa", q_lora_rank=16, v_head_dim=24, csa_compress_every=2, csa_top_k=3,
                     csa_window=4, csa_indexer_heads=1, hc_mult=2, layer_types=["csa", "csa"]),
}
VOCAB = 48


def tiny_model(kind: str, seed: int = 0, **extra: Any) -> DeepSeekModel:
    """A float64 model of the given attention kind with peaked enough logits to sample from."""
    args = ModelArgs(**{**KINDS[kind], "vocab_size": VOCAB, "init_std": 0.3, **extra})
    return build_model_from_args(args, dtype=torch.float64, seed=seed).eval()


KILL_PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [1, 2, 3, 4, 5], [11, 12, 13, 14, 15, 16, 17, 18], [20]]


def kill_test_job(log: str | None, on_step: Callable[[int], None] | None = None,
                  policy_version: int = 0) -> list[Rollout]:
    """The kill test's fixed rollout (csa + hca model, sampled with stop tokens), with or without a log."""
    params = SamplingParams(temperature=1.0, top_p=0.95, top_k=20, max_new_tokens=40, stop_tokens=(0, 1))
    wal = RolloutLog(log, fsync_every=7) if log is not None else None
    return generate(tiny_model("csa-hca"), KILL_PROMPTS, params, seed=1234, sample_ids=[10, 11, 12, 13, 14],
                    policy_version=policy_version, wal=wal, on_step=on_step)


def worker(log: str, marker: str, park_after: int) -> None:
    """Run kill_test_job with a log; after `park_after` steps touch `marker` and sleep (to be killed)."""

    def park(step: int) -> None:
        if step == park_after:
            Path(marker).write_text("parked")
            time.sleep(600)

    kill_test_job(log, on_step=park)


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))
