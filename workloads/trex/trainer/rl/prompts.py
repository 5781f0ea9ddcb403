"""GRPO's prompts: items with ground truths read from data.train, their prompt tokens, and which of them a step uses.

The records are in a format `trex eval` reads (an ORDataJob's ``prompts`` rendering and held-out file use the
``ordata`` one), so a prompt is rendered exactly as the SFT samples and `trex eval` render it: the prompt
contract's messages for grpo.promptSet (:func:`trex.prompt_contract.prompt_messages`) in the chat layout of
:func:`trex.text.chat.encode_prompt`, ending with the generation prompt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from trex.trainer.config import TrainerConfig
from trex.trainer.data.sources import DataError, jsonl_files
from trex.verify.items import Item


def load_items(train: str, fmt: str, need_truths: bool = True) -> list[Item]:
    """Every item of the JSONL file(s) ``train`` names (a file, a folder of *.jsonl or a glob), in name order;
    ids must be distinct across files (and some hold ground truths when ``need_truths``). DataError names the
    file and record at fault."""
    from trex.verify.formats import FORMATS

    parse = FORMATS[fmt].parse
    items: list[Item] = []
    for f in jsonl_files(train):
        try:
            items.extend(parse(Path(f).read_bytes(), str(f)))
        except ValueError as e:
            raise DataError(f"data.train: {e}") from None
    seen: set[str] = set()
    for it in items:
        if it.id in seen:
            raise DataError(f"data.train: item id {it.id!r} occurs more than once in {train}")
        seen.add(it.id)
    if not items:
        raise DataError(f"data.train: {train} holds no prompts")
    if need_truths and all(it.truth is None and not it.named for it in items):
        raise DataError(f"data.train: {train} holds no ground truths (GRPO's rewards need them)")
    return items


def prompt_tokens(tok: Tokenizer, item: Item, fmt: str, prompt_set: str, reasoning_mode: str | None,
                  think_max_prompt: str | None) -> list[int]:
    """The tokens a model continues from to answer ``item``: the prompt set's messages (those its SFT samples and
    `trex eval` use) in the training chat layout, ending with the generation prompt."""
    from trex.prompt_contract import prompt_messages
    from trex.text.chat import encode_prompt

    messages = prompt_messages(item.question, prompt_set, named=list(item.named), data_file=fmt == "bench4opt")
    return [int(t) for t in encode_prompt(tok, messages, reasoning_mode, think_max_prompt)]


class PromptCache:
    """The prompt tokens of a run's items (:func:`prompt_tokens`), each encoded once, on first use."""

    def __init__(self, tok: Tokenizer, items: Sequence[Item], fmt: str, prompt_set: str, reasoning_mode: str | None,
                 think_max_prompt: str | None) -> None:
        self.tok, self.items, self.fmt, self.prompt_set = tok, items, fmt, prompt_set
        self.reasoning_mode, self.think_max_prompt = reasoning_mode, think_max_prompt
        self._tokens: dict[int, list[int]] = {}

    def __call__(self, index: int) -> list[int]:
        """Prompt tokens of item ``index``."""
        if index not in self._tokens:
            self._tokens[index] = prompt_tokens(self.tok, self.items[index], self.fmt, self.prompt_set,
                                                self.reasoning_mode, self.think_max_prompt)
        return self._tokens[index]


@dataclass(frozen=True)
class PromptOrder:
    """Which prompts step s uses: consecutive slices of a per-epoch permutation seeded by (seed, epoch). A pure
    function of the step, so a resumed run draws what the uninterrupted one drew (no loader state)."""

    count: int
    seed: int

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of epoch ``epoch``."""
        digest = hashlib.blake2b(f"grpo-prompts/{self.seed}/{epoch}".encode(), digest_size=8).digest()
        return np.random.default_rng(int.from_bytes(digest, "big")).permutation(self.count)

    def at(self, step: int, per_step: int) -> list[int]:
        """The ``per_step`` prompt indices of ``step`` (epochs wrap; a slice can span two epochs)."""
        if per_step < 1:
            raise ValueError(f"per_step must be >= 1, got {per_step}")
        out: list[int] = []
        start = step * per_step
        while len(out) < per_step:
            epoch, offset = divmod(start + len(out), self.count)
            perm = self.permutation(epoch)
            out.extend(int(i) for i in perm[offset:offset + per_step - len(out)])
        return out


def build_prompts(cfg: TrainerConfig, cache_dir: Path, max_vocab: int) -> tuple[Tokenizer, list[Item]]:
    """(tokenizer, items) of mode grpo or opd (its section's promptFormat and promptSet): data.tokenizer.path (the
    SFT run's tokenizer, normally), else a BPE trained on the rendered prompts and the reference answers."""
    from trex.text.tokenizer import load_or_train
    from trex.trainer.data.sources import corpus_fingerprint

    if cfg.data.train is None:
        raise DataError(f"data.train: mode {cfg.mode} needs prompts (an ORDataJob's prompts rendering or a benchmark "
                        "file)")
    from trex.prompt_contract import prompt_messages

    src = cfg.opd if cfg.mode == "opd" else cfg.grpo
    items = load_items(cfg.data.train, src.prompt_format, need_truths=cfg.mode == "grpo")
    texts = [m["content"] for it in items for m in prompt_messages(it.question, src.prompt_set)]
    texts += [str(it.meta["reference"]) for it in items if it.meta.get("reference")]
    vocab = min(cfg.data.tokenizer.vocab_size, max_vocab)
    tok = load_or_train(cfg.data.tokenizer.path, texts, vocab, cache_dir, corpus_fingerprint(cfg.data.train),
                        cfg.data.reasoning_mode is not None)
    if tok.get_vocab_size() > max_vocab:
        raise ValueError(f"data.tokenizer.path: tokenizer has {tok.get_vocab_size()} tokens but the model's "
                         f"vocabulary is {max_vocab} (raise model.overrides.vocabSize)")
    return tok, items
