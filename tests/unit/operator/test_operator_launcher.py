"""The in-pod launcher the operator's TrainJob pods run: ranks, rank-table wait, fail-fast propagation."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from trex.runtime.launch import launch, main, wait_rank_table, worker_env

POD = {"NNODES": "2", "NODE_RANK": "1", "NPROC_PER_NODE": "3", "MASTER_ADDR": "w0.svc", "MASTER_PORT": "29500",
       "TREX_METRICS_PORT": "9400", "PATH": "/usr/bin:/bin"}


def test_worker_env_ranks() -> None:
    envs = [worker_env(POD, i) for i in range(3)]
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [
        ("3", "0", "6", "3"), ("4", "1", "6", "3"), ("5", "2", "6", "3")]
    assert all("TREX_METRICS_PORT" not in e for e in envs)  # only global rank 0 serves metrics
    assert worker_env({**POD, "NODE_RANK": "0"}, 0)["TREX_METRICS_PORT"] == "9400"


def test_launch_runs_one_process_per_device(tmp_path: Path) -> None:
    script = f"import os; open(os.path.join({str(tmp_path)!r}, os.environ['RANK']), 'w').write(os.environ['LOCAL_RANK'])"
    assert launch([sys.executable, "-c", script], POD, 3) == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"3": "0", "4": "1", "5": "2"}


def test_one_failure_stops_the_others_and_propagates_its_code(tmp_path: Path) -> None:
    """Rank 1 fails once ranks 0 and 2 are up; they are terminated (their 60 s sleep never completes)."""
    script = (f"import os, pathlib, sys, time\nd = pathlib.Path({str(tmp_path)!r})\nrank = os.environ['LOCAL_RANK']\n"
              "if rank == '1':\n"
              "    while not ((d / 'pid-0').exists() and (d / 'pid-2').exists()): time.sleep(0.01)\n"
              "    sys.exit(7)\n"
              "(d / f'pid-{rank}').write_text(str(os.getpid()))\n"
              "time.sleep(60)\n"
              "(d / f'finished-{rank}').write_text('')\n")
    assert launch([sys.executable, "-c", script], POD, 3, grace_s=5) == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pid-0", "pid-2"]  # nobody finished its sleep
    for rank in (0, 2):
        pid = int((tmp_path / f"pid-{rank}").read_text())
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", f"rank {rank} still runs"


def test_rank_table_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table completes while the launcher waits (after its first look), and a table that never does
    times out naming its status: both on a scripted clock, no wall-clock delays."""
    from trex.runtime import launch as launch_module

    path = tmp_path / "hccl.json"
    path.write_text(json.dumps({"status": "initializing"}))
    now = [0.0]
    polls: list[float] = []

    def sleep(s: float) -> None:  # the operator completes the table during the launcher's first poll pause
        polls.append(s)
        now[0] += s
        path.write_text(json.dumps({"status": "completed", "server_list": []}))

    monkeypatch.setattr(launch_module, "time", types.SimpleNamespace(monotonic=lambda: now[0], sleep=sleep))
    assert wait_rank_table(str(path), timeout_s=10, poll_s=0.05)["status"] == "completed"
    assert polls == [0.05]

    def idle(s: float) -> None:
        now[0] += s

    monkeypatch.setattr(launch_module, "time", types.SimpleNamespace(monotonic=lambda: now[0], sleep=idle))
    path.write_text(json.dumps({"status": "initializing"}))
    with pytest.raises(TimeoutError, match=r"not completed after 0s \(status: initializing\)"):
        wait_rank_table(str(path), timeout_s=0.2, poll_s=0.05)


def test_cli_requires_command_and_runs_module() -> None:
    with pytest.raises(SystemExit):
        main([])
    env = {**POD, "NODE_RANK": "0", "NPROC_PER_NODE": "2"}
    out = subprocess.run([sys.executable, "-m", "trex.runtime.launch", "--", sys.executable, "-c",
                          "import os; print('rank', os.environ['RANK'])"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split("\n")[:-1]) == ["rank 0", "rank 1"]
