"""KV caches for incremental decoding, one state per attention layer, outside the model and its parallel code.

The model hands every attention call to the cache (``DeepSeekModel.forward(..., cache=...)``). A layer's
first call is the prefill of an empty cache: it runs the layer's own full forward (so prefill logits are
exactly the training forward's) and keeps what later tokens need. Every later call decodes one token
per row, rows at their own lengths:

* mla: the compressed latent and the rotated shared rope key per token (never the per-head keys and
  values); queries are absorbed into the latent space (q_nope W_uk), outputs leave it through W_uv.
* sliding (every V4 layer): a ring of the last ``csa_window`` rotated key/values.
* hca / csa: the completed compressed entries plus a ring of the raw projections (kv_proj, gate +
  position bias) of the tokens still to pool: one window (hca) or two (csa pools the previous window's
  first half-features with the current window's second half). An entry is pooled, normalised and
  rotated the step its window's last token arrives, when it becomes visible.
* csa's indexer: its own compressed keys, kept the same way, scored against each new query.

mHC and the FFNs are per token and need no state; MTP modules are not run while decoding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trex.trainer.model.attention import MLAttention
from trex.trainer.model.context import AttnContext
from trex.trainer.model.layers import apply_rope, apply_rope_tail, local_tensor, rope_cos_sin, upcast
from trex.trainer.model.v4attention import Indexer, Pool, V4Attention, top_k_visible, windows


@dataclass
class MLAState:
    """mla: latent [B, C, kv_lora_rank] and rotated rope key [B, C, rope] per cached token."""

    latent: torch.Tensor
    k_rope: torch.Tensor


@dataclass
class PoolState:
    """One Pool's compression state: raw kv / gate of the recent tokens in a ring [B, R, width] (slot =
    position mod R) and the completed entries [B, E, dim] (entry w = window w)."""

    kv: torch.Tensor
    gate: torch.Tensor
    entries: torch.Tensor


@dataclass
class V4State:
    """A V4 layer: ring of the last `window` rotated key/values [B, W, D] with their positions [B, W]
    (-1: empty), and the compressor / indexer states (None for a sliding layer / outside csa)."""

    kv: torch.Tensor
    kv_pos: torch.Tensor
    compressor: PoolState | None
    indexer: PoolState | None


def _combine(states: list[Any], fn: Callable[[list[torch.Tensor]], torch.Tensor]) -> Any:
    """One state from same-shaped (nested) states: fn over each tensor field's values, batch first."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(states[0]):
        parts = [getattr(s, f.name) for s in states]
        if parts[0] is None:
            values[f.name] = None
        elif dataclasses.is_dataclass(parts[0]):
            values[f.name] = _combine(parts, fn)
        else:
            values[f.name] = fn(parts)
    return type(states[0])(**values)


