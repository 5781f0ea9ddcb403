"""The tensor-parallel placement table: which parameters tp splits and how, read both by the parallel layer
(trex.trainer.parallel.parallelize, which applies it) and by the memory plan (trex.trainer.plan, which
counts a rank's bytes from it). Pure data, no torch, so the plan stays light.

Keys are the model's module classes (by name); each maps a child module (every parameter of it) or a
parameter path relative to the module to a style:

* ``colwise``: torch's ColwiseParallel (weight split on its output dim, dim 0);
* ``rowwise``: torch's RowwiseParallel (weight split on its input dim);
* ``shard0``: the parameter itself distributed as Shard(0) over tp (V4's output groups and per-head sinks,
  which the attention reads through ``local_tensor``).

Parameters no entry names stay replicated over tp. Entries naming a child a module lacks (MLA's q_proj when
it has a query latent) are skipped.
"""

from __future__ import annotations

from typing import Literal

TPStyle = Literal["colwise", "rowwise", "shard0"]

TP_TABLE: dict[str, dict[str, TPStyle]] = {
    # MLA: query heads (q_proj, or q_b_proj after the query latent) and kv_b_proj split by head, o_proj
    # row-parallel; the latent projections and norms replicated.
    "MLAttention": {"q_proj": "colwise", "q_b_proj": "colwise", "kv_b_proj": "colwise", "o_proj": "rowwise"},
    # DeepSeek-V4: query heads, their sinks and output groups split; the shared key/value head, compressor and
    # indexer replicated.
    "V4Attention": {"q_b_proj": "colwise", "o_b_proj": "rowwise", "o_a_proj.weight": "shard0", "sinks": "shard0"},
    # dense FFN: gate/up on the hidden dim, down row-parallel.
    "MLP": {"gate_proj": "colwise", "up_proj": "colwise", "down_proj": "rowwise"},
}


def tp_style(module_class: str, rel: str) -> TPStyle | None:
    """How tp splits the parameter at path ``rel`` (e.g. ``o_proj.weight``, ``sinks``) inside a module of class
    ``module_class``: the entry naming the parameter itself, else the one naming its child module; None =
    replicated over tp."""
    rules = TP_TABLE.get(module_class, {})
    if rel in rules:
        return rules[rel]
    return rules.get(rel.split(".", 1)[0]) if "." in rel else None
