"""LLM reconstruction: ask an OpenAI-compatible chat endpoint for a formulation and a gurobipy program.

The answer must hold a written formulation (Variables / Objective / Constraints) followed by one
fenced ```python block that solves the model and prints the :mod:`trex.sandbox` protocol line. The
last python block wins; the formulation is the text before it. Transport goes through the shared
:class:`trex.llm.client.ChatClient` (retries with exponential backoff on connection errors, 429 and
5xx only). Failures raise :class:`ReconstructionError` with a reason code from :data:`REASONS`.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trex.ordata.gates import REASONS as GATE_REASONS

if TYPE_CHECKING:
    from trex.llm.client import ChatClient
    from trex.ordata.config import EndpointConfig

REASONS: dict[str, str] = {k: v for k, v in GATE_REASONS.items() if k.startswith("llm.")}

SYSTEM_PROMPT = (
    "You are an expert in operations research and mathematical optimisation. Given an optimisation problem "
    "in natural language, first write its mathematical formulation with three sections titled 'Variables', "
    "'Objective' and 'Constraints' (define every symbol, state domains and integrality). Then write exactly one "
    "self-contained Python program in a ```python code block that builds and solves the model with gurobipy "
    "(no file, network or subprocess access; all data inline) and prints, as its last output, one line:\n"
    'TREX_RESULT {"status": "optimal", "objective": <objective value>, "values": {<variable name>: <value>}}\n'
    "formatted with json.dumps; use status 'infeasible', 'unbounded' or 'error' (objective null) when the "
    "model has no optimal solution."
)

_BLOCK = re.compile(r"```[ \t]*(python3?|py)[ \t]*\n(.*?)```", re.S | re.I)


class ReconstructionError(RuntimeError):
    """A reconstruction failed; ``reason`` is a code from :data:`REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown reconstruction reason {reason!r}")
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Reconstruction:
    """What the model wrote: formulation text, program, the raw answer and token usage."""

    formulation: str
    code: str
    raw: str
    usage: dict[str, Any] = field(default_factory=dict)


def build_messages(problem: str) -> list[dict[str, str]]:
    """The chat messages sent for ``problem``."""
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Problem:\n{problem.strip()}\n\nWrite the formulation, then the program."}]


def parse_answer(answer: str) -> tuple[str, str]:
    """(formulation, code) from an answer: the last python block is the code, the text before it the
    formulation; raises ReconstructionError(llm.no_code) when there is no non-empty python block."""
    blocks = [m for m in _BLOCK.finditer(answer) if m.group(2).strip()]
    if not blocks:
        raise ReconstructionError("llm.no_code", f"no ```python block in a {len(answer)}-character answer")
    last = blocks[-1]
    code = last.group(2).strip("\n") + "\n"
    formulation = _BLOCK.sub("", answer[: last.start()]).strip()
    return formulation, code


def make_client(endpoint: EndpointConfig, *, retries: int = 3, backoff_s: float = 0.5) -> ChatClient:
    """A chat client with the endpoint's sampling settings (API key from ``api_key_env`` if set)."""
    from trex.llm.client import ChatClient

    key = os.environ.get(endpoint.api_key_env) if endpoint.api_key_env else None
    return ChatClient(endpoint.url, endpoint.model, key, timeout_s=endpoint.timeout_s, retries=retries,
                      temperature=endpoint.temperature, max_tokens=endpoint.max_tokens, backoff_s=backoff_s,
                      concurrency=8)


async def reconstruct_async(problem: str, endpoint: EndpointConfig, *, seed: int | None = None,
                            client: ChatClient | None = None, retries: int = 3,
                            backoff_s: float = 0.5) -> Reconstruction:
    """Ask the endpoint and parse its answer (pass ``client`` to share one across many calls)."""
    from trex.llm.client import ChatError, ChatTimeout

    own = client is None
    chat = client if client is not None else make_client(endpoint, retries=retries, backoff_s=backoff_s)
    try:
        res = await chat.complete(build_messages(problem), seed=seed)
    except ChatTimeout as exc:
        raise ReconstructionError("llm.timeout", str(exc)) from exc
    except ChatError as exc:
        raise ReconstructionError("llm.http_error", str(exc)) from exc
    finally:
        if own:
            await chat.aclose()
    formulation, code = parse_answer(res.text)
    usage = {**res.usage.as_dict(), "attempts": res.attempts, "latency_s": res.latency_s}
    return Reconstruction(formulation=formulation, code=code, raw=res.text, usage=usage)


def reconstruct(problem: str, endpoint: EndpointConfig, *, seed: int | None = None, retries: int = 3,
                backoff_s: float = 0.5) -> Reconstruction:
    """Blocking :func:`reconstruct_async` (runs its own event loop; not for use inside one)."""
    return asyncio.run(reconstruct_async(problem, endpoint, seed=seed, retries=retries, backoff_s=backoff_s))
