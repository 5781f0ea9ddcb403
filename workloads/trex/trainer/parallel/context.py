"""Context parallelism: each sequence of a micro-batch split over the cp ranks, attention keys gathered over them.

The split is load-balanced for causal attention: a sequence of T tokens is cut into 2 cp chunks and cp rank r
holds chunks r and 2cp-1-r (a head and a tail chunk), so every rank's queries see about the same number of keys.
Positions (RoPE) and packed-document ids are cut from the whole sequence, so they stay exact across chunk
boundaries. The model knows nothing of this: its attention calls its ``keys`` object (trex.trainer.model.context
.SequenceKeys, the identity in one process), which :func:`apply_context_parallel` replaces with
:class:`GatheredKeys`:

- MLA: the queries stay local; the compressed key latent (kv_lora_rank + rope values per token, after its
  norm and rotation) is all-gathered over cp with a differentiable collective (its backward reduce-scatters
  the keys' gradients back to the ranks that own them); the mask is causal and per document over the global
  token indices;
- DeepSeek-V4 (sliding / csa / hca, trex.trainer.model.v4attention): the queries and the indexer's queries stay
  local and nothing per token of the whole sequences travels. :meth:`GatheredKeys.extend` is a halo exchange (one
  differentiable all-to-all per layer, its backward returning the gradients to the owners): each of a rank's
  chunks receives the tokens before it that it needs and another rank holds: the csa_window - 1 tokens of the
  sliding window (the shared key/value entry, head_dim values), and on a compressed layer the pooling's reach
  (csa: 2 csa_compress_every - 1, the overlapping windows; hca: hca_compress_every - 1) of the compressor's key
  and gate features (csa 4, hca 2 head_dim) and csa's indexer features (4 csa_indexer_dim); a halo longer than a
  chunk comes from several chunks back. The window mask is [t, t + halo] over global indices and documents.
  Each rank pools the complete windows whose last token it holds (a window cut by a chunk boundary, and the
  previous window a csa entry also pools, lie within the reach; a document's trailing partial window is never
  visible to a query and is dropped), then :class:`SharedEntries` sends every rank's entries (the compressor's
  head_dim and the indexer's csa_indexer_dim values) to every other rank in one differentiable uneven
  all-to-all and puts them in sequence order (the indexer's tie rule and top-k depend on it), rows padded with
  invisible entries; their places (row, last token, start position, document) travel once per forward and
  window size. Per layer a rank receives about B x (2 halo x its width + T / every x entry width) values instead
  of B x T (cp-1)/cp x (1, 3 or 5 head_dim + 4 csa_indexer_dim) (trex.trainer.plan.v4_exchange_bytes). The
  indexer's top-k runs over every visible entry of the sequence; its loss averages over the whole sequences'
  query rows (their count summed over cp), so the ranks' losses sum to one process's. What a layer keeps of
  this (halo, whole sequences' entries, masks over them) is trex.trainer.plan.v4_context_bytes. Positions are
  assumed to count up by one within a document (trex.trainer.model.layers.positions_from_docs), so a window's
  tokens are consecutive;
- MTP: a module's input is the token some places later in the whole sequence, which may lie in another
  rank's chunk: :meth:`GatheredKeys.shift` all-gathers the token ids (the objective makes the MTP targets on
  the whole sequences before the split, trex.trainer.data.objective);
- MoE sequence-balance loss: the per-sequence expert counts are summed over cp and each rank contributes its
  tokens' share of the score means, so the shares sum to the whole sequence's loss (and each router gets
  exactly its tokens' gradient).

The loss and token counts reduce over the dp x cp ranks (trex.trainer.parallel.mesh.Meshes.dp), the expert
counts over the world, as over data. What cp does not cover yet (the sampling modes grpo and opd) is refused by
trex.trainer.rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from trex.trainer.model.context import EntrySet, SequenceKeys
from trex.trainer.model.model import DeepSeekModel, blocks
from trex.trainer.model.moe import MoE

if TYPE_CHECKING:
    from trex.trainer.parallel.mesh import Meshes, ParallelDims


def chunk_indices(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """Global token indices [seq_len / cp] that cp rank ``rank`` holds: chunks ``rank`` and ``2cp-1-rank`` of
    ``2cp`` equal chunks (seq_len must be a multiple of 2 cp: trex.trainer.rules checks data.seqLen)."""
    if seq_len % (2 * cp):
        raise ValueError(f"sequence length {seq_len} is not a multiple of 2 x cp = {2 * cp}")
    size = seq_len // (2 * cp)
    head = torch.arange(rank * size, (rank + 1) * size)
    tail = torch.arange((2 * cp - 1 - rank) * size, (2 * cp - rank) * size)
    return torch.cat([head, tail])


def split_batch(batch: dict[str, torch.Tensor], cp: int, rank: int) -> dict[str, torch.Tensor]:
    """The [B, T] tensors of ``batch`` (tokens, labels, masks, positions, document ids of whole sequences)
    cut to the tokens cp rank ``rank`` holds. Positions and document ids come from the whole sequence, so they
    stay exact across chunk boundaries."""
    out: dict[str, torch.Tensor] = {}
    for k, v in batch.items():
        idx = chunk_indices(v.shape[1], cp, rank).to(v.device)
        out[k] = v.index_select(1, idx)
    return out


def owner(g: int, size: int, cp: int) -> tuple[int, int]:
    """(cp rank, place among that rank's tokens) of global token index ``g`` (chunks of ``size`` tokens)."""
    k = g // size
    if k < cp:
        return k, g - k * size
    return 2 * cp - 1 - k, size + g - k * size


@dataclass
class Halo:
    """What a cp rank sends and receives so that each of its chunks has the ``reach`` tokens before it (a halo
    exchange: only the tokens other ranks hold, several chunks back when reach exceeds a chunk)."""

    send: list[torch.Tensor]  # per rank: places among this rank's tokens of what that rank needs from it
    recv: list[int]  # per rank: how many tokens it sends here
    order: torch.Tensor  # [u]: the extended tokens' places in cat(own tokens, received from rank 0, 1, ...)
    index: torch.Tensor  # [u] their global indices, ascending
    held: torch.Tensor  # [u] held by this rank


def halo(seq: int, cp: int, rank: int, reach: int) -> Halo:
    """The halo exchange of cp rank ``rank`` for sequences of ``seq`` tokens: each chunk k's global tokens
    [k size - reach, k size) that the chunk's rank does not hold."""
    size = seq // (2 * cp)

    def needs(r: int) -> list[int]:
        held = set(chunk_indices(seq, cp, r).tolist())
        out = {g for k in (r, 2 * cp - 1 - r) for g in range(max(0, k * size - reach), k * size)}
        return sorted(out - held)

    send = [torch.tensor([owner(g, size, cp)[1] for g in needs(r) if owner(g, size, cp)[0] == rank] if r != rank
                         else [], dtype=torch.long) for r in range(cp)]
    mine = needs(rank)
    from_rank = [[g for g in mine if owner(g, size, cp)[0] == r] for r in range(cp)]
    placed = torch.cat([chunk_indices(seq, cp, rank), *(torch.tensor(f, dtype=torch.long) for f in from_rank)])
    order = placed.argsort()
    return Halo(send=send, recv=[len(f) for f in from_rank], order=order, index=placed[order],
                held=order < 2 * size)


class SharedEntries(EntrySet):
    """The compressed entries of the whole sequences on a cp rank: each rank forms the entries of the windows
    whose last token it holds, and every rank gets every entry in sequence order (rows padded to the longest).
    Every rank holds them all because a query may see any earlier complete window of its document (the indexer
    chooses among all of them): T / every entries per sequence, not T per-token values."""

    def __init__(self, keys: GatheredKeys, owned: torch.Tensor, last: torch.Tensor, start: torch.Tensor,
                 doc: torch.Tensor) -> None:
        import torch.distributed as dist

        b, dev = owned.shape[0], owned.device
        self.keys, self.owned = keys, owned
        meta = torch.stack([owned.nonzero()[:, 0], last[owned], start[owned], doc[owned]], dim=1)
        counts = [torch.zeros(1, dtype=torch.long, device=dev) for _ in range(keys.cp)]
        dist.all_gather(counts, torch.tensor([meta.shape[0]], dtype=torch.long, device=dev), group=keys.group)
        self.counts = [int(c) for c in counts]
        every = self.everyone(meta, plain=True)
        row, where = every[:, 0], every[:, 1]
        order = (row * (int(where.max()) + 1 if where.numel() else 1) + where).argsort()
        per_row = torch.bincount(row, minlength=b)
        self.width = max(int(per_row.max()), 1)
        first = per_row.cumsum(0) - per_row
        self.dest = torch.empty_like(order)
        self.dest[order] = row[order] * self.width + torch.arange(order.numel(), device=dev) - first[row[order]]
        super().__init__(
            start.new_zeros(b * self.width).index_copy(0, self.dest, every[:, 2]).view(b, self.width),
            doc.new_full((b * self.width,), -1).index_copy(0, self.dest, every[:, 3]).view(b, self.width))

    def everyone(self, rows: torch.Tensor, plain: bool = False) -> torch.Tensor:
        """This rank's rows [n, C] -> every rank's [N, C], rank 0's first: sent to each other rank once (an
        uneven all-gather; ``plain``: no gradient, else the backward returns each row's gradient to its owner)."""
        keys, n = self.keys, rows.shape[0]
        flat = rows.reshape(-1)
        width = rows.shape[1]
        ins = [0 if r == keys.rank else n * width for r in range(keys.cp)]
        outs = [0 if r == keys.rank else self.counts[r] * width for r in range(keys.cp)]
        send = flat.repeat(keys.cp - 1)
        got = keys.plain_exchange(send, outs, ins) if plain else keys.exchange(send, outs, ins)
        parts = list(torch.split(got, outs))
        parts[keys.rank] = flat
        return torch.cat(parts).view(-1, width)

    def share(self, entries: list[torch.Tensor]) -> list[torch.Tensor]:
        """Entries [B, n, C] of this rank's windows -> [B, S, C] of the whole sequences': the owned ones of every
        rank, in sequence order, in one differentiable exchange (zeros in the padding)."""
        widths = [e.shape[-1] for e in entries]
        own = torch.cat([e[self.owned] for e in entries], dim=-1)
        every = self.everyone(own)
        b = self.owned.shape[0]
        placed = every.new_zeros(b * self.width, every.shape[1]).index_copy(0, self.dest, every)
        out = placed.view(b, self.width, -1)
        return [p.to(e.dtype) for p, e in zip(torch.split(out, widths, dim=-1), entries, strict=True)]


class GatheredKeys(SequenceKeys):
    """The keys of a cp rank's queries: every rank's chunks of the same sequences, in rank order (MLA), or this
    rank's chunks with the window's halo and the whole sequences' compressed entries (DeepSeek-V4)."""

    def __init__(self, group: Any, cp: int, rank: int) -> None:
        self.group = group
        self.cp = cp
        self.rank = rank
        self.gather = self.all_gather
        self.halos: dict[tuple[int, int], Halo] = {}

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """All-gather [B, T/cp, C] over cp to [B, T, C] (rank 0's chunks first); the backward sums each key's
        gradient over the ranks whose queries read it and returns it to its owner (reduce-scatter)."""
        from torch.distributed._functional_collectives import all_gather_single_autograd

        out: torch.Tensor = all_gather_single_autograd(t.contiguous(), gather_dim=1, group=self.group)
        return out

    def exchange(self, flat: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
        """The differentiable all-to-all of V4 attention's keys (1-D buffers, splits per rank in elements): its
        backward returns each received value's gradient to the rank that sent it. Every floating value a V4
        layer exchanges goes through here."""
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        out: torch.Tensor = all_to_all_single_autograd(flat.contiguous(), out_splits, in_splits, self.group)
        return out

    def plain_exchange(self, flat: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
        """The all-to-all of what carries no gradient (positions, documents, entry places; once per forward)."""
        import torch.distributed as dist

        out = flat.new_empty(sum(out_splits))
        dist.all_to_all_single(out, flat.contiguous(), output_split_sizes=out_splits, input_split_sizes=in_splits,
                               group=self.group)
        return out

    def halo(self, t: int, reach: int) -> Halo:
        """The (cached) halo exchange for this rank's t tokens per sequence."""
        key = (t, reach)
        if key not in self.halos:
            self.halos[key] = halo(t * self.cp, self.cp, self.rank, reach)
        return self.halos[key]

    def extend(self, tensors: list[torch.Tensor], reaches: list[int]) -> list[torch.Tensor]:
        """This rank's per-token tensors [B, t, ...] -> [B, u, ...]: its tokens and each chunk's ``reach`` tokens
        before it that other ranks hold, in sequence order, in one all-to-all (a halo exchange: only those
        tokens travel; floating tensors differentiably, their gradients returned to the owners)."""
        b, t = tensors[0].shape[:2]
        flat = [x.reshape(b, t, -1) for x in tensors]
        plans = [self.halo(t, r) for r in reaches]
        floating = tensors[0].is_floating_point()
        dtype = flat[0].dtype
        for f in flat[1:]:
            dtype = torch.promote_types(dtype, f.dtype)
        send = torch.cat([f[:, plan.send[r].to(f.device)].reshape(-1).to(dtype)
                          for r in range(self.cp) for f, plan in zip(flat, plans, strict=True)])
        ins = [sum(b * plan.send[r].numel() * f.shape[-1] for f, plan in zip(flat, plans, strict=True))
               for r in range(self.cp)]
        outs = [sum(b * plan.recv[r] * f.shape[-1] for f, plan in zip(flat, plans, strict=True))
                for r in range(self.cp)]
        got = (self.exchange if floating else self.plain_exchange)(send, outs, ins)
        received: list[list[torch.Tensor]] = [[] for _ in flat]
        for r, part in enumerate(torch.split(got, outs)):
            sizes = [b * plan.recv[r] * f.shape[-1] for f, plan in zip(flat, plans, strict=True)]
            for i, piece in enumerate(torch.split(part, sizes)):
                received[i].append(piece.view(b, plans[i].recv[r], flat[i].shape[-1]))
        out = []
        for x, f, plan, got_i in zip(tensors, flat, plans, received, strict=True):
            whole = torch.cat([f.to(dtype), *got_i], dim=1).index_select(1, plan.order.to(f.device))
            out.append(whole.reshape(b, whole.shape[1], *x.shape[2:]).to(x.dtype))
        return out

    def extended_indices(self, t: int, reach: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self.halo(t, reach)
        return plan.index.to(device), plan.held.to(device)

    def place(self, owned: torch.Tensor, last: torch.Tensor, start: torch.Tensor, doc: torch.Tensor) -> EntrySet:
        return SharedEntries(self, owned, last, start, doc)

    def mask(self, doc_ids: torch.Tensor | None, b: int, t: int, device: torch.device) -> torch.Tensor:
        """Boolean [B, 1, t, cp t]: a gathered key is visible to a local query iff its global index is not
        later and it lies in the same document."""
        import torch.distributed as dist

        seq = t * self.cp
        q_idx = chunk_indices(seq, self.cp, self.rank).to(device)
        k_idx = torch.cat([chunk_indices(seq, self.cp, r) for r in range(self.cp)]).to(device)
        mask = (k_idx[None, :] <= q_idx[:, None]).expand(b, t, seq)
        if doc_ids is not None:
            parts = [torch.empty_like(doc_ids) for _ in range(self.cp)]
            dist.all_gather(parts, doc_ids.contiguous(), group=self.group)
            all_docs = torch.cat(parts, dim=1)
            mask = mask & (doc_ids[:, :, None] == all_docs[:, None, :])
        return mask[:, None]

    def indices(self, t: int, device: torch.device) -> torch.Tensor:
        """The global indices [t] of this rank's tokens (its head and tail chunks)."""
        return chunk_indices(t * self.cp, self.cp, self.rank).to(device)

    def total(self, x: torch.Tensor) -> torch.Tensor:
        """A count (no gradient) summed over the cp ranks."""
        import torch.distributed as dist

        x = x.detach().clone()
        dist.all_reduce(x, group=self.group)
        return x

    def shift(self, ids: torch.Tensor, s: int) -> torch.Tensor:
        """The token ``s`` places later in each whole sequence at this rank's positions (0 past the end): the
        token ids [B, t] are all-gathered over cp (ids only, no gradient) and put back in sequence order."""
        import torch.distributed as dist

        b, t = ids.shape
        seq = t * self.cp
        parts = [torch.empty_like(ids) for _ in range(self.cp)]
        dist.all_gather(parts, ids.contiguous(), group=self.group)
        whole = torch.empty(b, seq, dtype=ids.dtype, device=ids.device)
        whole[:, torch.cat([chunk_indices(seq, self.cp, r) for r in range(self.cp)]).to(ids.device)] = \
            torch.cat(parts, dim=1)
        return super().shift(whole, s)[:, chunk_indices(seq, self.cp, self.rank).to(ids.device)]


def balance_share(group: Any, cp: int) -> Any:
    """The MoE sequence-balance loss of a cp rank: sum_i f_i P_i with f_i from the whole sequence's expert
    counts (summed over cp) and this rank's tokens' part of P_i; the cp ranks' shares sum to the loss of
    trex.trainer.model.moe.sequence_balance_loss on the whole sequences."""
    import torch.distributed as dist

    def loss(scores: torch.Tensor, indices: torch.Tensor, n_experts: int) -> torch.Tensor:
        b, t, k = indices.shape
        seq = t * cp
        counts = torch.zeros(b, n_experts, device=scores.device, dtype=scores.dtype)
        counts.scatter_add_(1, indices.reshape(b, t * k),
                            torch.ones(b, t * k, device=scores.device, dtype=scores.dtype))
        dist.all_reduce(counts, group=group)  # routing counts carry no gradient
        f = counts * (n_experts / (k * seq))
        p = (scores / scores.sum(-1, keepdim=True)).sum(1) / seq
        return (f * p).sum(-1).mean()

    return loss


def install(model: DeepSeekModel, group: Any, cp: int, rank: int) -> None:
    """Make ``model`` cp rank ``rank`` of ``group``: its key gathering, and its balance-loss share on every MoE
    layer (the trunk's and the MTP modules')."""
    model.keys = GatheredKeys(group, cp, rank)
    share = balance_share(group, cp)
    for block in blocks(model):
        if isinstance(block.mlp, MoE):
            block.mlp.balance_loss = share


def apply_context_parallel(model: DeepSeekModel, dims: ParallelDims, meshes: Meshes) -> None:
    """Install this rank's place in its cp group (the dense view's cp dimension) on ``model``."""
    cp_mesh = meshes.dense["cp"]
    install(model, cp_mesh.get_group(), dims.cp, cp_mesh.get_local_rank())
