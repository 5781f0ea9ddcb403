"""The vLLM engine's continuation requests (no server): what a sample that holds tokens sends next (prefix, remaining
budget, seed), the version gate between pushes and requests, and the error when a cut request's server never comes
back."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

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
    gate, order = VersionGate(), []
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
