"""The vLLM engine's continuation requests (no server): what a sample that holds tokens sends next (prefix, remaining
budget, seed), the version gate between pushes and requests, and the error when a cut request's server never comes
back."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from trex.trainer.rollout.external import request_seed
from trex.trainer.rollout.sampling import SamplingParams
from trex.trainer.rollout.vllm_engine import VersionGate, VLLMEngine, segment_request, segment_seed

PROMPT = [5, 6, 7]
SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=100, stop_tokens=(2,))
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=100)


def test_a_fresh_sample_sends_its_prompt_and_the_first_segment() -> None:
    start, body = segment_request(PROMPT, [], SAMPLED, 9, 4, 100, 16)
    assert start == 0 and body["prompt"] == PROMPT and body["max_tokens"] == 16
    assert body["seed"] == request_seed(9, 4)  # the whole-response request's seed: segment 0 keeps it
    assert body["stream"] is True and body["stop_token_ids"] == [2] and body["ignore_eos"] is False
    _, whole = segment_request(PROMPT, [], SAMPLED, 9, 4, 100, 0)
    assert whole["max_tokens"] == 100 and whole["seed"] == request_seed(9, 4)


def test_a_cut_sample_continues_from_its_segment_start_with_that_segments_seed() -> None:
    held = list(range(100, 137))  # 37 tokens: two whole segments of 16 and 5 of the third
    start, body = segment_request(PROMPT, held, SAMPLED, 9, 4, 100, 16)
    assert start == 32 and body["prompt"] == PROMPT + held[:32] and body["max_tokens"] == 16
    fresh_start, fresh = segment_request(PROMPT, held[:32], SAMPLED, 9, 4, 100, 16)
    assert fresh_start == 32 and fresh["seed"] == body["seed"]  # the uninterrupted run's third request
    assert len({segment_seed(9, 4, s) for s in (0, 16, 32)} | {segment_seed(9, 5, 32), segment_seed(8, 4, 32)}) == 5
    last, tail = segment_request(PROMPT, list(range(90)), SAMPLED, 9, 4, 100, 16)
    assert last == 80 and tail["max_tokens"] == 16 and len(tail["prompt"]) == 3 + 80  # type: ignore[arg-type]
    end, near = segment_request(PROMPT, list(range(90)), SAMPLED, 9, 4, 93, 16)
    assert end == 80 and near["max_tokens"] == 13  # the remaining budget bounds the segment


def test_greedy_and_diverged_samples_continue_at_the_end_of_the_log() -> None:
    held = list(range(100, 137))
    start, body = segment_request(PROMPT, held, GREEDY, 9, 4, 100, 16)
    assert start == 37 and body["prompt"] == PROMPT + held and body["max_tokens"] == 48 - 37
    start, body = segment_request(PROMPT, held, SAMPLED, 9, 4, 100, 16, replay=False)
    assert start == 37 and body["max_tokens"] == 11 and body["seed"] == segment_seed(9, 4, 37)
    start, body = segment_request(PROMPT, held, GREEDY, 9, 4, 100, 0)
    assert start == 37 and body["max_tokens"] == 63


def test_bad_requests_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="sample 4: 100 tokens held of a 100-token budget"):
        segment_request(PROMPT, list(range(100)), SAMPLED, 9, 4, 100, 16)
    with pytest.raises(ValueError, match="segment must be >= 0"):
        segment_request(PROMPT, [], SAMPLED, 9, 4, 100, -1)
    with pytest.raises(ValueError, match=r"rollout\.segmentTokens must be >= 0"):
        VLLMEngine(["http://127.0.0.1:1"], Path("."), segment=-2)


def test_a_push_waits_for_requests_in_flight_and_holds_new_ones_back() -> None:
    gate, order = VersionGate(), list[tuple[str, str, int | None]]()
    gate.version = 3
    entered = threading.Event()

    def request(name: str, hold: float) -> None:
        with gate.reading() as v:
            entered.set()
            order.append((name, "start", v))
            time.sleep(hold)
            order.append((name, "end", v))

    def push() -> None:
        with gate.writing():
            order.append(("push", "start", gate.version))
            time.sleep(0.05)
            gate.version = 4
            order.append(("push", "end", gate.version))

    first = threading.Thread(target=request, args=("a", 0.3))
    first.start()
    entered.wait()
    pusher = threading.Thread(target=push)
    pusher.start()
    time.sleep(0.1)
    second = threading.Thread(target=request, args=("b", 0.0))
    second.start()
    for t in (first, pusher, second):
        t.join()
    assert order == [("a", "start", 3), ("a", "end", 3), ("push", "start", 3), ("push", "end", 4),
                     ("b", "start", 4), ("b", "end", 4)]


def test_a_server_that_never_comes_back_fails_the_rollout_naming_it() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    eng = VLLMEngine([url], Path("."), retry_s=0.5)
    with pytest.raises(RuntimeError, match=re.escape(f"vLLM server {url} did not come back within rollout.retrySeconds=0.5 s")):
        eng.generate([PROMPT], SAMPLED, 0)


class ScriptedServer:
    """An OpenAI-completions endpoint on loopback that streams tokens the way vLLM's seeded sampling draws them: the
    i-th token of a request is a function of (its prompt, its seed, i), not of the position in the response. It
    answers /health, records every request body, can cut request ``cut[0]`` after ``cut[1]`` tokens (as a killed
    server does), can end every response early after ``eos_after`` tokens (an end-of-sequence token) and can fail
    every request (HTTP 500) while /health answers."""

    def __init__(self, cut: tuple[int, int] | None = None, eos_after: int | None = None, fail: bool = False) -> None:
        import http.server
        import json

        self.bodies: list[dict[str, Any]] = []
        self.cut, self.eos_after, self.fail = cut, eos_after, fail
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                if outer.fail:
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                n = body["max_tokens"] if outer.eos_after is None else min(body["max_tokens"], outer.eos_after)
                for i in range(n):
                    if outer.cut == (len(outer.bodies) - 1, i):
                        self.wfile.flush()
                        self.close_connection = True
                        return  # the connection drops: no [DONE]
                    tok = ScriptedServer.token(body["prompt"], body["seed"], i)
                    chunk = {"choices": [{"logprobs": {"tokens": [f"token_id:{tok}"],
                                                       "token_logprobs": [-tok / 1000]}}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def token(prompt: list[int], seed: int, step: int) -> int:
        return (sum(prompt) * 7 + seed * 13 + step * 29) % 500

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_cut_stream_continues_from_the_log_and_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    """Against a server with vLLM's per-request seeding: uninterrupted, then with a stream cut after 21 tokens
    (inside the second segment of 16): the result is the same; the continuation sent prompt + 16 tokens, seeded as
    the uninterrupted run's second segment, re-drew 5 tokens (checked, not logged twice), and the log holds each
    token once at its position."""
    from trex.trainer.rollout.wal import RolloutLog, group_records, read_log

    params = SamplingParams(temperature=1.0, max_new_tokens=40)
    ref_srv = ScriptedServer()
    try:
        ref = VLLMEngine([ref_srv.url], tmp_path, segment=16).generate([PROMPT], params, 9, sample_ids=[4])[0]
    finally:
        ref_srv.close()
    assert [b["max_tokens"] for b in ref_srv.bodies] == [16, 16, 8]
    srv = ScriptedServer(cut=(1, 21 - 16))
    log = tmp_path / "cut.wal"
    try:
        eng = VLLMEngine([srv.url], tmp_path, segment=16, retry_s=5)
        got = eng.generate([PROMPT], params, 9, sample_ids=[4], wal=RolloutLog(log))[0]
    finally:
        srv.close()
    assert got.tokens == ref.tokens and got.logprobs == ref.logprobs
    assert [(len(b["prompt"]), b["max_tokens"], b["seed"]) for b in srv.bodies] == [
        (3, 16, segment_seed(9, 4, 0)), (19, 16, segment_seed(9, 4, 16)), (19, 16, segment_seed(9, 4, 16)),
        (35, 8, segment_seed(9, 4, 32))]
    st = eng.stats
    assert (st.cuts, st.kept, st.prefix_tokens, st.replayed, st.diverged, st.requests) == (1, 21, 16, 5, 0, 4)
    _, records, _ = read_log(log.read_bytes(), log)
    assert group_records(records, log)[4].tokens == ref.tokens
    again = VLLMEngine([srv.url], tmp_path).generate([PROMPT], params, 9, sample_ids=[4], wal=RolloutLog(log))[0]
    assert again.tokens == ref.tokens and again.resumed == 40  # all read back: nothing sent to the (closed) server


def test_a_response_the_server_ends_early_is_not_continued(tmp_path: Path) -> None:
    """A server that ends a response before max_tokens (its end-of-sequence token, not one of ours) ends the sample."""
    srv = ScriptedServer(eos_after=5)
    try:
        got = VLLMEngine([srv.url], tmp_path, segment=16).generate([PROMPT], SAMPLED, 9)[0]
    finally:
        srv.close()
    assert len(got.tokens) == 5 and len(srv.bodies) == 1 and got.finish_reason is None


def test_a_server_that_keeps_failing_requests_fails_the_rollout_naming_it(tmp_path: Path) -> None:
    """HTTP 500 on every request while /health answers: retried for retrySeconds, then one error naming the server."""
    srv = ScriptedServer(fail=True)
    try:
        with pytest.raises(RuntimeError, match=re.escape(f"vLLM server {srv.url} kept cutting requests within "
                                                         "rollout.retrySeconds=1 s")):
            VLLMEngine([srv.url], tmp_path, retry_s=1).generate([PROMPT], SAMPLED, 9)
    finally:
        srv.close()
    assert len(srv.bodies) > 1  # it did retry
