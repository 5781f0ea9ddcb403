"""The exported tokenizer's chat template under each reasoning mode gives the SFT packing's tokens, and a local
model's decoding keeps the think tags the answer is split at."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

transformers = pytest.importorskip("transformers")

from trex.evaluation.models.transformers_model import TransformersModel, render_chat  # noqa: E402
from trex.reasoning import answer_of, render_text, template_mode, with_mode_prompt  # noqa: E402
from trex.text.chat import encode_chat  # noqa: E402
from trex.text.tokenizer import train_bpe  # noqa: E402
from trex.trainer.export import save_tokenizer  # noqa: E402

MAX = "Reason with care.\n\n"
MSGS = [{"role": "system", "content": "You model LPs."}, {"role": "user", "content": "Maximise x, x <= 4."},
        {"role": "assistant", "content": "x = 4 (##objective 4)", "reasoning_content": "x is bounded by 4."},
        {"role": "user", "content": "And 2x?"},
        {"role": "assistant", "content": "```python\nprint(8)\n```", "reasoning_content": ">##double it"}]

TOOLS = [{"role": "system", "content": "", "tools": [{"name": "solve", "parameters": {"type": "object"}}]},
         {"role": "user", "content": "Solve it."},
         {"role": "assistant", "content": "Calling.", "reasoning_content": "use the tool",
          "tool_calls": [{"type": "function", "function": {"name": "solve", "arguments": {"x": [1, 2], "s": "a<b"}}}]},
         {"role": "tool", "content": "{\"objective\": 4}"},
         {"role": "assistant", "content": "4", "reasoning_content": "it said 4"}]


@pytest.mark.parametrize("mode", ["non-think", "think-high", "think-max"])
def test_template_tokens_equal_sft_packing(tmp_path: Path, mode: str) -> None:
    raw = train_bpe(["maximise objective bounded double python print " * 30], 320, reasoning=True)
    save_tokenizer(raw, tmp_path, 512)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    prompt = MAX if mode == "think-max" else None
    kw = {"reasoning_mode": mode, **({"think_max_prompt": MAX} if prompt else {})}
    for msgs in (MSGS, TOOLS):
        templated = tok.apply_chat_template(msgs, tokenize=False, **kw)
        assert templated == render_text(msgs, mode, think_max_prompt=prompt)
        packed = encode_chat(raw, msgs, mode, prompt).ids.tolist()[:-1]
        assert tok(templated, add_special_tokens=False)["input_ids"] == packed
    # what `trex eval` sends: think-max's prompt in the messages, the template rendering the mode
    sent = render_chat(tok, with_mode_prompt(MSGS[:4], mode, prompt), template_mode(mode))
    assert sent == render_text(MSGS[:4], mode, think_max_prompt=prompt, add_generation_prompt=True)
    if mode != "non-think":
        ids = tok("x is bounded.</think>```python\nprint(4)\n```<|end|>", add_special_tokens=False)["input_ids"]
        text = TransformersModel._decode(SimpleNamespace(tokenizer=tok, reasoning_mode=mode), ids)  # type: ignore[arg-type]
        assert text == "x is bounded.</think>```python\nprint(4)\n```"
        assert answer_of(text, mode, server_split=False) == "```python\nprint(4)\n```"


def test_local_model_renders_the_mode_and_keeps_to_its_context(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from trex.evaluation.models import transformers_model
    from trex.text.chat import encode_prompt

    raw = train_bpe(["maximise objective bounded double python print " * 30], 320, reasoning=True)
    save_tokenizer(raw, tmp_path, 512)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=raw.get_vocab_size(), hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                   max_position_embeddings=512, eos_token_id=6, pad_token_id=0, bos_token_id=1)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path, safe_serialization=True)
    msgs = with_mode_prompt(MSGS[:2], "think-max", MAX)
    prompt_ids = encode_prompt(raw, MSGS[:2], "think-max", MAX).tolist()
    assert raw.id_to_token(prompt_ids[-1]) == "<think>"
    monkeypatch.setitem(transformers_model.CONTEXT_LIMITS, "think-max", len(prompt_ids) + 3)
    model = TransformersModel(tmp_path, max_new_tokens=40, device="cpu", reasoning_mode="think-max")
    res = model.generate_sync(msgs)
    assert res.usage.prompt_tokens == len(prompt_ids)  # the same tokens a rollout continues from
    assert res.usage.completion_tokens <= 3
    monkeypatch.setitem(transformers_model.CONTEXT_LIMITS, "think-max", len(prompt_ids))
    full = model.generate_sync(msgs)
    assert (full.text, full.finish_reason, full.usage.completion_tokens) == ("", "length", 0)
    plain = tmp_path / "plain"
    plain.mkdir()
    save_tokenizer(train_bpe(["maximise objective " * 30], 300), plain, 512)
    cfg.save_pretrained(plain)  # refused before any weights load
    with pytest.raises(ValueError, match=r"evaluation\.reasoningMode: the tokenizer of .* has no <think> </think>"):
        TransformersModel(plain, device="cpu", reasoning_mode="non-think")
