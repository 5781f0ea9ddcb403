"""Encode documents into token ids and loss masks: plain text, and chat in the prompt contract's layout.

One encoding for every reader of the contract: the trainer's SFT samples and GRPO prompts, ORData's length
budgets and the checks of the chat template all tokenize a conversation here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from trex.prompt_contract import EOS
from trex.reasoning import Piece, render


@dataclass(frozen=True)
class EncodedDoc:
    """Token ids of one document and which of them are loss targets (1) or context only (0)."""

    ids: np.ndarray
    mask: np.ndarray


def _special(tok: Tokenizer, name: str) -> int:
    i = tok.token_to_id(name)
    if i is None:
        raise ValueError(f"tokenizer has no special token {name}")
    return int(i)


def encode_text(tok: Tokenizer, text: str) -> EncodedDoc:
    """<|bos|> text <|eos|>, every token a target."""
    ids = [_special(tok, "<|bos|>"), *tok.encode(text, add_special_tokens=False).ids, _special(tok, "<|eos|>")]
    return EncodedDoc(np.asarray(ids, dtype=np.int64), np.ones(len(ids), dtype=np.int8))


def encode_chat(tok: Tokenizer, messages: Sequence[dict[str, Any]], mode: str | None = None,
                think_max_prompt: str | None = None) -> EncodedDoc:
    """The conversation as :func:`trex.reasoning.render` lays it out (the prompt contract's chat layout; with
    a reasoning mode, think tags, DSML tool calls and tool results), then <|eos|>.

    Loss only on what the model produces: assistant reasoning, answers, tool calls and their closing tokens
    (the model learns to stop); the tag that opens an assistant turn is context, as at generation.
    """
    doc = _encode_pieces(tok, render(messages, mode, think_max_prompt=think_max_prompt))
    return EncodedDoc(np.append(doc.ids, _special(tok, EOS)), np.append(doc.mask, np.int8(0)))


def encode_prompt(tok: Tokenizer, messages: Sequence[dict[str, Any]], mode: str | None = None,
                  think_max_prompt: str | None = None) -> np.ndarray:
    """Token ids a model continues from to answer ``messages``: the same layout as :func:`encode_chat`, ending
    with the generation prompt (``<|assistant|>``, then ``<think>`` or ``</think>`` in a reasoning mode)."""
    return _encode_pieces(tok, render(messages, mode, think_max_prompt=think_max_prompt,
                                      add_generation_prompt=True)).ids


def _encode_pieces(tok: Tokenizer, pieces: Sequence[Piece]) -> EncodedDoc:
    """Each special piece as its token, each text piece tokenized on its own; the mask marks targets."""
    ids: list[int] = []
    mask: list[int] = []
    for p in pieces:
        body = [_special(tok, p.text)] if p.special else tok.encode(p.text, add_special_tokens=False).ids
        ids += body
        mask += [int(p.target)] * len(body)
    return EncodedDoc(np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.int8))
