"""Evaluation prompts: each item's messages under its protocol's prompt set (:mod:`trex.prompt_contract`).

The answer contract is the same for every prompt set, so every sample is executed and scored the same
way: one ```python block whose program prints ``TREX_RESULT {"status", "objective", "values"}`` last.
The ``strict`` protocol uses the ``trex`` set, the very prompt ORData's SFT samples are trained on; the
published protocols use the set that reproduces their harness's framing. A prompt never holds the answer.
"""

from __future__ import annotations

import hashlib
import json

from trex.prompt_contract import CONTRACT_VERSION, DEFAULT_SET, PROTOCOL_PROMPT_SETS, prompt_messages
from trex.verify.items import Item

PROMPT_VERSION = CONTRACT_VERSION


def prompt_set_for(protocol: str) -> str:
    """The prompt set a protocol evaluates with."""
    return PROTOCOL_PROMPT_SETS.get(protocol, DEFAULT_SET)


def build_messages(item: Item, protocol: str, benchmark_format: str) -> list[dict[str, str]]:
    """Chat messages for one item under ``protocol``'s prompt set."""
    return prompt_messages(item.question, prompt_set_for(protocol), named=list(item.named),
                           data_file=benchmark_format == "bench4opt")


def prompt_hash(messages: list[dict[str, str]], reasoning_mode: str | None = None) -> str:
    """sha256 of the messages (canonical JSON) and the reasoning mode when one is set: a changed prompt or
    mode never reuses an old sample."""
    key: object = messages if reasoning_mode is None else {"messages": messages, "reasoning_mode": reasoning_mode}
    return hashlib.sha256(json.dumps(key, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
