"""Turn config.data into a tokenizer and a packed loader (demo corpus when data.train is unset)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from trex.trainer.config import DataConfig
from trex.trainer.data.loader import PackedLoader
from trex.trainer.data.packing import EncodedDoc, encode_chat, encode_text
from trex.trainer.data.sources import corpus_fingerprint, demo_corpus, load_records

DEMO_DOCS = 1500


def build_data(cfg: DataConfig, cache_dir: Path, max_vocab: int) -> tuple[Tokenizer, PackedLoader, str]:
    """(tokenizer, loader, format). The trained BPE has min(data.tokenizer.vocabSize, model vocab) tokens."""
    records: list[dict[str, Any]]
    texts: list[str]
    if cfg.train is None:
        fmt = "text"
        texts = demo_corpus(DEMO_DOCS, seed=cfg.seed)
        records = [{"text": t} for t in texts]
        corpus_id = f"demo:{DEMO_DOCS}:{cfg.seed}"
    else:
        fmt, records = load_records(cfg.train, cfg.format)
        corpus_id = corpus_fingerprint(cfg.train)
        texts = [r["text"] if fmt == "text" else "\n".join(m["content"] for m in r["messages"]) for r in records]
    vocab = min(cfg.tokenizer.vocab_size, max_vocab)
    from trex.trainer.data.tokenizer import load_or_train

    tok = load_or_train(cfg.tokenizer.path, texts, vocab, cache_dir, corpus_id)
    if tok.get_vocab_size() > max_vocab:
        raise ValueError(f"data.tokenizer.path: tokenizer has {tok.get_vocab_size()} tokens but the model's "
                         f"vocabulary is {max_vocab} (raise model.overrides.vocabSize)")
    docs: list[EncodedDoc] = [
        encode_text(tok, r["text"]) if fmt == "text" else encode_chat(tok, r["messages"]) for r in records
    ]
    return tok, PackedLoader(docs, cfg.seed), fmt
