"""The transformers and trex-checkpoint models on a tiny randomly initialised Llama saved to a temp
dir: generation matches Hugging Face's own generate, and the harness classifies its garbage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trex.evaluation.config import EvalConfig  # noqa: E402
from trex.evaluation.models.checkpoint import find_hf_export, load_checkpoint_model  # noqa: E402
from trex.evaluation.models.transformers_model import TransformersModel, render_chat  # noqa: E402
from trex.evaluation.runner import SAMPLES, read_samples, run_eval  # noqa: E402

# No backticks and no "import" in the vocabulary: the model cannot emit code a rule would extract.
WORDS = ["[UNK]", "[PAD]", "</s>", "the", "cost", "minimize", "x", "y", "=", "+", "1", "2", "value", "is",
         "optimal", "plan", "route", "truck", "system", "user", "assistant", ":"]
TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
            "{% if add_generation_prompt %}assistant : {% endif %}")


def save_tiny(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                                eos_token="</s>")
    fast.chat_template = TEMPLATE
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                                   eos_token_id=2, pad_token_id=1, bos_token_id=None)
    model = transformers.LlamaForCausalLM(cfg)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    fast.save_pretrained(path)
    return path


def test_greedy_generation_matches_hf_generate(tmp_path: Path) -> None:
    d = save_tiny(tmp_path / "tiny")
    ours = TransformersModel(d, max_new_tokens=12, device="cpu")
    msgs = [{"role": "user", "content": "minimize the cost of x + y"}]
    res = ours.generate_sync(msgs)
    tok = transformers.AutoTokenizer.from_pretrained(d)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(d)
    ids = tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), return_tensors="pt",
              add_special_tokens=False)
    out = ref_model.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=1)
    expected = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert res.text == expected
    assert res.usage.prompt_tokens == ids["input_ids"].shape[1]
    assert 1 <= res.usage.completion_tokens <= 12
    assert render_chat(tok, msgs).endswith("assistant : ")


async def test_harness_classifies_garbage_and_checkpoint_export(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    (root / "step-00000010").mkdir(parents=True)
    (root / "step-00000010" / "__0_0.distcp").write_bytes(b"\0")
    with pytest.raises(ValueError, match="no Hugging Face export"):
        find_hf_export(root)
    save_tiny(root / "step-00000010" / "hf")
    assert find_hf_export(root) == root / "step-00000010" / "hf"
    model = load_checkpoint_model(root, max_new_tokens=16, device="cpu")
    assert model.name == "trex-checkpoint:ckpt"

    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"en_question": f"plan route {i}", "en_answer": "3"}) + "\n" for i in range(2)))
    cfg = EvalConfig.model_validate({"benchmarks": [{"name": "nl4opt", "path": str(data)}],
                                     "model": {"kind": "trex-checkpoint", "path": str(root)},
                                     "output": str(tmp_path / "out")})
    outcome = await run_eval(cfg, model)
    recs = read_samples(tmp_path / "out" / SAMPLES)
    assert [r["category"] for r in recs] == ["no_code", "no_code"]
    assert all(r["usage"]["prompt_tokens"] > 50 and r["model"] == "trex-checkpoint:ckpt" for r in recs)
    assert outcome.summary["benchmarks"]["nl4opt"]["pass@1"] == 0.0
