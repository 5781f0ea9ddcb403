"""DeepSeek-V4's reasoning modes and DSML tool calls on the prompt contract's chat layout.

One renderer (:func:`render`) turns a conversation into the pieces SFT packing tokenizes and the text
`trex eval` and rollouts feed a model, so training and inference see the same tokens:

* **modes**: ``non-think`` opens the answer with the closing think tag (``<|assistant|></think>``, the
  model answers at once); ``think-high`` opens it with ``<think>`` (the model reasons, closes the tag,
  then answers); ``think-max`` is think-high with a special system prompt put before the system message
  (configurable; examples/evaljob-think-max.yaml carries the published text). Each mode has its
  context limit (:data:`CONTEXT_LIMITS`: 8K / 128K / 384K tokens).
* **interleaved thinking**: in a tool-call conversation (tools declared, tool calls or tool results)
  every assistant turn keeps its reasoning, since the model reasons across the calls; otherwise the
  reasoning of assistant turns before the last user turn is dropped (those turns render as non-think).
* **DSML**: an assistant turn's tool calls follow its content as one ``<｜DSML｜tool_calls>`` block of
  ``<｜DSML｜invoke name="...">`` elements whose ``<｜DSML｜parameter name="..." string="true|false">``
  children hold a raw string (``true``) or a JSON value (``false``). :func:`render_tool_calls` and
  :func:`parse_tool_calls` are exact inverses; malformed input raises :class:`DSMLError` naming the
  offset, line and column, what was expected and what was found. Tool results go back in a user turn
  as ``<tool_result>...</tool_result>`` blocks (consecutive results share one turn).

Messages are dicts: ``role`` (system, user, assistant, tool) and ``content``; an assistant message may
carry ``reasoning_content`` (str) and ``tool_calls`` (``[{"name": str, "arguments": {...}}]``); a
system message may carry ``tools`` (function schemas, rendered into its content).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from trex.prompt_contract import (
    BOS,
    CALLS_CLOSE,
    CALLS_OPEN,
    END,
    INVOKE_CLOSE,
    INVOKE_OPEN,
    PARAM_CLOSE,
    PARAM_OPEN,
    RESULT_CLOSE,
    RESULT_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    TOOLS_INTRO,
    role_token,
)

ReasoningMode = Literal["non-think", "think-high", "think-max"]
REASONING_MODES: tuple[str, ...] = get_args(ReasoningMode)
CONTEXT_LIMITS: dict[str, int] = {"non-think": 8 * 1024, "think-high": 128 * 1024, "think-max": 384 * 1024}
"""Context window (prompt + completion tokens) of each mode."""

_NAME = re.compile(r"[^\"<>\n]+")


@dataclass(frozen=True)
class Piece:
    """A run of the rendered conversation: one special token or plain text, and whether SFT trains on it
    (the tokens the model itself produces: reasoning, answer, tool calls and the closing tokens)."""

    text: str
    special: bool = False
    target: bool = False


@dataclass(frozen=True)
class ToolCall:
    """One DSML invoke: the tool's name and its arguments (str values are raw strings, others JSON)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Completion:
    """A parsed assistant completion: its reasoning (None in non-think mode), answer and tool calls."""

    reasoning: str | None
    content: str
    tool_calls: tuple[ToolCall, ...] = ()


class DSMLError(ValueError):
    """Malformed DSML; the message names the offset, line and column."""


# --- modes --------------------------------------------------------------------------------------------
def mode_problems(mode: str | None, think_max_prompt: str | None, max_tokens: int | None,
                  prefix: str, tokens_field: str) -> list[tuple[str, str]]:
    """(field, message) for a reasoning mode's settings: think-max needs its prompt and only think-max takes
    one; ``max_tokens`` (the field ``tokens_field``) stays within the mode's context limit."""
    out: list[tuple[str, str]] = []
    if mode == "think-max" and not (think_max_prompt or "").strip():
        out.append((f"{prefix}thinkMaxPrompt", "required when reasoningMode is think-max "
                    "(examples/evaljob-think-max.yaml holds the published text)"))
    if think_max_prompt is not None and mode != "think-max":
        out.append((f"{prefix}thinkMaxPrompt", f"only think-max uses it; reasoningMode is {mode}"))
    if mode is not None and max_tokens is not None and max_tokens > CONTEXT_LIMITS[mode]:
        out.append((tokens_field, f"{max_tokens} exceeds the {mode} context limit of {CONTEXT_LIMITS[mode]} tokens"))
    return out


