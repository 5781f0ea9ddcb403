"""Expert parallelism (EP) and expert-tensor parallelism (ETP): dropless token dispatch and its exact inverse.

Dispatch: every rank exchanges its per-expert row counts over the ep group first, then the rows themselves
with one uneven all_to_all_single; the receiver holds rows in (source rank, local expert) order. With
etp > 1 each expert's hidden dimension is split over the etp ranks: the received rows are all-gathered
inside the etp group (an uneven all-to-all that sends the same rows to every peer), every etp rank runs
its slice of every local expert (gate/up column-parallel, down row-parallel), and the partial outputs are
reduce-scattered back to the rank that gathered them (an all-to-all plus a sum). Rows are permuted to
expert-major order for the grouped GEMM and back. The combine retraces the same collectives in reverse.
Every collective is the autograd variant of torch's functional collectives, so the backward pass is the
mirror image. A rank or expert with no rows sends and receives empty splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trex.trainer.model.moe import Compute


def expert_major(counts: torch.Tensor) -> torch.Tensor:
    """Row permutation that turns rows stored in (group g, expert e) blocks, g-major, into e-major order.

    counts: [G, E] rows per block. Returns index [sum(counts)] with result = rows[index]."""
    g, e = counts.shape
    flat = counts.reshape(-1)
    starts = (flat.cumsum(0) - flat).view(g, e)
    lens_t = counts.t().reshape(-1)
    starts_t = starts.t().reshape(-1)
    total = int(flat.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.long, device=counts.device)
    out_starts = lens_t.cumsum(0) - lens_t
    shift = torch.repeat_interleave(starts_t - out_starts, lens_t)
    return torch.arange(total, device=counts.device) + shift


def _a2a(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
    import torch.distributed._functional_collectives as fc

    y = fc.all_to_all_single_autograd(x.contiguous(), out_splits, in_splits, group)
    out: torch.Tensor = fc.wait_tensor(y)  # type: ignore[no-untyped-call]
    return out


def _a2a_counts(counts: torch.Tensor, size: int, group: Any) -> torch.Tensor:
    """counts [size, k] (row r for peer r) -> [size, k] (row r from peer r); no autograd."""
    import torch.distributed as dist

    out = torch.empty_like(counts)
    dist.all_to_all_single(out, counts.contiguous(), group=group)
    return out


def _all_gather_counts(counts: torch.Tensor, size: int, group: Any) -> torch.Tensor:
    import torch.distributed as dist

    out = counts.new_empty((size * counts.shape[0], *counts.shape[1:]))
    dist.all_gather_into_tensor(out, counts.contiguous(), group=group)
    return out.view(size, *counts.shape)


@dataclass
class ExpertDispatch:
    """The ``dispatch`` of a GroupedExperts whose experts are split over ``ep`` ranks (and their hidden
    dimension over ``etp`` ranks). Counts travel on the gloo/nccl/hccl groups as int64 tensors; the
    a2a_bytes counter adds up the bytes of rows this rank sends to other ranks in the forward pass
    (dispatch, etp gather, etp reduce-scatter and combine; the backward pass mirrors it)."""

    n_experts: int
    ep: int
    etp: int
    ep_group: Any
    etp_group: Any
    a2a_bytes: int = 0

    def __call__(self, xs: torch.Tensor, counts: torch.Tensor, compute: Compute) -> torch.Tensor:
        """xs [N, D] rows sorted by global expert, counts [E] -> expert outputs [N, D] in the same order."""
        n_local = self.n_experts // self.ep
        send = counts.view(self.ep, n_local)
        if self.ep > 1:
            recv = _a2a_counts(send, self.ep, self.ep_group)  # [source, local expert]
            in_splits = send.sum(1).tolist()
            out_splits = recv.sum(1).tolist()
            rows = _a2a(xs, out_splits, in_splits, self.ep_group)
            me = _rank(self.ep_group)
            self.a2a_bytes += (xs.shape[0] - in_splits[me] + sum(out_splits) - out_splits[me]) * self._row_bytes(xs)
        else:
            recv, rows = send, xs
        mine = rows.shape[0]
        if self.etp > 1:
            grid = _all_gather_counts(recv, self.etp, self.etp_group)  # [etp peer, source, local expert]
            peer_rows = grid.sum((1, 2)).tolist()
            rows = _a2a(rows.repeat(self.etp, 1), peer_rows, [mine] * self.etp, self.etp_group)
            blocks = grid.reshape(-1, n_local)
            me = _rank(self.etp_group)
            self.a2a_bytes += (mine * (self.etp - 1) + sum(peer_rows) - peer_rows[me]) * self._row_bytes(xs)
        else:
            blocks = recv
        perm = expert_major(blocks)
        y_sorted = compute(rows[perm], blocks.sum(0))
        y = torch.empty_like(y_sorted).index_copy(0, perm, y_sorted) if perm.numel() else y_sorted
        if self.etp > 1:
            y = _a2a(y, [mine] * self.etp, peer_rows, self.etp_group).view(self.etp, mine, -1).sum(0)
        if self.ep > 1:
            y = _a2a(y, in_splits, out_splits, self.ep_group)
        return y

    @staticmethod
    def _row_bytes(xs: torch.Tensor) -> int:
        return int(xs.shape[1]) * xs.element_size()


def _rank(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_rank(group)
