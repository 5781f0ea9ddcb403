"""The optional LLM proposer: answers are parsed into moves inside the parameter space, invalid proposals
are ignored, and a real OpenAI-compatible HTTP endpoint (a loopback server) is queried."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

from trex.kernels.llm import LLMProposer, build_messages, parse_proposals
from trex.kernels.search import Move

SPACE = {"VEC": (0, 8, 16), "THREADS": (1, 2), "BLOCK": (256, 512)}
PARAMS = {"VEC": 0, "THREADS": 2, "BLOCK": 256}


def test_parse_keeps_only_valid_moves() -> None:
    text = ('Try these: [{"param": "VEC", "value": 16}, {"param": "VEC", "value": 7}, {"param": "NOPE", "value": 1},'
            ' {"param": "THREADS", "value": 2}, {"param": "BLOCK", "value": "x"}] and also BLOCK=512, VEC=16')
    assert parse_proposals(text, SPACE, PARAMS) == [Move("VEC", 16), Move("BLOCK", 512)]
    assert parse_proposals("no idea", SPACE, PARAMS) == []


def test_prompt_carries_profile_and_space() -> None:
    msgs = build_messages("rmsnorm_fwd", {"regime": "memory"}, PARAMS, SPACE, [], [])
    assert msgs[0]["role"] == "system" and "memory" in msgs[1]["content"] and '"VEC": [0, 8, 16]' in msgs[1]["content"]


class _Handler(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.seen.append(body)
        answer = {"choices": [{"message": {"role": "assistant", "content": '[{"param": "VEC", "value": 8}]'},
                               "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        return None


def test_proposer_queries_an_openai_compatible_endpoint() -> None:
    srv = HTTPServer(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        prop = LLMProposer(f"http://127.0.0.1:{srv.server_address[1]}/v1", "m", None, "rmsnorm_fwd",
                           {"regime": "memory"}, SPACE, [])
        assert prop(PARAMS) == [Move("VEC", 8)]
        assert prop(PARAMS) == [Move("VEC", 8)]  # cached per configuration
        assert len(_Handler.seen) == 1 and _Handler.seen[0]["model"] == "m"
    finally:
        srv.shutdown()
    dead = LLMProposer("http://127.0.0.1:9/v1", "m", None, "k", {}, SPACE, [])
    assert dead(PARAMS) == [] and dead.errors == 1