def with_mode_prompt(messages: Sequence[Mapping[str, Any]], mode: str | None,
                     think_max_prompt: str | None) -> list[dict[str, Any]]:
    """``messages`` with think-max's system prompt put before the system message's content (a system
    message of its own when there is none); unchanged for the other modes."""
    out = [dict(m) for m in messages]
    if mode != "think-max":
        return out
    if not think_max_prompt:
        raise ValueError("thinkMaxPrompt: required when reasoningMode is think-max")
    if out and out[0].get("role") == "system":
        out[0]["content"] = think_max_prompt + str(out[0].get("content") or "")
        return out
    return [{"role": "system", "content": think_max_prompt}, *out]


def template_mode(mode: str | None) -> str | None:
    """The mode a chat template renders once :func:`with_mode_prompt` has put think-max's prompt into the
    messages: think-max renders as think-high (the prompt is all that tells them apart)."""
    return "think-high" if mode == "think-max" else mode


def answer_of(text: str, mode: str | None, server_split: bool) -> str:
    """The answer part of a completion: after the first ``</think>`` in think modes; without one, the whole
    text when the server already split the reasoning off (``server_split``), else nothing (the reasoning
    never closed, so there is no answer to score)."""
    _, answer, closed = split_reasoning(text, mode)
    return answer if closed else (text if server_split else "")


def is_tool_conversation(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Tools declared, or a tool call or tool result present: reasoning is then kept on every turn."""
    return any(m.get("tools") or m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def kept_reasoning(messages: Sequence[Mapping[str, Any]], mode: str) -> list[bool]:
    """Per message, whether an assistant turn renders its reasoning: never in non-think; in a tool-call
    conversation always; otherwise only after the last user turn."""
    if mode == "non-think":
        return [False] * len(messages)
    if is_tool_conversation(messages):
        return [m.get("role") == "assistant" for m in messages]
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    return [m.get("role") == "assistant" and i > last_user for i, m in enumerate(messages)]


# --- rendering -----------------------------------------------------------------------------------------
def tools_section(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system-prompt section that declares ``tools`` and explains the DSML call format."""
    return TOOLS_INTRO + "\n".join(json.dumps(dict(t), ensure_ascii=False, sort_keys=True) for t in tools)


def _check_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{where}: name {name!r} must be a non-empty string without quotes, '<', '>' or newlines")
    return name


def render_tool_calls(calls: Sequence[ToolCall]) -> str:
    """The DSML block of ``calls`` (empty for none); the exact inverse of :func:`parse_tool_calls`."""
    if not calls:
        return ""
    invokes = []
    for i, c in enumerate(calls):
        params = []
        for k, v in c.arguments.items():
            _check_name(k, f"tool_calls[{i}].arguments")
            raw = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
            if PARAM_CLOSE in raw:
                raise ValueError(f"tool_calls[{i}].arguments.{k}: value contains {PARAM_CLOSE}")
            params.append(f'{PARAM_OPEN} name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
                          f"{raw}{PARAM_CLOSE}\n")
        invokes.append(f'{INVOKE_OPEN} name="{_check_name(c.name, f"tool_calls[{i}]")}">\n{"".join(params)}'
                       f"{INVOKE_CLOSE}\n")
    return f"{CALLS_OPEN}\n{''.join(invokes)}{CALLS_CLOSE}"


def tool_calls_of(msg: Mapping[str, Any], where: str) -> tuple[ToolCall, ...]:
    """The ``tool_calls`` of a message as ToolCalls: {"name", "arguments": dict or JSON text}, or OpenAI's
    {"type": "function", "function": {"name", "arguments"}}."""
    out = []
    for j, c in enumerate(msg.get("tool_calls") or ()):
        if isinstance(c, ToolCall):
            out.append(c)
            continue
        if isinstance(c, Mapping) and isinstance(c.get("function"), Mapping):
            c = c["function"]
        if not isinstance(c, Mapping):
            raise ValueError(f"{where}.tool_calls[{j}]: must be an object with name and arguments")
        args = c.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}.tool_calls[{j}].arguments: invalid JSON ({e.msg})") from None
        if not isinstance(args, Mapping):
            raise ValueError(f"{where}.tool_calls[{j}].arguments: must be an object")
        out.append(ToolCall(_check_name(c.get("name"), f"{where}.tool_calls[{j}]"), dict(args)))
    return tuple(out)


def _answer(content: str, calls: Sequence[ToolCall]) -> str:
    return content + ("\n\n" + render_tool_calls(calls) if calls else "")


