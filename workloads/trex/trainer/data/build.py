"""Turn config.data into a tokenizer and a packed loader (demo corpus when data.train is unset).

Text corpora stream through :class:`PackedLoader`; chat (SFT) corpora go through :class:`SampleLoader`,
which never separates a sample's prompt from its answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from trex.prompt_contract import PAD
from trex.text.chat import EncodedDoc, encode_chat, encode_text
from trex.trainer.config import DataConfig
from trex.trainer.data.loader import PackedLoader, SampleLoader
from trex.trainer.data.packing import policy_counts
from trex.trainer.data.sources import DataError, corpus_fingerprint, demo_corpus, load_records

DEMO_DOCS = 1500


def build_data(cfg: DataConfig, cache_dir: Path, max_vocab: int) -> tuple[Tokenizer, PackedLoader | SampleLoader, str]:
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
        texts = [r["text"] if fmt == "text" else "\n".join(
            t for m in r["messages"] for t in (m["content"], m.get("reasoning_content")) if isinstance(t, str))
            for r in records]
    vocab = min(cfg.tokenizer.vocab_size, max_vocab)
    from trex.text.tokenizer import load_or_train

    if cfg.reasoning_mode is not None and fmt != "chat":
        raise ValueError(f"data.reasoningMode: applies to chat records; {cfg.train or 'the demo corpus'} holds text")
    tok = load_or_train(cfg.tokenizer.path, texts, vocab, cache_dir, corpus_id, cfg.reasoning_mode is not None)
    if tok.get_vocab_size() > max_vocab:
        raise ValueError(f"data.tokenizer.path: tokenizer has {tok.get_vocab_size()} tokens but the model's "
                         f"vocabulary is {max_vocab} (raise model.overrides.vocabSize)")
    docs: list[EncodedDoc] = []
    for i, r in enumerate(records):
        try:
            docs.append(encode_text(tok, r["text"]) if fmt == "text"
                        else encode_chat(tok, r["messages"], cfg.reasoning_mode, cfg.think_max_prompt))
        except ValueError as e:
            raise DataError(f"{cfg.train}: record {i + 1}: {e}") from None
    if fmt == "text":
        return tok, PackedLoader(docs, cfg.seed), fmt
    pad = tok.token_to_id(PAD)
    return tok, SampleLoader(docs, cfg.seed, 0 if pad is None else int(pad)), fmt


def packing_line(loader: PackedLoader | SampleLoader | None, seq_len: int) -> str | None:
    """What the SFT packing policy does to this corpus at ``seq_len`` (None for streamed text and GRPO prompts)."""
    if not isinstance(loader, SampleLoader):
        return None
    c = policy_counts(loader.docs, seq_len)
    lengths = sorted(len(d.ids) for d in loader.docs)
    return (f"sft packing at seqLen {seq_len}: {len(lengths)} samples ({lengths[0]}-{lengths[-1]} tokens, median "
            f"{lengths[len(lengths) // 2]}): {c['whole']} whole, {c['truncated']} truncated (answer tail cut), "
            f"{c['dropped']} dropped (prompt longer than seqLen)")
