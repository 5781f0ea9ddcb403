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
  local; :meth:`GatheredKeys.whole` all-gathers, in one differentiable collective per layer, the per-token
  entries the keys are made of, and puts them in sequence order: the shared key/value entry (head_dim values,
  normed and rotated at its position), and on a compressed layer the compressor's key and gate features (hca:
  head_dim each; csa: 2 x head_dim each, the overlapping windows' two halves) and on csa the indexer's (2 x
  csa_indexer_dim each): per token 1, 3 or 5 head_dim + 4 csa_indexer_dim values (V4-Flash in bf16: 1, 3 and
  6 KiB), plus the positions and document ids once per forward (16 bytes). Every rank then pools the compressed
  entries of the whole sequences exactly as one process does (windows cut by a chunk boundary and the
  overlapping CSA windows included), the sliding window and the entries' visibility follow each local query's
  global index, position and document, and the indexer's top-k runs over every visible entry of the sequence.
  The indexer loss averages over the whole sequences' query rows (their count summed over cp), so the ranks'
  losses sum to one process's. The gathered entries at full sequence are a per-layer transient (kept for the
  backward without recompute; trex.trainer.plan.v4_context_bytes counts them);
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

from typing import TYPE_CHECKING, Any

import torch

from trex.trainer.model.context import SequenceKeys
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


class GatheredKeys(SequenceKeys):
    """The keys of a cp rank's queries: every rank's chunks of the same sequences, in rank order."""

    def __init__(self, group: Any, cp: int, rank: int) -> None:
        self.group = group
        self.cp = cp
        self.rank = rank
        self.gather = self.all_gather

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """All-gather [B, T/cp, C] over cp to [B, T, C] (rank 0's chunks first); the backward sums each key's
        gradient over the ranks whose queries read it and returns it to its owner (reduce-scatter)."""
        from torch.distributed._functional_collectives import all_gather_single_autograd

        out: torch.Tensor = all_gather_single_autograd(t.contiguous(), gather_dim=1, group=self.group)
        return out

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

    def whole(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """DeepSeek-V4 attention's per-token entries [B, t, ...] of this rank's chunks -> [B, cp t, ...] of the
        whole sequences in sequence order. The floating ones (the layer's shared key/value entries and its
        compressor's and indexer's key/gate features) travel in one differentiable all-gather (backward:
        reduce-scatter to their owners); the others (positions, document ids) in a plain one."""
        out: list[torch.Tensor | None] = [None] * len(tensors)
        for floating in (True, False):
            picked = [i for i, t in enumerate(tensors) if t.is_floating_point() == floating]
            if not picked:
                continue
            flat = [tensors[i].reshape(*tensors[i].shape[:2], -1) for i in picked]
            widths = [f.shape[-1] for f in flat]
            both = torch.cat(flat, dim=-1)
            if floating:
                gathered = self.all_gather(both)
            else:
                import torch.distributed as dist

                parts = [torch.empty_like(both) for _ in range(self.cp)]
                dist.all_gather(parts, both.contiguous(), group=self.group)
                gathered = torch.cat(parts, dim=1)
            gathered = gathered.index_select(1, self.order(gathered.shape[1], gathered.device))
            for i, part in zip(picked, torch.split(gathered, widths, dim=-1), strict=True):
                out[i] = part.reshape(part.shape[0], part.shape[1], *tensors[i].shape[2:]).to(tensors[i].dtype)
        return [t for t in out if t is not None]

    def order(self, seq: int, device: torch.device) -> torch.Tensor:
        """Where each global token index [seq] sits in a gather of every rank's chunks (rank 0's first)."""
        held = torch.cat([chunk_indices(seq, self.cp, r) for r in range(self.cp)])
        return held.argsort().to(device)

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
