"""Apply the parallel layout to a DeepSeekModel: tensor parallelism, expert (and expert-tensor) parallelism,
then FSDP2. The model code knows none of this; everything here is torch.distributed's own machinery
(parallelize_module, distribute_tensor, fully_shard, DTensor redistribution) plus the token dispatcher.

What runs where (see docs/ARCHITECTURE.md, "Parallel trainer"; which parameters tp splits is the table in
trex.trainer.parallel.placement, which the memory plan reads too):
- attention: query heads split over tp. MLA: q/kv_b column-parallel, o row-parallel, the latent
  projections and norms replicated. DeepSeek-V4: q_b column-parallel, sinks and output groups split
  (o_a rows, o_b row-parallel), the shared key/value head, compressor and indexer replicated. Tensors
  shared by every head (MLA's rotary key, V4's key/value entries) sum their gradients over tp; the
  indexer's head-mean target is averaged over tp;
- dense FFNs: gate/up column-parallel, down row-parallel;
- sequence parallelism: between those GEMMs each tp rank holds a contiguous 1/tp of the micro-batch's tokens
  (batch x sequence flattened): the residual stream (or mHC streams), its norms and mHC mappings, and the MoE
  layers (router, dispatch, routed and shared experts), so micro-batch 1 splits too and every rank of the world
  holds different tokens inside an MoE layer. The first trunk block (and every MTP block) cuts its input to the
  slice, the last trunk block (and every MTP block) all-gathers its output back, so the final norm, mHC head,
  output head, loss and MTP projections see the whole micro-batch as in one process. Attention and dense FFNs
  all-gather their normed input and reduce-scatter their row-parallel partial output to the slice. The norms'
  and mHC mappings' gradients are summed over tp (their param_hook); the sequence-balance loss sums each
  sequence's expert counts over the tp ranks its tokens lie on. Under cp the slices cut the rank's chunks;
- routed experts: split over ep (expert dim) and etp (hidden dim) as DTensors on the MoE view, dispatched by
  ExpertDispatch, then FSDP2 over edp;
- context parallelism (cp): each rank holds a head and a tail chunk of every sequence, mla gathers the key
  latents over cp (trex.trainer.parallel.context); cp counts as data for FSDP2 and expert routing;
- router and shared experts: FSDP2 over dp_shard x cp x tp; everything else FSDP2 over dp_shard x cp (HSDP
  with dp_replicate). Gradients are summed (the loop's loss weights already divide by the global token count).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from trex.trainer.model.attention import MLAttention
from trex.trainer.model.layers import MLP, ParamHook
from trex.trainer.model.model import Block, DeepSeekModel, blocks
from trex.trainer.model.moe import MoE
from trex.trainer.model.v4attention import V4Attention
from trex.trainer.parallel.context import apply_context_parallel
from trex.trainer.parallel.expert import ExpertDispatch
from trex.trainer.parallel.mesh import Meshes, ParallelDims
from trex.trainer.parallel.placement import TP_TABLE
from trex.trainer.parallel.recompute import apply_recompute


@dataclass
class Parallelized:
    """What the loop needs to know about the distributed model."""

    dispatchers: list[ExpertDispatch] = field(default_factory=list)
    """The token dispatcher of every MoE layer (their a2a_bytes count the all-to-all traffic)."""


def parallelize(model: DeepSeekModel, dims: ParallelDims, meshes: Meshes, *, param_dtype: torch.dtype,
                reshard_after_forward: bool = True, recompute: str = "none") -> Parallelized:
    """Distribute ``model`` in place (it must hold the same full weights on every rank): tensor and expert
    parallelism, context parallelism (trex.trainer.parallel.context), activation recompute
    (trex.trainer.parallel.recompute), then FSDP2."""
    info = Parallelized()
    if dims.cp > 1:
        apply_context_parallel(model, dims, meshes)
    if dims.tp > 1:
        apply_tensor_parallel(model, dims, meshes, info)
    if dims.ep * dims.etp > 1:
        apply_expert_parallel(model, dims, meshes, info)
    apply_recompute(model, recompute)
    apply_fsdp(model, dims, meshes, param_dtype, reshard_after_forward)
    return info


# --- tensor parallelism ------------------------------------------------------------------------------
def apply_tensor_parallel(model: DeepSeekModel, dims: ParallelDims, meshes: Meshes, info: Parallelized) -> None:
    """Heads of every attention and the hidden dim of every dense FFN over tp, with sequence parallelism around
    them: the residual stream, its norms and mHC mappings, and the MoE layers on this rank's token slice (under
    cp, a slice of the rank's chunks' tokens). The norms' and mHC mappings' gradients are partial sums over the
    slices: they are summed over tp explicitly (shared_over_tp as their ``param_hook``: one all-reduce of each
    such parameter's gradient per use in the backward), not by FSDP2 over dp_shard x cp x tp as the router's
    are, because the mHC mappings run through ``HyperConnection.mappings`` rather than ``forward`` (FSDP2 only
    gathers around forward) and because sharding them over tp would change the checkpoint, export and plan
    layout of parameters that stay replicated over tp."""
    tp_mesh = meshes.dense["tp"]
    cp_group = meshes.dense["cp"].get_group() if dims.cp > 1 else None
    trunk = [b for b in model.layers if isinstance(b, Block)]
    for block in blocks(model):
        where = TokenSlice(tp_mesh.get_local_rank(), dims.tp)
        first_or_mtp = block is trunk[0] or block not in trunk
        block.register_forward_pre_hook(enter_block(where, tp_mesh, split=first_or_mtp))
        if block is trunk[-1] or block not in trunk:
            block.register_forward_hook(leave_block(where, tp_mesh))
        attn = block.self_attn
        if isinstance(attn, V4Attention):
            tensor_parallel_v4(attn, tp_mesh, dims.tp)
        else:
            assert isinstance(attn, MLAttention)
            split_by_table(attn, tp_mesh)
            share_rope_key(attn, tp_mesh)
        on_token_slice(attn, where, tp_mesh)
        if isinstance(block.mlp, MLP):
            split_by_table(block.mlp, tp_mesh)
            on_token_slice(block.mlp, where, tp_mesh)
        else:
            moe_on_slice(block.mlp, where, tp_mesh, cp_group, dims.cp)
        sum_over_tp: ParamHook = functools.partial(shared_over_tp, tp_mesh=tp_mesh)
        for mod in (block.input_layernorm, block.post_attention_layernorm):
            mod.param_hook = sum_over_tp
        if block.hc > 1:
            block.hc_attn.param_hook = block.hc_ffn.param_hook = sum_over_tp


def split_by_table(module: nn.Module, tp_mesh: Any) -> None:
    """Split ``module``'s parameters over tp as the placement table (trex.trainer.parallel.placement) says:
    colwise/rowwise children through parallelize_module, shard0 parameters distributed as Shard(0). Row-parallel
    outputs stay partial sums (DTensors), which :func:`on_token_slice` reduce-scatters to the token slice."""
    from torch.distributed.tensor import Partial, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.distributed.tensor.parallel.style import ParallelStyle

    table = TP_TABLE[type(module).__name__]
    plan: dict[str, ParallelStyle] = {
        name: ColwiseParallel() if style == "colwise" else RowwiseParallel(output_layouts=Partial(),
                                                                           use_local_output=False)
        for name, style in table.items() if style != "shard0" and isinstance(getattr(module, name, None), nn.Module)}
    parallelize_module(module, tp_mesh, plan)
    for path, style in table.items():
        if style == "shard0":
            owner_path, _, name = path.rpartition(".")
            owner = module.get_submodule(owner_path)
            full = getattr(owner, name).data
            setattr(owner, name, nn.Parameter(distribute_tensor(full, tp_mesh, [Shard(0)], src_data_rank=None)))


def shared_over_tp(t: torch.Tensor, tp_mesh: Any) -> torch.Tensor:
    """Identity whose backward sums the gradient over tp: for a replicated tensor that every rank's heads
    (a part of all heads) or tokens (a slice of the micro-batch) read, so each rank holds part of its gradient."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    return DTensor.from_local(t, tp_mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


def tensor_parallel_v4(attn: V4Attention, tp_mesh: Any, tp: int) -> None:
    """DeepSeek-V4 attention over tp: query heads (q_b_proj column-parallel), their sinks and output
    groups (o_a_proj rows, o_b_proj row-parallel) split; the one shared key/value head, the compressor and
    the indexer replicated, with the shared key/value entries' gradients summed over tp and the indexer's
    head-mean target averaged over tp."""
    import torch.distributed as dist

    split_by_table(attn, tp_mesh)
    norms = [attn.kv_norm] + ([attn.compressor.kv_norm] if attn.compressor is not None else [])
    for norm in norms:
        norm.register_forward_hook(lambda _m, _a, out: shared_over_tp(out, tp_mesh))
    group = tp_mesh.get_group()

    def head_mean(p: torch.Tensor) -> torch.Tensor:
        p = p.clone()
        dist.all_reduce(p, group=group)
        return p / tp

    attn.head_mean = head_mean


def share_rope_key(attn: MLAttention, tp_mesh: Any) -> None:
    """MLA's rotary key is one vector shared by every head: where it meets the per-head keys it passes
    shared_over_tp (the latent part needs nothing: kv_b_proj's column-parallel input already sums its
    gradient)."""
    per_head = attn.expand

    def expand(c: torch.Tensor, k_rope_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return per_head(c, shared_over_tp(k_rope_rot, tp_mesh))

    attn.expand = expand  # type: ignore[method-assign]


class TokenSlice:
    """Where a tp rank's token slice lies in the micro-batch a block was called on: ``batch`` rows of ``seq``
    tokens, flattened, of which this rank holds ``size`` tokens from ``start``. Set by the block's pre-hook on
    every call (a recomputed forward runs inside the call, with the same values) and read by the hooks of its
    attention, dense FFN and MoE layer (the balance loss)."""

    def __init__(self, rank: int, tp: int) -> None:
        self.rank, self.tp = rank, tp
        self.batch = self.seq = self.start = self.size = 0

    def place(self, batch: int, seq: int) -> None:
        """Record a call on ``batch`` x ``seq`` tokens (they must divide by tp: trex.trainer.rules checks them)."""
        if (batch * seq) % self.tp:
            raise ValueError(f"a micro-batch of {batch} x {seq} = {batch * seq} tokens does not split over "
                             f"tp={self.tp} ranks (each tp rank holds a slice of the micro-batch's tokens)")
        self.batch, self.seq, self.size = batch, seq, batch * seq // self.tp
        self.start = self.rank * self.size

    def rows(self, device: torch.device) -> torch.Tensor:
        """The micro-batch row (sequence) of each of this rank's tokens [size]."""
        return torch.arange(self.start, self.start + self.size, device=device) // self.seq


def to_slice(x: torch.Tensor, where: TokenSlice, tp_mesh: Any) -> torch.Tensor:
    """[B, T, ...] replicated over tp -> this rank's tokens [1, size, ...] (batch x sequence flattened; DTensor
    Replicate -> Shard(0): a local slice, whose backward all-gathers the slices' gradients)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    rest = x.shape[2:]
    local = DTensor.from_local(x.reshape(where.batch * where.seq, *rest), tp_mesh, [Replicate()],
                               run_check=False).redistribute(tp_mesh, [Shard(0)]).to_local()
    return local.view(1, where.size, *rest)


def to_whole(x: torch.Tensor, where: TokenSlice, tp_mesh: Any) -> torch.Tensor:
    """This rank's tokens [1, size, ...] -> the whole micro-batch [B, T, ...] on every tp rank (DTensor Shard(0) ->
    Replicate: an all-gather, whose backward keeps this rank's slice of the gradient: the gradient arriving is
    already whole and equal on every tp rank, so summing it over tp would count it tp times)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    rest = x.shape[2:]
    whole = DTensor.from_local(x.reshape(where.size, *rest), tp_mesh, [Shard(0)], run_check=False).redistribute(
        tp_mesh, [Replicate()]).to_local()
    return whole.view(where.batch, where.seq, *rest)


def enter_block(where: TokenSlice, tp_mesh: Any, split: bool) -> Callable[..., tuple[Any, ...]]:
    """A block's pre-hook: record the micro-batch's shape (from the token ids [B, T]); ``split`` (the first
    trunk block and every MTP block, whose input is whole) cuts the input to this rank's token slice."""
    def pre(_mod: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x, ctx, token_ids = args
        where.place(*token_ids.shape)
        return (to_slice(x, where, tp_mesh) if split else x), ctx, token_ids

    return pre


def leave_block(where: TokenSlice, tp_mesh: Any) -> Callable[..., tuple[Any, ...]]:
    """A block's post-hook (the last trunk block, every MTP block): its output back to the whole micro-batch,
    so the final norm, mHC head, output head, loss and MTP modules see what one process does."""
    def post(_mod: nn.Module, _args: tuple[Any, ...], out: tuple[Any, ...]) -> tuple[Any, ...]:
        return (to_whole(out[0], where, tp_mesh), *out[1:])

    return post


def on_token_slice(module: nn.Module, where: TokenSlice, tp_mesh: Any) -> None:
    """Run a tensor-parallel ``module`` (attention, dense FFN) between token slices: its input (the normed
    slice) is all-gathered to the whole micro-batch before the column-parallel GEMMs (backward: this rank's
    slice of a gradient every rank holds whole), and its row-parallel output, a partial sum, is reduce-scattered
    to the slice (backward: an all-gather). Per layer and token of hidden size D that is (tp - 1) / tp x D
    values gathered and (tp - 1) / tp x D reduce-scattered forward, one all-gather of the output gradient and the
    column-parallel inputs' gradient all-reduce backward (as without the slices)."""
    from torch.distributed.tensor import DTensor, Shard

    def pre(_mod: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (to_whole(args[0], where, tp_mesh), *args[1:])

    def post(_mod: nn.Module, _args: tuple[Any, ...], out: Any) -> Any:
        y = out[0] if isinstance(out, tuple) else out
        assert isinstance(y, DTensor)  # the row-parallel output (split_by_table keeps it partial)
        d = y.shape[-1]
        flat = cast(DTensor, y.reshape(where.batch * where.seq, d))
        local = flat.redistribute(tp_mesh, [Shard(0)]).to_local().view(1, where.size, d)
        return (local, *out[1:]) if isinstance(out, tuple) else local

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(post)


def token_balance_share(where: TokenSlice, tp_group: Any, cp_group: Any,
                        cp: int) -> Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]:
    """The MoE sequence-balance loss of a tp rank's token slice (trex.trainer.model.moe.sequence_balance_loss
    on the rows its tokens belong to): f_i from each whole sequence's expert counts (summed over the tp
    ranks, whose slices may cut a sequence, and over cp, whose ranks hold chunks of it), P_i from this rank's
    tokens only. The shares of the tp (and cp) ranks sum to the loss of the whole sequences, and each router
    gets exactly its tokens' gradient."""
    import torch.distributed as dist

    def loss(scores: torch.Tensor, indices: torch.Tensor, n_experts: int) -> torch.Tensor:
        k = indices.shape[-1]
        scores, indices = scores.reshape(-1, n_experts), indices.reshape(-1, k)
        b, seq = where.batch, where.seq * cp
        row = where.rows(scores.device)
        counts = torch.zeros(b * n_experts, device=scores.device, dtype=scores.dtype)
        counts.index_add_(0, (row[:, None] * n_experts + indices).reshape(-1),
                          torch.ones(indices.numel(), device=scores.device, dtype=scores.dtype))
        dist.all_reduce(counts, group=tp_group)  # routing counts carry no gradient
        if cp > 1:
            dist.all_reduce(counts, group=cp_group)
        f = counts.view(b, n_experts) * (n_experts / (k * seq))
        p = scores.new_zeros(b, n_experts).index_add(0, row, scores / scores.sum(-1, keepdim=True)) / seq
        return (f * p).sum(-1).sum() / b

    return loss


def moe_on_slice(moe: MoE, where: TokenSlice, tp_mesh: Any, cp_group: Any, cp: int) -> None:
    """An MoE layer under tp runs on the block's token slice as it arrives (router, dispatch, routed and shared
    experts see only this rank's tokens, so every rank of the world holds different tokens); its token ids are
    cut to the same slice. The balance loss becomes this rank's share (token_balance_share), summed over tp in
    the forward (backward identity). Expert counts stay this rank's tokens'; the bias update sums them over the
    world, so every token counts once."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    moe.balance_loss = token_balance_share(where, tp_mesh.get_group(), cp_group, cp)  # covers cp's share too

    def pre(_mod: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x, token_ids = args
        ids = token_ids.reshape(-1)[where.start:where.start + where.size]
        return x, ids.view(1, where.size)

    def post(_mod: nn.Module, _args: tuple[Any, ...], out: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        y, balance, counts = out
        bal = DTensor.from_local(balance, tp_mesh, [Partial()], run_check=False).redistribute(
            tp_mesh, [Replicate()]).to_local()
        return y, bal, counts

    moe.register_forward_pre_hook(pre)
    moe.register_forward_hook(post)


# --- expert parallelism ------------------------------------------------------------------------------
def apply_expert_parallel(model: DeepSeekModel, dims: ParallelDims, meshes: Meshes, info: Parallelized) -> None:
    """Routed experts as DTensors: Shard(0) (experts) over ep, the hidden dim over etp; token dispatch."""
    from torch.distributed.tensor import Shard, distribute_tensor

    names = [n for n, size in (("ep", dims.ep), ("etp", dims.etp)) if size > 1]
    mesh = meshes.moe[tuple(names)] if len(names) > 1 else meshes.moe[names[0]]
    ep_group = meshes.moe["ep"].get_group()
    etp_group = meshes.moe["etp"].get_group()
    for block in blocks(model):
        if not isinstance(block.mlp, MoE):
            continue
        experts = block.mlp.experts
        for pname, hidden_dim in (("gate_proj", 1), ("up_proj", 1), ("down_proj", 2)):
            placements = [Shard(0) if n == "ep" else Shard(hidden_dim) for n in names]
            full = getattr(experts, pname).data
            setattr(experts, pname, nn.Parameter(distribute_tensor(full, mesh, placements, src_data_rank=None)))
        experts.dispatch = d = ExpertDispatch(experts.n_experts, dims.ep, dims.etp, ep_group, etp_group)
        info.dispatchers.append(d)


# --- FSDP2 -------------------------------------------------------------------------------------------
def apply_fsdp(model: DeepSeekModel, dims: ParallelDims, meshes: Meshes, param_dtype: torch.dtype,
               reshard_after_forward: bool) -> None:
    """fully_shard bottom-up: experts over edp, router and shared experts over dp_shard x tp, each block over
    dp_shard (HSDP with dp_replicate), the root (embedding, head, norms, MTP projections) last."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype,
                              reduce_dtype=torch.float32 if param_dtype == torch.bfloat16 else None)
    dense = meshes.fsdp_dense(dims)
    moe_dense = meshes.fsdp_moe_dense(dims)
    edp = meshes.moe["edp"]
    sharded: list[nn.Module] = []
    alone: set[nn.Parameter] = set()  # held by exactly one rank each (experts with edp = 1): no FSDP

    def shard(mod: nn.Module, mesh: Any, reshard: bool = reshard_after_forward) -> None:
        if mesh.size() > 1:
            fully_shard(mod, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard, ignored_params=alone or None)
            sharded.append(mod)

    for block in blocks(model):
        if isinstance(block.mlp, MoE):
            if edp.size() > 1:
                shard(block.mlp.experts, edp)
            else:
                alone.update(block.mlp.experts.parameters())
            shard(block.mlp.gate, moe_dense)
            if block.mlp.shared_experts is not None:
                shard(block.mlp.shared_experts, moe_dense)
        shard(block, dense)
    # The root holds the embedding, head, final norms and each MTP module's projection and norms (the root
    # forward calls an MTP module's final norm itself); they stay gathered until the fused loss has used them.
    shard(model, dense, reshard=False)
    for mod in sharded:
        assert isinstance(mod, FSDPModule)
        mod.set_gradient_divide_factor(1.0)
        mod.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
