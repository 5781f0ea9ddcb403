"""V4 reasoning modes and DSML: layouts written out by hand, the exported Jinja template against the renderer,
interleaved thinking, DSML round trips and precise errors, SFT masks, per-mode limits in the configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import ValidationError
from tokenizers import Tokenizer
from trex.evaluation.config import EvalConfig
from trex.evaluation.prompts import prompt_hash
from trex.prompt_contract import CHAT_TEMPLATE
from trex.reasoning import (
    CONTEXT_LIMITS,
    Completion,
    DSMLError,
    ToolCall,
    answer_of,
    parse_completion,
    parse_tool_calls,
    render,
    render_text,
    render_tool_calls,
)
from trex.text.chat import encode_chat, encode_prompt
from trex.text.tokenizer import train_bpe
from trex.trainer.config import DataConfig

MAX = "THINK HARD.\n\n"
CHAT = [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"}, {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2", "reasoning_content": "r2"}]


TOOL_CHAT = [
    {"role": "system", "content": "S", "tools": [{"name": "run", "description": "Run «code»",
                                                  "parameters": {"type": "object", "required": ["code"]}}]},
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "", "reasoning_content": "plan",
     "tool_calls": [{"type": "function", "function": {"name": "run", "arguments": {"code": "print('ä')\n", "n": 2}}},
                    {"name": "noop", "arguments": {}}]},
    {"role": "tool", "content": "ä"}, {"role": "tool", "content": "ok"},
    {"role": "assistant", "content": "done", "reasoning_content": "saw it"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "x", "reasoning_content": "r"}]


def _jinja(messages: list[dict[str, object]], gen: bool, **kw: object) -> str:
    def fail(msg: str) -> None:
        raise ValueError(msg)
    def tojson(x: object, ensure_ascii: bool = False, indent: int | None = None, separators: object = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,  # type: ignore[arg-type]
                          sort_keys=sort_keys)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders
    env.globals["raise_exception"] = fail
    env.filters["tojson"] = tojson
    return env.from_string(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=gen, **kw)


def test_modes_lay_out_v4_turns() -> None:
    ends = "<|end|>"
    hist = f"<|bos|><|system|>S{ends}<|user|>q1{ends}<|assistant|></think>a1{ends}<|user|>q2{ends}"
    assert render_text(CHAT, "non-think") == hist + f"<|assistant|></think>a2{ends}"
    # the earlier turn's reasoning is dropped at the new user turn, the last one keeps it
    assert render_text(CHAT, "think-high") == hist + f"<|assistant|><think>r2</think>a2{ends}"
    assert render_text(CHAT, "think-max", think_max_prompt=MAX) == (
        hist.replace("<|system|>S", f"<|system|>{MAX}S") + f"<|assistant|><think>r2</think>a2{ends}")
    assert render_text(CHAT[1:2], "think-max", think_max_prompt=MAX, add_generation_prompt=True) == (
        f"<|bos|><|system|>{MAX}{ends}<|user|>q1{ends}<|assistant|><think>")
    assert render_text(CHAT[:2], "non-think", add_generation_prompt=True).endswith("<|assistant|></think>")
    plain = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in CHAT]
    assert render_text(plain, None) == hist.replace("</think>", "") + f"<|assistant|>a2{ends}"
    assert CONTEXT_LIMITS == {"non-think": 8192, "think-high": 131072, "think-max": 393216}


@pytest.mark.parametrize("mode", [None, "non-think", "think-high", "think-max"])
@pytest.mark.parametrize("gen", [False, True])
def test_exported_chat_template_equals_renderer(mode: str | None, gen: bool) -> None:
    msgs = CHAT[:4] if gen else CHAT
    if mode is None:
        msgs = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in msgs]
    kw: dict[str, object] = {} if mode is None else {"reasoning_mode": mode}
    if mode == "think-max":
        kw["think_max_prompt"] = MAX
    assert _jinja(msgs, gen, **kw) == render_text(msgs, mode, think_max_prompt=MAX if mode == "think-max" else None,
                                                  add_generation_prompt=gen)
    if mode is None:
        with pytest.raises(ValueError, match="need a reasoning_mode"):
            _jinja([*msgs, {"role": "tool", "content": "1"}], gen, **kw)
        with pytest.raises(ValueError, match=r"messages\[\d\]\.role: needs a reasoningMode"):
            render_text([*msgs, {"role": "tool", "content": "1"}], None)
    else:
        tools = [*TOOL_CHAT[:-1]] if gen else TOOL_CHAT
        assert _jinja(tools, gen, **kw) == render_text(tools, mode, think_max_prompt=kw.get("think_max_prompt"),
                                                       add_generation_prompt=gen)


def test_tool_conversations_keep_thinking_across_turns() -> None:
    call = {"name": "run", "arguments": {"code": "print(2)"}}
    msgs = [{"role": "system", "content": "S", "tools": [{"name": "run", "parameters": {"type": "object"}}]},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "reasoning_content": "plan", "tool_calls": [call]},
            {"role": "tool", "content": "2"}, {"role": "tool", "content": "3"},
            {"role": "assistant", "content": "done", "reasoning_content": "saw 2"},
            {"role": "user", "content": "again"}]
    text = render_text(msgs, "think-high", add_generation_prompt=True)
    assert "<think>plan</think>" in text and "<think>saw 2</think>" in text  # kept past the new user turn
    assert '<|user|><tool_result>2</tool_result>\n\n<tool_result>3</tool_result><|end|>' in text
    assert "## Tools" in text and '"name": "run"' in text
    block = render_tool_calls([ToolCall("run", {"code": "print(2)"})])
    assert f"<|assistant|><think>plan</think>\n\n{block}<|end|>" in text
    assert text.endswith("<|user|>again<|end|><|assistant|><think>")


def test_dsml_round_trip_and_completion_parse() -> None:
    calls = (ToolCall("solve", {"code": 'm = Model("x")\nprint("<a>")\n', "n": 3, "eps": 1e-6, "ok": True,
                                "opts": {"a": [1, None]}, "s": "12"}), ToolCall("noop"))
    block = render_tool_calls(calls)
    assert parse_tool_calls(block) == calls
    assert isinstance(parse_tool_calls(block)[0].arguments["s"], str)  # string="true" stays a string
    for mode, text in (("think-high", f"why</think>ans\n\n{block}"), ("non-think", f"ans\n\n{block}")):
        c = parse_completion(text, mode)
        assert c == Completion("why" if mode == "think-high" else None, "ans", calls)
    assert parse_completion("<think>r</think>plain", "think-max") == Completion("r", "plain")
    # rendering a kept assistant turn then parsing what follows the opener gives the message back
    turn = {"role": "assistant", "content": "c\n\n", "reasoning_content": "r", "tool_calls": [
        {"name": "f", "arguments": json.dumps({"x": [1, 2]})}]}
    pieces = render([{"role": "user", "content": "u"}, turn], "think-high")
    gen = "".join(p.text for p in pieces[pieces.index(next(p for p in pieces if p.text == "<think>")) + 1:-1])
    assert parse_completion(gen, "think-high") == Completion("r", "c\n\n", (ToolCall("f", {"x": [1, 2]}),))


@pytest.mark.parametrize(("bad", "msg"), [
    ('<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n</｜DSML｜tool_calls>',
     r"offset 43 \(block line 3, column 1\): expected '<｜DSML｜parameter name=\"' or '</｜DSML｜invoke>', "
     r"found '</｜DSML｜tool_calls>'"),
    ('<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="x" string="maybe">1'
     '</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>', r"line 3, column 35\): expected string=\"true\" or \"false\" for parameter 'x', found 'maybe"),
    ('<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="x" string="false">[1,</｜DSML｜parameter>'
     '\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>', r"offset 87 \(block line 3, column 45\): expected JSON for parameter 'x' of 'f'"),
    ('<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="x" string="true">1</｜DSML｜parameter>\n'
     '<｜DSML｜parameter name="x" string="true">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
     r"line 4, column 1\): expected a parameter other than 'x' \(it is given twice in 'f'\)"),
    ('<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="x" string="true">1',
     r"column 41\): expected parameter 'x' closed by '</｜DSML｜parameter>', found '1'"),
    ('<｜DSML｜tool_calls>\n<｜DSML｜invoke name=f>\n', r"line 2, column 1\): expected '<｜DSML｜invoke name=\"' or '</｜DSML｜tool_calls>'"),
    ('<｜DSML｜tool_calls>\n</｜DSML｜tool_calls> and more', r"expected nothing after the tool-calls block"),
])
def test_malformed_dsml_errors_name_the_place(bad: str, msg: str) -> None:
    with pytest.raises(DSMLError, match=msg):
        parse_tool_calls(bad)


def test_completion_errors() -> None:
    with pytest.raises(DSMLError, match="no </think> closes the reasoning"):
        parse_completion("still thinking", "think-high")
    with pytest.raises(DSMLError, match="outside a <｜DSML｜tool_calls> block"):
        parse_completion('<｜DSML｜invoke name="f">', "non-think")
    with pytest.raises(ValueError, match=r"messages\[2\].reasoning_content: needs a reasoningMode"):
        render(CHAT[:3], None)
    with pytest.raises(ValueError, match=r"tool_calls\[0\]: name 'a\"b'"):
        render_tool_calls([ToolCall('a"b')])
    # the answer scored in eval: after </think>; an unclosed reasoning has none unless the server split it
    assert answer_of("r</think>```python\nx\n```", "think-high", False) == "```python\nx\n```"
    assert answer_of("```python\nx\n```", "think-high", False) == ""
    assert answer_of("```python\nx\n```", "think-high", True) == "```python\nx\n```"


def test_sft_masks_follow_generation() -> None:
    tok: Tokenizer = train_bpe(["reasoning answer question tool result " * 20], 300, reasoning=True)
    msgs = CHAT[1:3]
    doc = encode_chat(tok, msgs, "think-high")
    ids, mask = doc.ids.tolist(), doc.mask.tolist()
    think, close, end = (tok.token_to_id(t) for t in ("<think>", "</think>", "<|end|>"))
    # the generation prompt ends with <think> (context); reasoning, </think>, answer and <|end|> are targets
    start = ids.index(think)
    assert mask[:start + 1] == [0] * (start + 1)
    assert [i for i, m in zip(ids, mask, strict=True) if m] == [
        *tok.encode("r1", add_special_tokens=False).ids, close, *tok.encode("a1", add_special_tokens=False).ids, end]
    assert encode_prompt(tok, msgs[:1], "think-high").tolist() == ids[:start + 1]  # what a rollout continues
    assert encode_prompt(tok, msgs[:1], "non-think").tolist()[-1] == close
    openai_style = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}
    assert render_tool_calls([ToolCall("f", {"x": 1})]) in render_text([openai_style], "non-think")


def test_configs_check_modes_and_limits() -> None:
    base = {"benchmarks": [{"name": "nl4opt", "path": "x"}], "model": {"kind": "reference"}}
    with pytest.raises(ValidationError, match="thinkMaxPrompt: required when reasoningMode is think-max"):
        EvalConfig.model_validate({**base, "reasoningMode": "think-max"})
    with pytest.raises(ValidationError, match=r"model\.sampling\.maxTokens: 9000 exceeds the non-think context limit"):
        EvalConfig.model_validate({**base, "reasoningMode": "non-think",
                                   "model": {"kind": "reference", "sampling": {"maxTokens": 9000}}})
    with pytest.raises(ValidationError, match="thinkMaxPrompt: only think-max uses it"):
        EvalConfig.model_validate({**base, "reasoningMode": "think-high", "thinkMaxPrompt": "x"})
    with pytest.raises(ValidationError, match="reasoningMode"):
        EvalConfig.model_validate({**base, "reasoningMode": "think-low"})
    assert EvalConfig.model_validate({**base, "reasoningMode": "think-max", "thinkMaxPrompt": MAX}).think_max_prompt
    with pytest.raises(ValidationError, match="seqLenCurriculum: 9000 exceeds the non-think context limit of 8192"):
        DataConfig.model_validate({"reasoningMode": "non-think", "seqLenCurriculum": [{"step": 5, "seqLen": 9000}]})
    with pytest.raises(ValidationError, match="reasoningMode: applies to chat records"):
        DataConfig.model_validate({"reasoningMode": "non-think", "format": "text"})
    msgs = [{"role": "user", "content": "q"}]
    assert prompt_hash(msgs) != prompt_hash(msgs, "think-high") != prompt_hash(msgs, "non-think")


def test_eval_cli_flags(tmp_path: Path) -> None:
    from trex.config_base import ConfigError
    from trex.evaluation.cli import UsageError, _run_parser, build_config

    prompt = tmp_path / "max.txt"
    prompt.write_text(MAX)
    base = ["--benchmark", "nl4opt=x.jsonl", "--model", "reference"]
    cfg = build_config(_run_parser().parse_args([*base, "--reasoning-mode", "think-max", "--think-max-prompt-file",
                                                 str(prompt)]))
    assert (cfg.reasoning_mode, cfg.think_max_prompt) == ("think-max", MAX)
    with pytest.raises(ConfigError, match="thinkMaxPrompt: required"):  # one line naming the field
        build_config(_run_parser().parse_args([*base, "--reasoning-mode", "think-max"]))
    with pytest.raises(UsageError, match="--think-max-prompt-file: file"):
        build_config(_run_parser().parse_args([*base, "--think-max-prompt-file", str(tmp_path / "none")]))


def test_sft_records_name_the_bad_message(tmp_path: Path) -> None:
    from trex.trainer.data.build import build_data
    from trex.trainer.data.sources import DataError

    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"messages": CHAT[:3]}) + "\n")
    cfg = DataConfig.model_validate({"train": str(data), "tokenizer": {"vocabSize": 300}})
    with pytest.raises(DataError, match=r"sft.jsonl: record 1: messages\[2\]\.reasoning_content: needs a reasoningMode"):
        build_data(cfg, tmp_path / "cache", 512)
    ok = DataConfig.model_validate({"train": str(data), "tokenizer": {"vocabSize": 300}, "reasoningMode": "think-high"})
    tok, loader, fmt = build_data(ok, tmp_path / "cache", 512)
    assert fmt == "chat" and tok.token_to_id("<think>") == 7 and tok.token_to_id("</think>") == 8
    assert tok.token_to_id("<think>") in loader.docs[0].ids.tolist()
