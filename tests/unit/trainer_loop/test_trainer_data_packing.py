"""Packing boundaries/labels/positions against a naive reference, SFT masks, tokenizer, resumable order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from trex.text.chat import EncodedDoc, encode_chat
from trex.text.tokenizer import train_bpe
from trex.trainer.config import DataConfig
from trex.trainer.data.build import build_data
from trex.trainer.data.loader import PackedLoader
from trex.trainer.data.packing import IGNORE, concat, window
from trex.trainer.data.sources import DataError, demo_corpus, load_records


def _naive(docs: list[list[int]], masks: list[list[int]], start: int, t: int) -> dict[str, list[int]]:
    """Token-by-token reference: walk the flat stream keeping (doc, position-in-fragment)."""
    flat = [(tok, d, m) for d, (ids, ms) in enumerate(zip(docs, masks, strict=True)) for tok, m in zip(ids, ms, strict=True)]
    out: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": [], "doc_ids": []}
    local, pos, prev = -1, 0, None
    for i in range(start, start + t):
        tok, d, _ = flat[i]
        if d != prev:
            local, pos, prev = local + 1, 0, d
        out["input_ids"].append(tok)
        out["doc_ids"].append(local)
        out["position_ids"].append(pos)
        nt, nd, nm = flat[i + 1]
        out["labels"].append(nt if nd == d and nm else IGNORE)
        pos += 1
    return out


def test_window_matches_naive_reference() -> None:
    rng = np.random.default_rng(0)
    docs = [list(rng.integers(10, 99, size=n)) for n in (5, 1, 9, 3, 14, 2)]
    masks = [list(rng.integers(0, 2, size=len(d))) for d in docs]
    enc = [EncodedDoc(np.array(d), np.array(m, dtype=np.int8)) for d, m in zip(docs, masks, strict=True)]
    stream = concat(enc, range(len(enc)))
    total = sum(map(len, docs))
    for t in (1, 4, 7):
        for start in range(0, total - t):
            got = window(stream, start, t)
            ref = _naive(docs, masks, start, t)
            for k, v in ref.items():
                assert got[k].tolist() == v, (k, start, t)
            assert got["loss_mask"].tolist() == [float(x != IGNORE) for x in ref["labels"]]
    with pytest.raises(ValueError, match="runs past"):
        window(stream, total - 3, 3)


@pytest.fixture(scope="module")
def tok():  # type: ignore[no-untyped-def]
    return train_bpe([*demo_corpus(200), "Assistant answers: x = 3, y = 4. Café ∑"], 400)


def test_bytelevel_roundtrip_and_specials(tok) -> None:  # type: ignore[no-untyped-def]
    text = "Minimize 3x + 4y — subject to x ≥ 0; émigré 数据 🚚"
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text
    assert tok.token_to_id("<|assistant|>") is not None and tok.get_vocab_size() <= 400


def test_sft_loss_only_on_assistant_tokens(tok) -> None:  # type: ignore[no-untyped-def]
    msgs = [{"role": "system", "content": "You model LPs."},
            {"role": "user", "content": "Maximize x with x <= 3."},
            {"role": "assistant", "content": "x = 3"},
            {"role": "user", "content": "And y?"},
            {"role": "assistant", "content": "y = 4"}]
    doc = encode_chat(tok, msgs)
    stream = concat([doc, doc], [0, 1])
    w = window(stream, 0, len(doc.ids))
    targets = [int(x) for x in w["labels"] if x != IGNORE]
    end = tok.token_to_id("<|end|>")
    expected = [*tok.encode("x = 3", add_special_tokens=False).ids, end,
                *tok.encode("y = 4", add_special_tokens=False).ids, end]
    assert targets == expected
    assert "Maximize" not in tok.decode(targets)


def test_loader_resume_and_epochs_are_deterministic() -> None:
    rng = np.random.default_rng(1)
    docs = [EncodedDoc(rng.integers(0, 50, size=int(n)), np.ones(int(n), np.int8)) for n in rng.integers(3, 30, 40)]
    a = PackedLoader(docs, seed=7)
    plan = [(2, 16), (2, 16), (1, 32), (3, 8)] * 6  # crosses several epochs
    full = [a.next_batch(b, t) for b, t in plan]
    assert a.epoch >= 1
    b = PackedLoader(docs, seed=7)
    for bt in plan[:9]:
        b.next_batch(*bt)
    c = PackedLoader(docs, seed=7)
    c.load_state_dict(b.state_dict())
    for (bs, t), ref in zip(plan[9:], full[9:], strict=True):
        got = c.next_batch(bs, t)
        for k in ref:
            assert np.array_equal(got[k].numpy(), ref[k].numpy())
    # ranks split one global batch without overlap
    d0, d1 = PackedLoader(docs, seed=7), PackedLoader(docs, seed=7)
    r0, r1 = d0.next_batch(2, 16, rank=0, world=2), d1.next_batch(2, 16, rank=1, world=2)
    whole = PackedLoader(docs, seed=7).next_batch(4, 16)
    assert np.array_equal(np.concatenate([r0["input_ids"], r1["input_ids"]]), whole["input_ids"].numpy())
    other_seed = PackedLoader(docs, seed=8).next_batch(4, 16)
    assert not np.array_equal(other_seed["input_ids"].numpy(), whole["input_ids"].numpy())


def test_jsonl_errors_name_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_text('{"text": "ok"}\n{"text": broken}\n')
    with pytest.raises(DataError, match=r"a.jsonl:2: invalid JSON"):
        load_records(f)
    g = tmp_path / "b.jsonl"
    g.write_text('{"text": "ok"}\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(DataError, match="record 2"):
        load_records(g)
    with pytest.raises(DataError, match="does not exist"):
        load_records(tmp_path / "missing.jsonl")


def test_build_data_chat_file_and_tokenizer_cache(tmp_path: Path) -> None:
    f = tmp_path / "sft.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"What is {i}+{i}?"},
                          {"role": "assistant", "content": f"{2 * i}"}]} for i in range(60)]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig.model_validate({"train": str(f), "tokenizer": {"vocabSize": 300}})
    tok, loader, fmt = build_data(cfg, tmp_path / "cache", max_vocab=512)
    assert fmt == "chat" and tok.get_vocab_size() <= 300
    cached = list((tmp_path / "cache").glob("tokenizer-*.json"))
    assert len(cached) == 1
    tok2, _, _ = build_data(cfg, tmp_path / "cache", max_vocab=512)
    assert tok2.to_str() == tok.to_str()
    batch = loader.next_batch(2, 32)
    assert batch["input_ids"].shape == (2, 32) and int(batch["input_ids"].max()) < 300


def _chat_doc(prompt: int, answer: int, start: int) -> EncodedDoc:
    """A sample of ``prompt`` context tokens then ``answer`` loss tokens (ids from ``start``, unique per doc)."""
    ids = np.arange(start, start + prompt + answer)
    return EncodedDoc(ids, np.r_[np.zeros(prompt, np.int8), np.ones(answer, np.int8)])


def test_sft_packing_keeps_samples_whole_and_counts_truncated_and_dropped() -> None:
    from trex.trainer.data.loader import SampleLoader
    from trex.trainer.data.packing import fit, policy_counts

    sizes = [(4, 6), (3, 2), (12, 24), (40, 5), (2, 9), (5, 5), (6, 3)]  # (40, 5): prompt alone > 32
    docs = [_chat_doc(p, a, 1000 * (i + 1)) for i, (p, a) in enumerate(sizes)]
    assert [fit(d, 32) for d in docs] == ["whole", "whole", "truncated", "dropped", "whole", "whole", "whole"]
    assert policy_counts(docs, 32) == {"whole": 5, "truncated": 1, "dropped": 1}
    loader = SampleLoader(docs, seed=3, pad_id=0)
    seen: dict[int, int] = {}
    for _ in range(6):
        batch = loader.next_batch(2, 32)
        for row in range(2):
            ids, doc_ids = batch["input_ids"][row].tolist(), batch["doc_ids"][row].tolist()
            labels, pos = batch["labels"][row].tolist(), batch["position_ids"][row].tolist()
            for frag in sorted(set(doc_ids)):
                cols = [j for j, d in enumerate(doc_ids) if d == frag]
                tokens = [ids[j] for j in cols]
                if tokens[0] == 0:  # padding: context only
                    assert all(labels[j] == -100 for j in cols)
                    continue
                k = tokens[0] // 1000 - 1
                whole = docs[k].ids.tolist()
                # every fragment starts at its sample's first token (the prompt is never cut off) ...
                assert tokens == whole[:len(tokens)] and [pos[j] for j in cols] == list(range(len(tokens)))
                # ... and is either the whole sample or the one truncated sample filling the window
                assert len(tokens) == len(whole) or (len(tokens) == 32 and fit(docs[k], 32) == "truncated")
                seen[k] = seen.get(k, 0) + 1
    assert 3 not in seen and {0, 1, 2, 4, 5, 6} <= set(seen)
    assert loader.counts["dropped"] >= 1 and loader.counts["truncated"] >= 1
    with pytest.raises(ValueError, match=r"data\.seqLen: no sample's prompt fits"):
        SampleLoader([docs[3]], seed=0, pad_id=0).next_batch(1, 32)


def test_sft_loader_resumes_exactly_across_sequence_lengths_and_ranks() -> None:
    from trex.trainer.data.loader import SampleLoader

    rng = np.random.default_rng(4)
    docs = [_chat_doc(int(p), int(a), 1000 * (i + 1)) for i, (p, a) in enumerate(rng.integers(2, 14, (30, 2)))]
    plan = [(2, 32), (1, 64), (2, 24), (3, 32)] * 5
    whole = SampleLoader(docs, 9, 0)
    ref = [whole.next_batch(b, t) for b, t in plan]
    part = SampleLoader(docs, 9, 0)
    for bt in plan[:7]:
        part.next_batch(*bt)
    resumed = SampleLoader(docs, 9, 0)
    resumed.load_state_dict(part.state_dict())
    for (b, t), want in zip(plan[7:], ref[7:], strict=True):
        got = resumed.next_batch(b, t)
        assert all(np.array_equal(got[k].numpy(), want[k].numpy()) for k in want)
    r0 = SampleLoader(docs, 9, 0).next_batch(2, 32, rank=0, world=2)
    r1 = SampleLoader(docs, 9, 0).next_batch(2, 32, rank=1, world=2)
    both = SampleLoader(docs, 9, 0).next_batch(4, 32)
    assert np.array_equal(np.concatenate([r0["input_ids"], r1["input_ids"]]), both["input_ids"].numpy())
    with pytest.raises(ValueError, match="token offset"):
        resumed.load_state_dict({"epoch": 0, "offset": 10, "seed": 9})


def test_numbers_split_into_digit_groups_like_deepseek_v3() -> None:
    tok = train_bpe(["the payload is 1234567 kg and 98765 euros, 3.14159 per unit " * 40], 400)
    pieces = tok.encode("capacity 1234567 at 2048.5", add_special_tokens=False).tokens
    digits = [p.lstrip("Ġ") for p in pieces if p.lstrip("Ġ").isdigit()]
    # every number is cut into groups of at most three digits, left to right, and no piece mixes digits with text
    assert "".join(digits) == "123456720485" and all(len(d) <= 3 for d in digits)
    assert digits[:3] == ["123", "456", "7"]
    assert all(p.lstrip("Ġ").isdigit() or not any(ch.isdigit() for ch in p) for p in pieces)
    assert tok.decode(tok.encode("capacity 1234567 at 2048.5", add_special_tokens=False).ids) == "capacity 1234567 at 2048.5"


def test_single_digit_groups_give_one_token_per_digit() -> None:
    text = "the payload is 1234567 kg and 98765 euros, 3.14159 per unit "
    tok = train_bpe([text * 40], 400, digit_group=1)
    pieces = [p.lstrip("Ġ") for p in tok.encode("capacity 1234567 at 2048.5", add_special_tokens=False).tokens]
    assert [p for p in pieces if any(ch.isdigit() for ch in p)] == list("1234567") + list("2048") + list("5")
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text
    with pytest.raises(ValueError, match="digit_group"):
        train_bpe([text], 400, digit_group=0)
