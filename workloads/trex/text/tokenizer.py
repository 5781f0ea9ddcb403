"""Tokenizer: load a tokenizer.json, or train a byte-level BPE on the corpus and cache it (atomically)."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from trex.prompt_contract import REASONING_TOKENS, SPECIAL_TOKENS

PRETOKENIZER_VERSION = "digits3"
"""Part of the cache key: a tokenizer trained under another pre-tokenizer is never reused."""


def specials(reasoning: bool = False) -> list[str]:
    """The special tokens a trained tokenizer gets (ids 0.., in order): the contract's, then the think tags
    for a run with a reasoning mode (other runs keep exactly the vocabulary they had without them)."""
    return [*SPECIAL_TOKENS, *(REASONING_TOKENS if reasoning else ())]


def train_bpe(texts: Iterable[str], vocab_size: int, reasoning: bool = False, digit_group: int = 3) -> Tokenizer:
    """Train a byte-level BPE (every byte representable, specials first, digit groups isolated) on ``texts``.

    Numbers are cut into groups of at most ``digit_group`` digits before BPE, so a merge never spans a number's
    digits: 3 as DeepSeek-V3's tokenizer does (1234 is always "123" "4"), 1 for one token per digit."""
    if not 1 <= digit_group <= 9:
        raise ValueError(f"digit_group must be in 1..9, got {digit_group}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(rf"\p{{N}}{{1,{digit_group}}}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials(reasoning), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def check_specials(tok: Tokenizer, where: str, reasoning: bool = False) -> None:
    """A tokenizer must know every special token the trainer uses (the think tags too with a reasoning mode)."""
    missing = [s for s in specials(reasoning) if tok.token_to_id(s) is None]
    if missing:
        raise ValueError(f"{where}: tokenizer lacks special tokens {missing}"
                         + (" (data.reasoningMode needs the think tags)" if reasoning else ""))


def load_or_train(path: str | None, texts: Iterable[str], vocab_size: int, cache_dir: Path,
                  corpus_id: str, reasoning: bool = False) -> Tokenizer:
    """``path`` when given, else the cached BPE for (corpus, vocab) in ``cache_dir``, training it on a miss
    (under torch.distributed: rank 0 trains and writes it, the other ranks wait and read it)."""
    if path is not None:
        if not Path(path).is_file():
            raise ValueError(f"data.tokenizer.path: {path} does not exist")
        tok = Tokenizer.from_file(path)
        check_specials(tok, "data.tokenizer.path", reasoning)
        return tok
    spec = f"{corpus_id}:{vocab_size}:{','.join(specials(reasoning))}:{PRETOKENIZER_VERSION}"
    key = hashlib.sha256(spec.encode()).hexdigest()[:16]
    cached = cache_dir / f"tokenizer-{key}.json"
    run_once(lambda: _train_to(cached, texts, vocab_size, reasoning), cached.is_file, f"the tokenizer {cached}")
    return Tokenizer.from_file(str(cached))


def _train_to(cached: Path, texts: Iterable[str], vocab_size: int, reasoning: bool) -> None:
    """Train the BPE and write it atomically (temporary file, fsync, rename)."""
    tok = train_bpe(texts, vocab_size, reasoning)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    tok.save(str(tmp))
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, cached)


def run_once(make: Callable[[], object], done: Callable[[], bool], what: str) -> None:
    """Make what ``done`` says is missing, once: on rank 0 of an initialised torch.distributed job while the
    others wait at a barrier (then check ``done``), or in this process alone. Every rank of a job calls it,
    whatever it sees on disk: a rank that skipped it because rank 0's file had already appeared would leave
    rank 0 at the barrier while it went on to the next collective (a hang). A failure on rank 0 is raised
    there; a rank that does not see what rank 0 made (its directory is not shared with rank 0) makes its own
    copy (the writes are atomic and deterministic, so copies agree)."""
    dist = sys.modules.get("torch.distributed")  # only a process that already joined a job has it imported
    if dist is None or not dist.is_initialized() or dist.get_world_size() == 1:
        if not done():
            make()
        return
    if dist.get_rank() == 0:
        try:
            if not done():
                make()
        finally:
            dist.barrier()
        return
    dist.barrier()
    if not done():
        print(f"rank {dist.get_rank()}: {what} not visible after rank 0 made it; making it here",
              file=sys.stderr, flush=True)
        make()
