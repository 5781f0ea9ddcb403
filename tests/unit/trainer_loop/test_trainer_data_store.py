"""The token store equals today's in-memory path batch for batch (text and chat, world 1 and 2, across epochs,
sequence-length changes and resumes), is keyed by its sources, written once and atomically, and prepared by
`trex data prepare` so that training encodes nothing."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from data_reference import memory_loader
from tokenizers import Tokenizer
from trex.trainer.config import DataConfig
from trex.trainer.data import build as build_mod
from trex.trainer.data.build import build_data
from trex.trainer.data.store import TokenStore

WORDS = "plant ship cost demand supply tons units hours minimize maximize route depot truck load".split()


def _text_corpus(path: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    rows = [{"text": " ".join(rng.choice(WORDS) + str(rng.randint(0, 999)) for _ in range(rng.randint(1, 60)))}
            for _ in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _chat_corpus(path: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    rows = [{"messages": [{"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 30)))},
                          {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 30)))}]}
            for _ in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def _schedule(step: int) -> tuple[int, int]:
    """(micro-batch, seqLen) at ``step``: a curriculum that changes the window length mid-epoch."""
    return (2, 16) if step < 6 else (1, 40) if step < 11 else (3, 24)


@pytest.mark.parametrize("kind", ["text", "chat"])
@pytest.mark.parametrize("world", [1, 2])
def test_store_batches_equal_in_memory_path(tmp_path: Path, kind: str, world: int) -> None:
    data = (_text_corpus if kind == "text" else _chat_corpus)(tmp_path / "c.jsonl", 40)
    cfg = DataConfig.model_validate({"train": str(data), "tokenizer": {"vocabSize": 300}, "seed": 5})
    tok, _, fmt = build_data(cfg, tmp_path / "cache", 512)
    assert fmt == kind
    for rank in range(world):
        store = build_data(cfg, tmp_path / "cache", 512)[1]
        ref = memory_loader(cfg, tok)
        epochs: set[int] = set()
        step = 0
        while len(epochs) < 3:  # into a third epoch
            b, t = _schedule(step)
            _same(store.next_batch(b, t, rank, world), ref.next_batch(b, t, rank, world))
            epochs.add(store.state_dict()["epoch"])
            assert store.state_dict() == ref.state_dict(), step
            if step == 13:  # a resumed loader continues exactly
                fresh = build_data(cfg, tmp_path / "cache", 512)[1]
                fresh.load_state_dict(store.state_dict())
                store = fresh
            step += 1
        if kind == "chat":
            assert store.counts == ref.counts and store.counts["truncated"] > 0


def test_store_reads_only_its_windows(tmp_path: Path) -> None:
    data = _text_corpus(tmp_path / "c.jsonl", 400)
    cfg = DataConfig.model_validate({"train": str(data), "tokenizer": {"vocabSize": 300}})
    _, loader, _ = build_data(cfg, tmp_path / "cache", 512)
    assert isinstance(loader.docs, TokenStore)
    steps = 5
    for _ in range(steps):
        loader.next_batch(2, 16, rank=1, world=4)
    # 2 rows x (16 + 1) tokens x 2 bytes (uint16) per step, nothing else
    assert loader.docs.bytes_read == steps * 2 * 17 * 2


def test_store_key_follows_sources_and_stale_store_is_never_read(tmp_path: Path) -> None:
    data = _text_corpus(tmp_path / "c.jsonl", 50)
    cfg = DataConfig.model_validate({"train": str(data), "tokenizer": {"vocabSize": 300}})
    first = build_data(cfg, tmp_path / "cache", 512)[1].docs
    assert isinstance(first, TokenStore)
    again = build_data(cfg, tmp_path / "cache", 512)[1].docs
    assert isinstance(again, TokenStore) and again.path == first.path
    assert (first.path / "data.bin").stat().st_mtime_ns == (again.path / "data.bin").stat().st_mtime_ns  # skipped
    _text_corpus(data, 51, seed=1)  # the corpus changes: a new store, the tokenizer retrained
    changed = build_data(cfg, tmp_path / "cache", 512)[1].docs
    assert isinstance(changed, TokenStore) and changed.path != first.path and len(changed) == 51
    other_mode = DataConfig.model_validate({"train": str(_chat_corpus(tmp_path / "s.jsonl", 20)),
                                            "tokenizer": {"vocabSize": 300}})
    plain = build_data(other_mode, tmp_path / "cache", 512)[1].docs
    think = build_data(other_mode.model_copy(update={"reasoning_mode": "non-think"}), tmp_path / "cache", 512)[1].docs
    assert isinstance(plain, TokenStore) and isinstance(think, TokenStore) and plain.path != think.path
    with pytest.raises(ValueError, match="does not match the sources"):
        TokenStore(first.path, key="0" * 20)
    meta = json.loads((first.path / "meta.json").read_text())
    (first.path / "meta.json").write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        TokenStore(first.path)
    with pytest.raises(ValueError, match="missing or incomplete"):
        TokenStore(tmp_path / "nowhere")


def test_store_layout_and_header(tmp_path: Path) -> None:
    data = _chat_corpus(tmp_path / "s.jsonl", 30)
    cfg = DataConfig.model_validate({"train": str(data), "tokenizer": {"vocabSize": 300}})
    tok, loader, _ = build_data(cfg, tmp_path / "cache", 512)
    store = loader.docs
    assert isinstance(store, TokenStore)
    meta = json.loads((store.path / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["docs"] == 30 and meta["format"] == "chat"
    assert sorted(p.name for p in store.path.iterdir()) == ["data.bin", "data.idx", "data.mask.bin", "meta.json"]
    assert not list(store.path.parent.glob("*.tmp*"))
    ref = memory_loader(cfg, tok)
    for i in range(30):  # every document byte for byte (ids and loss mask)
        assert store[i].ids.tolist() == ref.docs[i].ids.tolist()
        assert store[i].mask.tolist() == ref.docs[i].mask.tolist()


def test_data_prepare_then_train_encodes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from trex.cli import main

    data = _chat_corpus(tmp_path / "s.jsonl", 40)
    conf = tmp_path / "job.yaml"
    conf.write_text(json.dumps({"mode": "sft", "model": {"preset": "tiny"},
                                "data": {"train": str(data), "tokenizer": {"vocabSize": 300},
                                         "storeDir": str(tmp_path / "stores")}}))
    assert main(["data", "prepare", "--config", str(conf), "--out", str(tmp_path / "run")]) == 0
    assert "40 chat documents" in capsys.readouterr().out

    grpo = tmp_path / "grpo.yaml"
    grpo.write_text(json.dumps({"mode": "grpo", "model": {"preset": "tiny"}, "data": {"train": str(data)}}))
    assert main(["data", "prepare", "--config", str(grpo)]) == 2
    assert "mode: grpo reads prompts" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"messages": []}) + "\n")
    conf.write_text(json.dumps({"model": {"preset": "tiny"}, "data": {"train": str(bad)}}))
    assert main(["data", "prepare", "--config", str(conf), "--out", str(tmp_path / "run")]) == 1
    assert "record 2 is not 'text' like the first record" in capsys.readouterr().err
    assert not [p for p in (tmp_path / "run" / "tokenizer").iterdir() if p.name.startswith("store-")]  # no partial store

    def boom(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("training start-up encoded or trained something")

    monkeypatch.setattr(build_mod, "encode_chat", boom)
    monkeypatch.setattr("trex.text.tokenizer.train_bpe", boom)
    cfg = DataConfig.model_validate({"train": str(data), "tokenizer": {"vocabSize": 300},
                                     "storeDir": str(tmp_path / "stores")})
    _, loader, _ = build_data(cfg, tmp_path / "run" / "tokenizer", 512)
    assert loader.next_batch(2, 32)["input_ids"].shape == (2, 32)


def test_prepared_tokenizer_is_read_not_retrained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _text_corpus(tmp_path / "c.jsonl", 30)
    cfg = DataConfig.model_validate({"train": str(data), "tokenizer": {"vocabSize": 300}})
    tok = build_data(cfg, tmp_path / "cache", 512)[0]
    monkeypatch.setattr("trex.text.tokenizer.train_bpe", lambda *_a, **_k: pytest.fail("retrained"))
    assert build_data(cfg, tmp_path / "cache", 512)[0].to_str() == Tokenizer.from_file(
        str(next((tmp_path / "cache").glob("tokenizer-*.json")))).to_str() == tok.to_str()
