"""Optional hypothesis generator: asks an OpenAI-compatible model for parameter moves.

The prompt carries the kernel's roofline profile, the current configuration, recent trials and matching
skills; the answer is parsed as moves ({"param": ..., "value": ...} objects or PARAM=VALUE lines).
Anything outside the parameter space is ignored; a failing endpoint yields no proposals (the search
never depends on the model).
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from trex.kernels.backends.base import ParamSpace
from trex.kernels.search import Move
from trex.kernels.skills import Skill


def build_messages(kernel: str, profile: Mapping[str, Any], params: Mapping[str, int], space: ParamSpace,
                   trials: Sequence[Mapping[str, Any]], skills: Sequence[tuple[Skill, float]]) -> list[dict[str, str]]:
    """System + user messages describing the tuning state."""
    sk = [f"{s.direction}: {s.param} {s.old}->{s.new} gave x{s.gain:.2f} on {s.kernel} ({s.regime}, {s.bucket})"
          for s, _ in skills[:10]]
    tr = [f"{t['param']}={t['value']}: {t['status']} (gain {t.get('gain', 0):.3f})" for t in trials[-12:]]
    user = (f"Kernel: {kernel}\nProfile: {json.dumps(dict(profile), sort_keys=True)}\n"
            f"Current parameters: {json.dumps(dict(params), sort_keys=True)}\n"
            f"Allowed values: {json.dumps({k: list(v) for k, v in space.items()}, sort_keys=True)}\n"
            f"Recent trials:\n" + "\n".join(tr or ["(none)"]) + "\nSkills:\n" + "\n".join(sk or ["(none)"]) +
            "\nPropose up to 5 single-parameter changes likely to make the kernel faster, most promising first, "
            'as a JSON array of {"param": NAME, "value": INT}.')
    return [{"role": "system", "content": "You tune CPU/GPU kernels. Answer with JSON only."},
            {"role": "user", "content": user}]


def parse_proposals(text: str, space: ParamSpace, params: Mapping[str, int]) -> list[Move]:
    """Valid moves from a model answer, in order, without duplicates or no-ops."""
    found: list[tuple[str, Any]] = []
    m = re.search(r"\[.*\]", text, re.S)
    if m:
        try:
            for item in json.loads(m.group(0)):
                if isinstance(item, dict):
                    found.append((str(item.get("param", "")), item.get("value")))
        except json.JSONDecodeError:
            pass
    found += [(a, b) for a, b in re.findall(r"\b([A-Z_]+)\s*=\s*(-?\d+)\b", text)]
    out: list[Move] = []
    for p, v in found:
        try:
            iv = int(v)
        except (TypeError, ValueError):
            continue
        if p in space and iv in space[p] and iv != params.get(p) and Move(p, iv) not in out:
            out.append(Move(p, iv))
    return out


def _complete(url: str, model: str, key: str | None, messages: list[dict[str, str]]) -> str:
    try:
        from trex.llm.client import ChatClient

        return ChatClient(url, model, key, timeout_s=120.0, max_tokens=512).complete_sync(messages).text
    except ImportError:
        req = urllib.request.Request(url.rstrip("/") + "/chat/completions",
                                     data=json.dumps({"model": model, "messages": messages, "temperature": 0}).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
        with urllib.request.urlopen(req, timeout=120) as r:
            return str(json.loads(r.read())["choices"][0]["message"]["content"])


class LLMProposer:
    """Callable giving extra moves for a configuration (used as SearchConfig.extra_moves)."""

    def __init__(self, url: str, model: str, api_key_env: str | None, kernel: str, profile: Mapping[str, Any],
                 space: ParamSpace, skills: Sequence[tuple[Skill, float]]) -> None:
        self.url, self.model = url, model
        self.key = os.environ.get(api_key_env) if api_key_env else None
        self.kernel, self.profile, self.space, self.skills = kernel, dict(profile), space, list(skills)
        self.trials: list[Mapping[str, Any]] = []
        self._cache: dict[str, list[Move]] = {}
        self.errors = 0

    def __call__(self, params: Mapping[str, int]) -> list[Move]:
        key = json.dumps(dict(params), sort_keys=True)
        if key not in self._cache:
            try:
                text = _complete(self.url, self.model, self.key,
                                 build_messages(self.kernel, self.profile, params, self.space, self.trials, self.skills))
                self._cache[key] = parse_proposals(text, self.space, params)
            except Exception:  # the endpoint is advisory: any failure means no proposals
                self.errors += 1
                self._cache[key] = []
        return self._cache[key]
