"""Per-node launcher: one worker process per device (torchrun semantics) with fail-fast propagation.

Run as ``python -m trex.runtime.launch -- trex train --config ...`` inside a pod. Reads the pod env
contract (NNODES, NODE_RANK, NPROC_PER_NODE, ...), waits for the HCCL rank table to be ``completed``
when RANK_TABLE_FILE is set (Ascend), starts NPROC_PER_NODE copies of the command with RANK,
LOCAL_RANK, LOCAL_WORLD_SIZE and WORLD_SIZE set, and when one exits non-zero terminates the others
and exits with that code (so the pod fails and the operator restarts the gang).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from trex.runtime.env import read_env


def worker_env(env: Mapping[str, str], local_rank: int) -> dict[str, str]:
    """Environment of local worker ``local_rank``: global RANK = NODE_RANK x NPROC_PER_NODE + local rank.

    Only global rank 0 keeps TREX_METRICS_PORT (the port the operator scrapes); the others export none.
    """
    pod = read_env(env)
    out = dict(env)
    out.update({
        "RANK": str(pod.node_rank * pod.nproc_per_node + local_rank), "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(pod.nproc_per_node), "WORLD_SIZE": str(pod.nnodes * pod.nproc_per_node),
        "GROUP_RANK": str(pod.node_rank), "MASTER_ADDR": pod.master_addr, "MASTER_PORT": str(pod.master_port),
    })
    if out["RANK"] != "0":
        out.pop("TREX_METRICS_PORT", None)
    return out


def wait_rank_table(path: str, timeout_s: float, poll_s: float = 2.0) -> dict[str, object]:
    """Block until the rank table at ``path`` says status completed; TimeoutError after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    last = "missing"
    while True:
        try:
            table = json.loads(Path(path).read_text(encoding="utf-8"))
            if isinstance(table, dict) and table.get("status") == "completed":
                return table
            last = str(table.get("status") if isinstance(table, dict) else "not an object")
        except (OSError, ValueError):
            last = "unreadable"
        if time.monotonic() >= end:
            raise TimeoutError(f"rank table {path} not completed after {timeout_s:.0f}s (status: {last})")
        time.sleep(poll_s)


def _code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def launch(cmd: list[str], env: Mapping[str, str], nproc: int, grace_s: float = 30.0, poll_s: float = 0.1) -> int:
    """Run ``nproc`` copies of ``cmd``; return 0 when all succeed, else the first failure's exit code."""
    procs = [subprocess.Popen(cmd, env=worker_env(env, i)) for i in range(nproc)]

    def forward(signum: int, _frame: FrameType | None) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        failed: int | None = None
        while failed is None and any(p.poll() is None for p in procs):
            for p in procs:
                rc = p.poll()
                if rc is not None and rc != 0:
                    failed = _code(rc)
                    break
            else:
                time.sleep(poll_s)
        if failed is None:
            bad = [_code(p.returncode) for p in procs if p.returncode != 0]
            return bad[0] if bad else 0
        for p in procs:
            if p.poll() is None:
                p.terminate()
        end = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return failed
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    """Parse ``[options] -- command ...`` and launch; returns the exit code."""
    p = argparse.ArgumentParser(prog="python -m trex.runtime.launch",
                                description="Start one worker per device on this node (torchrun semantics).")
    p.add_argument("--rank-table-timeout", type=float, default=1800.0,
                   help="Seconds to wait for RANK_TABLE_FILE to be completed (Ascend; default 1800).")
    p.add_argument("--grace", type=float, default=30.0, help="Seconds between SIGTERM and SIGKILL (default 30).")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- followed by the worker command")
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        p.error("missing worker command after --")
    env = dict(os.environ)
    try:
        pod = read_env(env)
    except ValueError as exc:
        p.error(str(exc))
    if pod.nproc_per_node < 1 or pod.nnodes < 1:
        p.error(f"NPROC_PER_NODE ({pod.nproc_per_node}) and NNODES ({pod.nnodes}) must be positive")
    if pod.rank_table_file:
        try:
            wait_rank_table(pod.rank_table_file, args.rank_table_timeout)
        except TimeoutError as exc:
            print(f"launch: {exc}", file=sys.stderr)
            return 1
    return launch(cmd, env, pod.nproc_per_node, args.grace)


if __name__ == "__main__":
    sys.exit(main())