def render(messages: Sequence[Mapping[str, Any]], mode: str | None, *, think_max_prompt: str | None = None,
           add_generation_prompt: bool = False) -> list[Piece]:
    """The conversation as pieces: ``<|bos|>``, then ``<|role|>content<|end|>`` per turn (mode None: the plain
    contract layout); with a mode, assistant turns open with ``<think>`` or ``</think>`` as the mode and
    the interleaved-thinking rule say, carry their tool calls in DSML, and tool results become user turns."""
    if mode is not None and mode not in REASONING_MODES:
        raise ValueError(f"reasoningMode: {mode!r} is not one of {', '.join(REASONING_MODES)}")
    msgs = with_mode_prompt(messages, mode, think_max_prompt)
    shift = len(msgs) - len(messages)
    keep = kept_reasoning(msgs, mode) if mode is not None else [False] * len(msgs)
    out = [Piece(BOS, special=True)]
    for i, m in enumerate(msgs):
        where = f"messages[{max(i - shift, 0)}]"
        role, content = m.get("role"), m.get("content") or ""
        if not isinstance(content, str):
            raise ValueError(f"{where}.content: must be a string")
        if mode is None:
            extra = [k for k in ("reasoning_content", "tool_calls", "tools") if m.get(k)]
            if extra or role == "tool":
                raise ValueError(f"{where}.{extra[0] if extra else 'role'}: needs a reasoningMode (the plain "
                                 "layout has no thinking or tool calls)")
        if role == "tool":
            body = f"{RESULT_OPEN}{content}{RESULT_CLOSE}"
            if i and msgs[i - 1].get("role") == "tool":
                out.insert(len(out) - 1, Piece("\n\n" + body))
                continue
            out += [Piece(role_token("user"), special=True), Piece(body), Piece(END, special=True)]
            continue
        try:
            opener = role_token(str(role))
        except ValueError as e:
            raise ValueError(f"{where}.{e}") from None
        if role == "system" and m.get("tools"):
            content = (content + "\n\n" if content else "") + tools_section(m["tools"])
        if role != "assistant":
            out += [Piece(opener, special=True), Piece(content), Piece(END, special=True)]
            continue
        out.append(Piece(opener, special=True))
        if mode is not None:
            reasoning = m.get("reasoning_content") or ""
            if not isinstance(reasoning, str):
                raise ValueError(f"{where}.reasoning_content: must be a string")
            if keep[i]:
                out += [Piece(THINK_OPEN, special=True), Piece(reasoning, target=True),
                        Piece(THINK_CLOSE, special=True, target=True)]
            else:
                out.append(Piece(THINK_CLOSE, special=True))
        out += [Piece(_answer(content, tool_calls_of(m, where)), target=True), Piece(END, special=True, target=True)]
    if add_generation_prompt:
        out.append(Piece(role_token("assistant"), special=True))
        if mode is not None:
            out.append(Piece(THINK_CLOSE if mode == "non-think" else THINK_OPEN, special=True))
    return _merged(out)


def _merged(pieces: Sequence[Piece]) -> list[Piece]:
    """Adjacent text pieces of the same kind joined (so each is tokenized as one run), empty ones dropped."""
    out: list[Piece] = []
    for p in pieces:
        if not p.special and not p.text:
            continue
        if out and not p.special and not out[-1].special and out[-1].target == p.target:
            out[-1] = Piece(out[-1].text + p.text, target=p.target)
        else:
            out.append(p)
    return out


def render_text(messages: Sequence[Mapping[str, Any]], mode: str | None, *, think_max_prompt: str | None = None,
                add_generation_prompt: bool = False) -> str:
    """:func:`render` as one string (what a chat template produces)."""
    return "".join(p.text for p in render(messages, mode, think_max_prompt=think_max_prompt,
                                          add_generation_prompt=add_generation_prompt))