class DecodeCache:
    """Per-layer decoding state of B rows, each with its own length (tokens cached so far), for at
    most ``capacity`` tokens per row. Build with :meth:`empty`, fill by one prefill forward, then one
    token per row per forward; :meth:`select` and :meth:`cat` regroup rows between forwards."""

    def __init__(self, batch: int, capacity: int, device: torch.device) -> None:
        self.capacity = capacity
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.states: dict[nn.Module, Any] = {}
        self._span = 0

    @classmethod
    def empty(cls, batch: int, capacity: int, device: torch.device | str = "cpu") -> DecodeCache:
        """A cache with no tokens yet (its first forward is the prefill)."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        return cls(batch, capacity, torch.device(device))

    @property
    def batch(self) -> int:
        """Rows in the cache."""
        return int(self.lengths.shape[0])

    # --- the model-facing protocol (trex.trainer.model.attention.AttentionCache) -------------
    def positions(self, t: int) -> torch.Tensor:
        """Positions [B, t] of the next t tokens; t > 1 only into an empty cache (the prefill)."""
        if t > 1 and self.states:
            raise ValueError(f"a forward into a filled cache decodes one token per row, got {t}")
        top = int(self.lengths.max()) + t
        if top > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} tokens per row; this forward needs {top}")
        self._span = top
        return self.lengths[:, None] + torch.arange(t, device=self.lengths.device)

    def advance(self, t: int) -> None:
        """Every layer has cached the t new tokens."""
        self.lengths = self.lengths + t

    def attend(self, module: nn.Module, x: torch.Tensor, ctx: AttnContext) -> tuple[torch.Tensor, torch.Tensor]:
        """One attention layer's output for the new tokens, reading and extending its state."""
        zero = upcast(x.new_zeros(()))
        if module not in self.states:
            out, _ = module(x, dataclasses.replace(ctx, cache=None))
            self.states[module] = self._prefill(module, x, ctx)
            return out, zero
        if x.shape[1] != 1:
            raise ValueError("decode steps take one token per row")
        if isinstance(module, MLAttention):
            return self._mla_step(module, self.states[module], x, ctx), zero
        assert isinstance(module, V4Attention)
        return self._v4_step(module, self.states[module], x, ctx), zero

    # --- regrouping rows --------------------------------------------------------------------
    def select(self, rows: torch.Tensor) -> DecodeCache:
        """A cache of the given rows (indices may repeat: G samples sharing one prefilled prompt)."""
        out = DecodeCache(len(rows), self.capacity, self.lengths.device)
        out.lengths = self.lengths[rows]
        out.states = {m: _combine([s], lambda t: t[0][rows]) for m, s in self.states.items()}
        return out

    @staticmethod
    def cat(caches: list[DecodeCache]) -> DecodeCache:
        """Rows of several caches (same model, same capacity) in one cache."""
        if len({c.capacity for c in caches}) != 1 or len({frozenset(c.states) for c in caches}) != 1:
            raise ValueError("caches to concatenate need the same capacity and the same layers")
        out = DecodeCache(sum(c.batch for c in caches), caches[0].capacity, caches[0].lengths.device)
        out.lengths = torch.cat([c.lengths for c in caches])
        out.states = {m: _combine([c.states[m] for c in caches], torch.cat) for m in caches[0].states}
        return out

    # --- prefill ----------------------------------------------------------------------------
    def _zeros(self, like: torch.Tensor, *shape: int) -> torch.Tensor:
        return like.new_zeros((like.shape[0], *shape))

    def _store(self, buf: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        buf[:, : values.shape[1]] = values
        return buf

    def _prefill(self, module: nn.Module, x: torch.Tensor, ctx: AttnContext) -> Any:
        if isinstance(module, MLAttention):
            c, k_rope = module.latent(x)
            k_rope = apply_rope(k_rope, ctx.cos, ctx.sin, module.interleave)
            return MLAState(latent=self._store(self._zeros(c, self.capacity, c.shape[-1]), c),
                            k_rope=self._store(self._zeros(k_rope, self.capacity, k_rope.shape[-1]), k_rope))
        assert isinstance(module, V4Attention)
        _, _, kv = module.project(x, ctx)
        w = module.window
        pos = ctx.position_ids
        keep = min(w, x.shape[1])
        ring = self._zeros(kv, w, kv.shape[-1])
        ring_pos = torch.full((x.shape[0], w), -1, dtype=torch.long, device=x.device)
        tail = pos[:, -keep:]
        ring.scatter_(1, (tail % w)[..., None].expand(-1, -1, kv.shape[-1]), kv[:, -keep:])
        ring_pos.scatter_(1, tail % w, tail)
        comp = module.compressor
        return V4State(kv=ring, kv_pos=ring_pos,
                       compressor=None if comp is None else self._pool_prefill(comp, x, ctx),
                       indexer=None if comp is None or comp.indexer is None
                       else self._pool_prefill(comp.indexer, x, ctx))

    def _pool_prefill(self, pool: Pool, x: torch.Tensor, ctx: AttnContext) -> PoolState:
        """The completed entries (the model's own pooling) and the raw projections of the recent tokens."""
        b, t, _ = x.shape
        doc = torch.zeros((b, t), dtype=torch.long, device=x.device)
        entries = pool.pool(x, ctx, windows(ctx.position_ids, doc, pool.every), doc)[:, : t // pool.every]
        ring = pool.every * (2 if pool.overlap else 1)
        kv, gate = self._pool_inputs(pool, x, ctx.position_ids)
        keep = min(ring, t)
        slots = (ctx.position_ids[:, -keep:] % ring)[..., None].expand(-1, -1, kv.shape[-1])
        return PoolState(
            kv=self._zeros(kv, ring, kv.shape[-1]).scatter_(1, slots, kv[:, -keep:]),
            gate=self._zeros(gate, ring, gate.shape[-1]).scatter_(1, slots, gate[:, -keep:]),
            entries=self._store(self._zeros(entries, self.capacity // pool.every, pool.dim), entries),
        )

    @staticmethod
    def _pool_inputs(pool: Pool, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw kv and gate (+ position bias) of the tokens x at positions pos: [B, T, width] each."""
        return pool.kv_proj(x), pool.gate_proj(x) + pool.position_bias[pos % pool.every]

    # --- decode steps -----------------------------------------------------------------------
    def _mla_step(self, m: MLAttention, st: MLAState, x: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        b = x.shape[0]
        rows = torch.arange(b, device=x.device)
        pos = ctx.position_ids[:, 0]
        q = m.query(x, ctx)
        c, k_rope = m.latent(x)
        st.latent[rows, pos] = c[:, 0]
        st.k_rope[rows, pos] = apply_rope(k_rope, ctx.cos, ctx.sin, m.interleave)[:, 0]
        span = self._span
        latent, keys = st.latent[:, :span], st.k_rope[:, :span]
        w = local_tensor(m.kv_b_proj.weight).view(-1, m.nope + m.v_dim, m.kv_lora_rank)
        w_k, w_v = w[:, : m.nope], w[:, m.nope:]
        q_nope, q_rope = torch.split(q, [m.nope, m.rope], dim=-1)
        q_lat = torch.einsum("bthn,hnr->bthr", q_nope, w_k)
        logits = (torch.einsum("bthr,bsr->bhts", q_lat, latent)
                  + torch.einsum("bthe,bse->bhts", q_rope, keys)) * m.scale
        visible = torch.arange(span, device=x.device)[None, :] <= pos[:, None]
        probs = torch.softmax(upcast(logits.masked_fill(~visible[:, None, None, :], float("-inf"))), dim=-1)
        o_lat = torch.einsum("bhts,bsr->bthr", probs.to(latent.dtype), latent)
        o = torch.einsum("bthr,hvr->bthv", o_lat, w_v)
        out: torch.Tensor = m.o_proj(o.reshape(b, 1, -1))
        return out

    def _v4_step(self, m: V4Attention, st: V4State, x: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        b = x.shape[0]
        rows = torch.arange(b, device=x.device)
        pos = ctx.position_ids[:, 0]
        q_res, q, kv = m.project(x, ctx)
        slot = pos % m.window
        st.kv[rows, slot] = kv[:, 0]
        st.kv_pos[rows, slot] = pos
        keys = st.kv
        mask = (st.kv_pos >= 0) & (st.kv_pos > (pos - m.window)[:, None])
        comp = m.compressor
        if comp is not None and st.compressor is not None:
            entries = self._pool_step(comp, st.compressor, x, pos)
            visible = torch.arange(entries.shape[1], device=x.device)[None, :] < ((pos + 1) // comp.every)[:, None]
            if comp.indexer is not None and st.indexer is not None:
                visible = self._select(comp.indexer, st.indexer, x, q_res, pos, visible, ctx)
            keys = torch.cat([keys, entries], dim=1)
            mask = torch.cat([mask, visible], dim=-1)
        return m.attend(q, keys, mask[:, None, None, :], ctx)

    def _select(self, ind: Indexer, st: PoolState, x: torch.Tensor, q_res: torch.Tensor, pos: torch.Tensor,
                visible: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """The indexer's top-k of the visible entries for the new query: [B, S]."""
        keys = self._pool_step(ind, st, x, pos)
        scores = ind.score_keys(x, q_res, ctx, keys)[:, 0]
        return top_k_visible(scores.masked_fill(~visible, -1e30)[:, None], visible[:, None], ind.top_k)[:, 0]

    def _pool_step(self, pool: Pool, st: PoolState, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Take one token per row into the ring; pool the window it completes. Returns the entries
        [B, E', dim] a query at pos may see (E' covers the longest row)."""
        b = x.shape[0]
        rows = torch.arange(b, device=x.device)
        kv, gate = self._pool_inputs(pool, x, pos[:, None])
        ring = st.kv.shape[1]
        st.kv[rows, pos % ring] = kv[:, 0]
        st.gate[rows, pos % ring] = gate[:, 0]
        every = pool.every
        done = pos % every == every - 1
        if bool(done.any()):
            window = pos // every
            entry = self._pool_window(pool, st, window)
            st.entries[rows[done], window[done]] = entry[done]
        return st.entries[:, : self._span // every]

    @staticmethod
    def _pool_window(pool: Pool, st: PoolState, window: torch.Tensor) -> torch.Tensor:
        """Entry `window` [B] of every row from the ring: softmax(gate)-weighted kv per channel,
        normalised and rotated at the window's first position: [B, dim]."""
        every, d = pool.every, pool.dim
        b = window.shape[0]
        if pool.overlap:
            kv = st.kv.view(b, 2, every, 2 * d)
            gate = upcast(st.gate).view(b, 2, every, 2 * d)
            rows = torch.arange(b, device=window.device)
            cur, prev = window % 2, (window + 1) % 2
            prev_gate = gate[rows, prev][..., :d].masked_fill((window == 0)[:, None, None], float("-inf"))
            kv = torch.cat([kv[rows, prev][..., :d], kv[rows, cur][..., d:]], dim=1)
            g = torch.cat([prev_gate, gate[rows, cur][..., d:]], dim=1)
        else:
            kv, g = st.kv, upcast(st.gate)
        pooled = (kv * torch.softmax(g, dim=1).to(kv.dtype)).sum(dim=1)
        start = (window * every)[:, None]
        cos, sin = rope_cos_sin(start, pool.rope_dim, pool.theta, dtype=upcast(pooled).dtype)
        rotated: torch.Tensor = apply_rope_tail(pool.kv_norm(pooled[:, None]), cos, sin)[:, 0]
        return rotated

