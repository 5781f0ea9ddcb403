"""The pod environment contract the operator sets and every workload reads (see docs/ARCHITECTURE.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

ENV_VARS: tuple[str, ...] = (
    "TREX_JOB_KIND", "TREX_JOB_NAME", "TREX_ATTEMPT", "TREX_CONFIG", "MASTER_ADDR", "MASTER_PORT",
    "WORLD_SIZE", "RANK", "NNODES", "NODE_RANK", "NPROC_PER_NODE", "TREX_METRICS_PORT",
)


@dataclass(frozen=True)
class PodEnv:
    """Parsed env contract; defaults describe a single local process."""

    job_kind: str = ""
    job_name: str = "local"
    attempt: int = 0
    config_path: str | None = None
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    world_size: int = 1
    rank: int = 0
    nnodes: int = 1
    node_rank: int = 0
    nproc_per_node: int = 1
    metrics_port: int = 0
    rank_table_file: str | None = None
    completion_index: int | None = None


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {key}={raw!r} is not an integer") from None


def read_env(env: Mapping[str, str] | None = None) -> PodEnv:
    """Read the contract from ``env`` (default: os.environ); a malformed value raises naming the variable."""
    e = os.environ if env is None else env
    ci = e.get("JOB_COMPLETION_INDEX")
    return PodEnv(
        job_kind=e.get("TREX_JOB_KIND", ""),
        job_name=e.get("TREX_JOB_NAME", "local"),
        attempt=_int(e, "TREX_ATTEMPT", 0),
        config_path=e.get("TREX_CONFIG") or None,
        master_addr=e.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(e, "MASTER_PORT", 29500),
        world_size=_int(e, "WORLD_SIZE", 1),
        rank=_int(e, "RANK", 0),
        nnodes=_int(e, "NNODES", 1),
        node_rank=_int(e, "NODE_RANK", 0),
        nproc_per_node=_int(e, "NPROC_PER_NODE", 1),
        metrics_port=_int(e, "TREX_METRICS_PORT", 0),
        rank_table_file=e.get("RANK_TABLE_FILE") or None,
        completion_index=int(ci) if ci not in (None, "") else None,
    )
