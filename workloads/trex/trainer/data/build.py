"""Turn config.data into a tokenizer and a packed loader over a token store (demo corpus when data.train is unset).

The corpus is tokenised once into a token store (:mod:`~trex.trainer.data.store`; by `trex data prepare`, or
here by rank 0 while the other ranks wait at a barrier); every rank then reads only the windows it trains.
Text corpora stream through :class:`PackedLoader`; chat (SFT) corpora go through :class:`SampleLoader`,
which never separates a sample's prompt from its answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from trex.prompt_contract import PAD
from trex.text.chat import EncodedDoc, encode_chat, encode_text
from trex.text.tokenizer import load_or_train, run_once
from trex.trainer.config import DataConfig
from trex.trainer.data.loader import PackedLoader, SampleLoader
from trex.trainer.data.packing import fit_len
from trex.trainer.data.sources import DataError, corpus_fingerprint, demo_corpus, iter_jsonl, record_format
from trex.trainer.data.store import TokenStore, store_key, store_path, write_store

DEMO_DOCS = 1500


def _corpus(cfg: DataConfig) -> tuple[str, str, Callable[[], Iterator[dict[str, Any]]]]:
    """(format, corpus id, a fresh iterator over the records); the format comes from the first record."""
    if cfg.train is None:
        return "text", f"demo:{DEMO_DOCS}:{cfg.seed}", lambda: ({"text": t} for t in demo_corpus(DEMO_DOCS, cfg.seed))
    train = cfg.train
    first = next(iter_jsonl(train), None)
    if first is None:
        raise DataError(f"data.train: {train} holds no records")
    fmt = record_format(first, f"{train}: first ")
    if cfg.format != "auto" and cfg.format != fmt:
        raise DataError(f"data.format is {cfg.format!r} but {train} holds {fmt!r} records")
    return fmt, corpus_fingerprint(train), lambda: iter_jsonl(train)


def _text_of(rec: dict[str, Any], fmt: str) -> str:
    """What the tokenizer trains on: the text, or a chat's contents and reasoning joined by newlines."""
    if fmt == "text":
        return str(rec["text"])
    return "\n".join(t for m in rec["messages"] for t in (m["content"], m.get("reasoning_content"))
                     if isinstance(t, str))


def _checked(records: Iterator[dict[str, Any]], fmt: str, where: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index, record), each checked to be of the corpus format, one at a time."""
    for i, r in enumerate(records):
        if record_format(r, f"{where}: record {i + 1}: ") != fmt:
            raise DataError(f"{where}: record {i + 1} is not {fmt!r} like the first record")
        yield i, r


def _encoded(cfg: DataConfig, tok: Tokenizer, fmt: str, records: Iterator[dict[str, Any]]) -> Iterator[EncodedDoc]:
    """Each record checked against the corpus format and encoded, one at a time."""
    where = cfg.train or "the demo corpus"
    for i, r in _checked(records, fmt, where):
        try:
            yield (encode_text(tok, r["text"]) if fmt == "text"
                   else encode_chat(tok, r["messages"], cfg.reasoning_mode, cfg.think_max_prompt))
        except ValueError as e:
            raise DataError(f"{where}: record {i + 1}: {e}") from None


def prepare(cfg: DataConfig, cache_dir: Path, max_vocab: int) -> tuple[Tokenizer, TokenStore, str]:
    """(tokenizer, opened store, format): the tokenizer trained once and the corpus tokenised once into the
    store named by its key (skipped when present); under torch.distributed rank 0 does both, the rest read."""
    fmt, corpus_id, records = _corpus(cfg)
    if cfg.reasoning_mode is not None and fmt != "chat":
        raise ValueError(f"data.reasoningMode: applies to chat records; {cfg.train or 'the demo corpus'} holds text")
    vocab = min(cfg.tokenizer.vocab_size, max_vocab)

    def texts() -> Iterator[str]:  # read only where the tokenizer is trained
        for _, r in _checked(records(), fmt, cfg.train or "the demo corpus"):
            yield _text_of(r, fmt)

    tok = load_or_train(cfg.tokenizer.path, texts(), vocab, cache_dir, corpus_id, cfg.reasoning_mode is not None)
    if tok.get_vocab_size() > max_vocab:
        raise ValueError(f"data.tokenizer.path: tokenizer has {tok.get_vocab_size()} tokens but the model's "
                         f"vocabulary is {max_vocab} (raise model.overrides.vocabSize)")
    key = store_key(corpus_id, tok.to_str(), fmt, cfg.reasoning_mode, cfg.think_max_prompt)
    path = store_path(Path(cfg.store_dir) if cfg.store_dir else cache_dir, key)
    run_once(lambda: write_store(path, _encoded(cfg, tok, fmt, records()), fmt, tok.get_vocab_size(), key),
             lambda: (path / "meta.json").is_file(), f"the token store {path}")
    return tok, TokenStore(path, key), fmt


def build_data(cfg: DataConfig, cache_dir: Path, max_vocab: int) -> tuple[Tokenizer, PackedLoader | SampleLoader, str]:
    """(tokenizer, loader, format). The trained BPE has min(data.tokenizer.vocabSize, model vocab) tokens."""
    tok, store, fmt = prepare(cfg, cache_dir, max_vocab)
    if fmt == "text":
        return tok, PackedLoader(store, cfg.seed), fmt
    pad = tok.token_to_id(PAD)
    return tok, SampleLoader(store, cfg.seed, 0 if pad is None else int(pad)), fmt


def packing_line(loader: PackedLoader | SampleLoader | None, seq_len: int) -> str | None:
    """What the SFT packing policy does to this corpus at ``seq_len`` (None for streamed text and GRPO prompts);
    from the document index alone."""
    if not isinstance(loader, SampleLoader):
        return None
    c = {"whole": 0, "truncated": 0, "dropped": 0}
    for n, first in zip(loader.docs.lengths.tolist(), loader.docs.first_targets.tolist(), strict=True):
        c[fit_len(n, first, seq_len)] += 1
    lengths = np.sort(loader.docs.lengths)
    return (f"sft packing at seqLen {seq_len}: {len(lengths)} samples ({lengths[0]}-{lengths[-1]} tokens, median "
            f"{lengths[len(lengths) // 2]}): {c['whole']} whole, {c['truncated']} truncated (answer tail cut), "
            f"{c['dropped']} dropped (prompt longer than seqLen)")
