"""rollout.spawnLocal restarts (no vLLM): the engine's own server is a real child process, a stand-in for vLLM's
OpenAI server started through a stand-in environment's ``bin/python`` exactly as VLLMServer starts vLLM. Its tokens
are a function of (prompt, seed, step in the request, the weights it loaded), so a server restarted from the wrong
weights folder answers other tokens. kill -9 of its process group mid-rollout: the engine restarts it from the newest
pushed folder on the same port and the rollout equals an uninterrupted one; servers the trainer does not own are only
waited for."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from trex.trainer.config import RolloutConfig
from trex.trainer.objective import Series
from trex.trainer.rollout.engine import Rollout
from trex.trainer.rollout.sampling import SamplingParams
from trex.trainer.rollout.vllm_engine import VLLMRollouts, rollout_outcome
from trex.trainer.rollout.wal import RECORD_SIZE, RolloutLog

SERVER = r'''
import http.server, json, sys, time
args = sys.argv[1:]
port, model = int(args[args.index("--port") + 1]), args[args.index("--model") + 1]
weights = {"w": int(open(model + "/weights.txt").read()), "version": None}

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def answer(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.answer({"weight_version": weights["version"]})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}")
        if self.path.startswith("/collective_rpc"):
            weights["w"] = int(open(body["kwargs"]["weights_path"] + "/weights.txt").read())
        if self.path.startswith("/update_weight_version"):
            weights["version"] = body["new_version"]
        if not self.path.startswith("/v1/completions"):
            return self.answer({})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(body["max_tokens"]):
            tok = (sum(body["prompt"]) * 7 + body["seed"] * 13 + i * 29 + weights["w"]) % 500
            chunk = {"choices": [{"logprobs": {"tokens": [f"token_id:{tok}"], "token_logprobs": [-tok / 1000]}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.01)
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True

http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def _venv(root: Path) -> Path:
    """An environment whose bin/python runs the stand-in server whatever module it is asked for."""
    (root / "bin").mkdir(parents=True)
    (root / "server.py").write_text(SERVER)
    py = root / "bin" / "python"
    py.write_text(f"#!/bin/sh\nexec env -u PYTHONPATH {sys.executable} {root / 'server.py'} \"$@\"\n")
    py.chmod(0o755)
    return root


def _export(w: int) -> Callable[[Path], Path]:
    """An export that writes the stand-in weights ``w``."""

    def export(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "weights.txt").write_text(str(w))
        return folder
    return export


def test_a_spawned_server_that_dies_is_restarted_from_the_newest_weights(tmp_path: Path) -> None:
    cfg = RolloutConfig(engine="vllm", spawn_local=True, vllm_venv=str(_venv(tmp_path / "venv")), segment_tokens=8,
                        retry_seconds=120, weights_dir=str(tmp_path / "weights"))
    rollouts = VLLMRollouts(cfg, tmp_path)
    prompts, params = [[1, 2, 3], [4, 5], [6], [7, 8, 9]], SamplingParams(temperature=1.0, max_new_tokens=40)
    try:
        rollouts.ensure(_export(11), 0)  # spawned on version 0's export
        rollouts.ensure(_export(12), 1)  # then pushed version 1: the newest folder
        first, eng = rollouts.server, rollouts.engine
        assert first is not None and first.proc is not None
        ref = eng.generate(prompts, params, 5)
        log, out = tmp_path / "rollout.wal", dict[str, list[Rollout]]()
        worker = threading.Thread(target=lambda: out.update(got=eng.generate(prompts, params, 5, wal=RolloutLog(log))))
        worker.start()
        while not log.exists() or log.stat().st_size < 4 * 12 * RECORD_SIZE:
            assert worker.is_alive(), "the rollout ended before the kill"
            time.sleep(0.005)
        os.killpg(first.proc.pid, signal.SIGKILL)
        worker.join(120)
        got = out["got"]
        assert rollouts.restarts == 1 and rollouts.server is not first and first.proc.poll() is not None
        assert rollouts.server is not None and rollouts.server.port == first.port
        assert [r.tokens for r in got] == [r.tokens for r in ref]  # restarted on version 1's weights, not 0's
        assert eng.stats.cuts > 0 and eng.stats.kept > 0 and eng.stats.diverged == 0
        assert all(r.versions == [1] * 40 for r in got)
        metrics, series = rollout_outcome(rollouts)
        assert metrics["rollout_server_restarts"] == 1
        assert Series("rollout_server_restarts_total", 1.0, counter=True) in series
        assert rollout_outcome(rollouts)[0]["rollout_server_restarts"] == 0
        # a server that exited between steps comes back before the next push
        second = rollouts.server
        assert second.proc is not None
        os.killpg(second.proc.pid, signal.SIGKILL)
        second.proc.wait()
        rollouts.ensure(_export(13), 2)
        assert rollouts.restarts == 2 and eng.version == 2
    finally:
        rollouts.close()


def test_servers_the_trainer_does_not_own_are_not_restarted(tmp_path: Path) -> None:
    rollouts = VLLMRollouts(RolloutConfig(engine="vllm", servers=["http://127.0.0.1:9"]), tmp_path)
    assert rollouts.engine.revive is None and rollouts.server is None


def test_a_restart_that_does_not_serve_fails_naming_the_field(tmp_path: Path) -> None:
    """The restarted server exits at once (its weights folder is gone): one error naming rollout.retrySeconds."""
    cfg = RolloutConfig(engine="vllm", spawn_local=True, vllm_venv=str(_venv(tmp_path / "venv")),
                        retry_seconds=30, weights_dir=str(tmp_path / "weights"))
    rollouts = VLLMRollouts(cfg, tmp_path)
    try:
        rollouts.ensure(_export(11), 0)
        server = rollouts.server
        assert server is not None and server.proc is not None
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        (tmp_path / "weights" / "policy-00000000" / "weights.txt").unlink()
        with pytest.raises(RuntimeError, match=r"rollout.spawnLocal: the vLLM server http://127.0.0.1:\d+ exited "
                                               r"\(code -9\) and its restart from .* did not serve within "
                                               r"rollout.retrySeconds=30 s"):
            rollouts.engine.generate([[1, 2]], SamplingParams(max_new_tokens=4), 0)
    finally:
        rollouts.close()
