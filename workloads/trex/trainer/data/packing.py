"""Pack encoded documents (:mod:`trex.text.chat`) into fixed-length sequences, keeping boundaries.

Text (pretrain / CPT) documents are concatenated into one stream cut into windows, so a long document
continues in the next window. Chat (SFT) samples are packed whole (:func:`pack_samples`): a window holds
complete samples and padding, never a sample's prompt without its answer. A packed window of T tokens
carries: input_ids; doc_ids (0, 1, ... per document fragment in the window); position_ids restarting
at 0 for every fragment; labels = the next token when it belongs to the same document and is a loss
token, else -100; loss_mask = (labels != -100).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trex.text.chat import EncodedDoc

IGNORE = -100


@dataclass(frozen=True)
class Stream:
    """Documents concatenated: token ids, per-token loss mask and per-token document index."""

    ids: np.ndarray
    mask: np.ndarray
    doc: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def concat(docs: Sequence[EncodedDoc], order: Sequence[int] | np.ndarray) -> Stream:
    """Concatenate ``docs`` in ``order`` into one stream."""
    parts = [docs[i] for i in order]
    ids = np.concatenate([d.ids for d in parts]) if parts else np.zeros(0, np.int64)
    mask = np.concatenate([d.mask for d in parts]) if parts else np.zeros(0, np.int8)
    doc = np.repeat(np.arange(len(parts), dtype=np.int64), [len(d.ids) for d in parts])
    return Stream(ids, mask, doc)


def window(stream: Stream, start: int, seq_len: int) -> dict[str, np.ndarray]:
    """The packed sequence of ``seq_len`` tokens at ``start`` (needs start + seq_len + 1 <= len(stream))."""
    end = start + seq_len
    if end + 1 > len(stream):
        raise ValueError(f"window [{start}, {end}] runs past the stream ({len(stream)} tokens)")
    ids = stream.ids[start:end]
    doc = stream.doc[start:end]
    nxt_doc = stream.doc[start + 1:end + 1]
    same = nxt_doc == doc
    labels = np.where(same & (stream.mask[start + 1:end + 1] > 0), stream.ids[start + 1:end + 1], IGNORE)
    new_frag = np.ones(seq_len, dtype=bool)
    new_frag[1:] = doc[1:] != doc[:-1]
    local_doc = np.cumsum(new_frag) - 1
    frag_start = np.maximum.accumulate(np.where(new_frag, np.arange(seq_len), 0))
    positions = np.arange(seq_len) - frag_start
    return {
        "input_ids": ids.astype(np.int64),
        "labels": labels.astype(np.int64),
        "position_ids": positions.astype(np.int64),
        "doc_ids": local_doc.astype(np.int64),
        "loss_mask": (labels != IGNORE).astype(np.float32),
    }


# --- whole-sample packing (SFT) ------------------------------------------------------------------------
def first_target(doc: EncodedDoc) -> int:
    """Index of the document's first loss token (its prompt length); len(doc) when it has none."""
    hits = np.flatnonzero(doc.mask)
    return int(hits[0]) if hits.size else len(doc.ids)


def fit(doc: EncodedDoc, seq_len: int) -> str:
    """The packing policy for one sample and window length: "whole" when the sample fits (len <= seq_len);
    else "truncated" when its prompt ends inside the window (the answer's tail is cut, loss on the kept
    answer tokens); else "dropped" (a window of prompt only teaches nothing)."""
    return fit_len(len(doc.ids), first_target(doc), seq_len)


def fit_len(length: int, first: int, seq_len: int) -> str:
    """:func:`fit` from a sample's length and first loss-token position (what a token store's index holds)."""
    if length <= seq_len:
        return "whole"
    return "truncated" if first <= seq_len else "dropped"


def policy_counts(docs: Sequence[EncodedDoc], seq_len: int) -> dict[str, int]:
    """How many samples :func:`fit` keeps whole, truncates and drops at ``seq_len``."""
    out = {"whole": 0, "truncated": 0, "dropped": 0}
    for d in docs:
        out[fit(d, seq_len)] += 1
    return out


def pack_samples(docs: Sequence[EncodedDoc], seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """One window of ``seq_len`` tokens holding ``docs`` whole (their lengths must sum to <= seq_len), or one
    truncated sample (a single doc longer than seq_len); padding is a context-only fragment of ``pad_id``."""
    used = sum(len(d.ids) for d in docs)
    if len(docs) == 1 and used > seq_len:
        return window(concat(docs, [0]), 0, seq_len)
    if used > seq_len:
        raise ValueError(f"samples of {used} tokens do not fit a window of {seq_len}")
    pad = EncodedDoc(np.full(seq_len - used + 1, pad_id, np.int64), np.zeros(seq_len - used + 1, np.int8))
    return window(concat([*docs, pad], range(len(docs) + 1)), 0, seq_len)