# --- parsing -----------------------------------------------------------------------------------------
class _Cursor:
    """Position in a DSML text with exact-match helpers whose errors say where and what."""

    def __init__(self, text: str, base: int) -> None:
        self.text, self.pos, self.base = text, 0, base

    def fail(self, expected: str) -> DSMLError:
        at = self.base + self.pos
        full_before = self.text[:self.pos]
        line = full_before.count("\n") + 1
        col = self.pos - (full_before.rfind("\n") + 1) + 1
        found = repr(self.text[self.pos:self.pos + 40]) if self.pos < len(self.text) else "the end of the text"
        return DSMLError(f"DSML at offset {at} (block line {line}, column {col}): expected {expected}, found {found}")

    def take(self, literal: str) -> None:
        if not self.text.startswith(literal, self.pos):
            raise self.fail(repr(literal))
        self.pos += len(literal)

    def peek(self, literal: str) -> bool:
        return self.text.startswith(literal, self.pos)

    def name(self, what: str) -> str:
        m = _NAME.match(self.text, self.pos)
        if m is None or not self.text.startswith('"', m.end()):
            raise self.fail(f"a quoted {what} name")
        self.pos = m.end() + 1
        return m.group(0)

    def until(self, literal: str, what: str) -> str:
        end = self.text.find(literal, self.pos)
        if end < 0:
            raise self.fail(f"{what} closed by {literal!r}")
        value, self.pos = self.text[self.pos:end], end + len(literal)
        return value


def parse_tool_calls(block: str, offset: int = 0) -> tuple[ToolCall, ...]:
    """The calls of one DSML block (``<｜DSML｜tool_calls>`` ... ``</｜DSML｜tool_calls>``, nothing after it
    but whitespace); DSMLError on anything else (``offset``: where the block sits in a longer text)."""
    c = _Cursor(block, offset)
    c.take(CALLS_OPEN + "\n")
    calls = []
    while not c.peek(CALLS_CLOSE):
        if not c.peek(INVOKE_OPEN + ' name="'):
            raise c.fail(f"'{INVOKE_OPEN} name=\"' or {CALLS_CLOSE!r}")
        c.take(INVOKE_OPEN + ' name="')
        tool = c.name("tool")
        c.take(">\n")
        args: dict[str, Any] = {}
        while not c.peek(INVOKE_CLOSE):
            at = c.pos
            if not c.peek(PARAM_OPEN + ' name="'):
                raise c.fail(f"'{PARAM_OPEN} name=\"' or {INVOKE_CLOSE!r}")
            c.take(PARAM_OPEN + ' name="')
            key = c.name("parameter")
            c.take(' string="')
            is_str = c.peek('true">')
            if not is_str and not c.peek('false">'):
                raise c.fail(f"string=\"true\" or \"false\" for parameter {key!r}")
            c.take('true">' if is_str else 'false">')
            start = c.pos
            raw = c.until(PARAM_CLOSE, f"parameter {key!r}")
            if key in args:
                c.pos = at
                raise c.fail(f"a parameter other than {key!r} (it is given twice in {tool!r})")
            if is_str:
                args[key] = raw
            else:
                try:
                    args[key] = json.loads(raw)
                except json.JSONDecodeError as e:
                    c.pos = start + e.pos
                    raise c.fail(f"JSON for parameter {key!r} of {tool!r} (string=\"false\"; {e.msg})") from None
            c.take("\n")
        c.take(INVOKE_CLOSE + "\n")
        calls.append(ToolCall(tool, args))
    c.take(CALLS_CLOSE)
    if block[c.pos:].strip():
        raise c.fail("nothing after the tool-calls block")
    return tuple(calls)


def split_reasoning(text: str, mode: str | None) -> tuple[str | None, str, bool]:
    """(reasoning, answer, closed) of a completion generated after the mode's generation prompt: in think
    modes the reasoning runs up to the first ``</think>`` (a leading ``<think>`` echoed by a server is
    dropped); ``closed`` is False when it never closed (the answer is then empty)."""
    if mode is None or mode == "non-think":
        return None, text, True
    body = text[len(THINK_OPEN):] if text.startswith(THINK_OPEN) else text
    reasoning, sep, answer = body.partition(THINK_CLOSE)
    if not sep:
        return reasoning, "", False
    return reasoning, answer, True


def parse_completion(text: str, mode: str | None) -> Completion:
    """An assistant completion (without its end token) as reasoning, answer and tool calls: the exact
    inverse of how :func:`render` writes a kept turn after the opener; DSMLError when malformed."""
    reasoning, answer, closed = split_reasoning(text, mode)
    if not closed:
        raise DSMLError(f"completion: no {THINK_CLOSE} closes the reasoning ({mode} mode)")
    at = answer.find(CALLS_OPEN)
    if at < 0:
        if INVOKE_OPEN in answer or PARAM_OPEN in answer:
            raise DSMLError(f"completion: DSML invoke or parameter outside a {CALLS_OPEN} block")
        return Completion(reasoning, answer)
    offset = len(text) - len(answer) + at
    content = answer[:at]
    content = content[:-2] if content.endswith("\n\n") else content
    return Completion(reasoning, content, parse_tool_calls(answer[at:], offset))
