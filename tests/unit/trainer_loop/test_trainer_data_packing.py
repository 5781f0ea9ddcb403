"""Packing boundaries/labels/positions against a naive reference, SFT masks, tokenizer, resumable order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from trex.trainer.config import DataConfig
from trex.trainer.data.build import build_data
from trex.trainer.data.loader import PackedLoader
from trex.trainer.data.packing import IGNORE, EncodedDoc, concat, encode_chat, window
from trex.trainer.data.sources import DataError, demo_corpus, load_records
from trex.trainer.data.tokenizer import train_bpe


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
