"""Per-device memory plan of a training run: the bytes one rank holds for parameters, gradients, both
optimizers' states, activations and communication under the sharding of the parallel trainer.

Parameter shapes come from the model itself, built once per shape on the meta device (no memory, about a
second for v4-pro), and are grouped by where the parallel layer places them:

* ``experts``: routed expert stacks [E, I, D] / [E, D, I]: E/ep experts per ep rank, I/etp per etp rank,
  then FSDP over edp = world / (ep x etp) on dim 0;
* ``moe``: the router weight and shared experts of MoE layers: FSDP over dpShard x tp ranks;
* ``tp_col`` / ``tp_row``: attention q_proj (or q_b_proj), kv_b_proj (MLA), o_a_proj and sinks (V4) and
  dense-MLP gate/up split on the output dim over tp; o_proj (MLA), o_b_proj (V4) and dense-MLP down split
  on the input dim; then FSDP over dpShard;
* ``replicated``: everything else (embedding, head, norms, q_a/kv_a projections, CSA compressor and
  indexer, mHC, MTP eh_proj): replicated over tp, FSDP over dpShard.

FSDP shards dim 0 with torch.chunk semantics (each rank holds at most ceil(dim0 / N) rows; the plan is
the most loaded rank). dtypes: one process keeps parameters, gradients and optimizer states in
model.dtype; with more than one rank the sharded parameters are fp32 (the masters when model.dtype is
bf16), gradients and optimizer states fp32, and FSDP gathers blocks in model.dtype.

Parameters, gradients and optimizer states are exact up to FSDP padding (checked against
:func:`measured_state_bytes` of real runs); activations, communication buffers and optimizer transients
are estimates of this trainer's saved tensors and buffers, with trainer.recompute: none keeps every
block's activations for the backward, selective recomputes the attention and the routed experts (keeping
their inputs, plus one layer's recompute at a time), full keeps only each block's input (plus one block).
With optimizer.swap the optimizer states are in host memory and the device holds ``buffers`` bucket
buffers of the largest bucket (bucketMb, or the largest single parameter's states or Newton-Schulz batch's
momentum when that is larger). For a bf16 model the fp32 masters of the parameters FSDP2 shards move to
host memory as well, and the device keeps a bf16 copy of each master shard (what FSDP2 gathers).
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from trex.trainer.config import TrainerConfig, resolved_model_values
from trex.trainer.mfu import GIB, DeviceSku
from trex.trainer.model_args import SINK_BLOCK, ModelArgs
from trex.trainer.parallel.placement import tp_style

if TYPE_CHECKING:
    from torch import nn

    from trex.trainer.optim.build import Optimizers

Placement = Literal["experts", "moe", "tp_col", "tp_row", "replicated"]
_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp64": 8}


@dataclass(frozen=True)
class ParamInfo:
    """One parameter of the model: full shape, placement class, optimizer and FSDP unit."""

    name: str
    shape: tuple[int, ...]
    placement: Placement
    role: str
    """muon or adamw (model.param_roles())."""
    unit: str
    """FSDP unit: a trunk block (layers.N), an MTP module (mtp.N) or the root (embedding, head, norm)."""


@dataclass(frozen=True)
class Census:
    """Every parameter of one model shape, plus the bytes of its buffers (held whole on every rank)."""

    params: tuple[ParamInfo, ...]
    buffer_bytes: int

    @property
    def total(self) -> int:
        """Parameter count."""
        return sum(math.prod(p.shape) for p in self.params)


def _placement(name: str, owner: Any, parent: Any) -> Placement:
    """Where the parallel layer puts parameter ``name`` (of module ``owner``, child of ``parent``): routed
    experts, router and shared experts, else tensor parallelism's placement table."""
    from trex.trainer.model.moe import Gate, GroupedExperts

    if isinstance(owner, GroupedExperts):
        return "experts"
    if isinstance(owner, Gate) or ".shared_experts." in name:
        return "moe"
    parts = name.rsplit(".", 2)
    for mod, rel in ((parent, ".".join(parts[-2:])), (owner, parts[-1])):
        style = tp_style(type(mod).__name__, rel)
        if style is not None:
            return "tp_row" if style == "rowwise" else "tp_col"
    return "replicated"


def _unit(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] in ("layers", "mtp") else "root"


@functools.lru_cache(maxsize=16)
def _census(values: tuple[tuple[str, Any], ...]) -> Census:
    from trex.trainer.model import ModelArgs, build_model_from_args

    shape = {k: list(v) if isinstance(v, tuple) else v for k, v in values}  # lists were made hashable
    model = build_model_from_args(ModelArgs.from_values(shape), device="meta")
    roles = model.param_roles()
    modules = dict(model.named_modules())
    out: list[ParamInfo] = []
    for mod_name, mod in modules.items():
        parent = modules.get(mod_name.rsplit(".", 1)[0] if "." in mod_name else "")
        for p_name, p in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if full not in roles:
                continue
            out.append(ParamInfo(full, tuple(p.shape), _placement(full, mod, parent), roles[full], _unit(full)))
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return Census(tuple(out), buffers)


def census(values: Mapping[str, Any]) -> Census:
    """The parameters of the model the resolved shape ``values`` builds (cached per shape)."""
    return _census(tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in values.items())))


@dataclass(frozen=True)
class Layout:
    """The parallel degrees of one run (pp = 1): dense view dp x tp, MoE view edp x ep x etp."""

    world: int
    dp: int
    tp: int
    ep: int
    etp: int
    dp_replicate: int

    @property
    def dp_shard(self) -> int:
        """Ranks one dense parameter is sharded over (FSDP)."""
        return self.dp // self.dp_replicate

    @property
    def edp(self) -> int:
        """Ranks one routed expert stack is sharded over (FSDP)."""
        return self.world // (self.ep * self.etp)

    @classmethod
    def of(cls, cfg: TrainerConfig, world: int) -> Layout:
        """The layout of ``cfg`` on ``world`` ranks (assumes parallelism_problems found nothing)."""
        p = cfg.parallelism
        return cls(world, p.dp * p.cp if p.dp else world // p.tp, p.tp, p.ep, p.etp, p.dp_replicate)  # cp: data


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _split_shape(p: ParamInfo, lay: Layout) -> list[int]:
    """The tp / ep / etp-local shape, before FSDP: what an FSDP all-gather materialises."""
    shape = list(p.shape)
    if lay.world == 1:
        return shape
    if p.placement == "experts":
        shape[0] //= lay.ep
        i_dim = 2 if p.name.endswith("down_proj") else 1
        shape[i_dim] = _ceil(shape[i_dim], lay.etp)
    elif p.placement == "tp_col":
        shape[0] = _ceil(shape[0], lay.tp)
    elif p.placement == "tp_row":
        shape[1] = _ceil(shape[1], lay.tp)
    return shape


def local_shape(p: ParamInfo, lay: Layout) -> tuple[int, ...]:
    """The shape one rank holds: tp / ep / etp split, then FSDP's dim-0 chunk (none in one process)."""
    shape = _split_shape(p, lay)
    if lay.world > 1:
        n = {"experts": lay.edp, "moe": lay.dp_shard * lay.tp}.get(p.placement, lay.dp_shard)
        shape[0] = _ceil(shape[0], n)
    return tuple(shape)


def _unsharded(p: ParamInfo, lay: Layout) -> int:
    return math.prod(_split_shape(p, lay))


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device (the most loaded rank) by part, and the device it is planned against."""

    params: int
    """Parameters as stored (fp32 masters when model.dtype is bf16 and the run is sharded)."""
    grads: int
    """Gradients."""
    muon_state: int
    """Muon momentum (1 x its parameters)."""
    adamw_state: int
    """AdamW exp_avg and exp_avg_sq (2 x its parameters)."""
    buffers: int
    """Module buffers (router biases, hash-routing tables), whole on every rank."""
    activations: int
    """Tensors one micro-batch saves for the backward, every layer, under ``recompute``."""
    recompute: str
    """trainer.recompute the activations are planned with."""
    fsdp_gather: int
    """Transient: FSDP-gathered blocks in model.dtype (two with prefetch; every block with
    reshardAfterForward false) plus the root."""
    comm_buffers: int
    """Transient: MoE all-to-all dispatch + combine (x etp for ETP), one block's fp32 gradient reduce-scatter, and
    under cp a DeepSeek-V4 layer's halo and compressed entries (send + receive, v4_exchange_bytes)."""
    optimizer_transient: int
    """Transient in the optimizer step: Muon updates, Newton-Schulz workspace, distributed-Muon gathers."""
    swap: bool
    """Optimizer states in host memory (optimizer.swap): states are not on the device, its buffers are."""
    swap_buffers: int
    """Device buffers of the swap optimizer (buffers x the largest bucket)."""
    masters: int
    """Bytes of fp32 master shards (the parameters FSDP2 shards of a bf16 model; 0 otherwise), part of
    ``params``: with swap they are in host memory and the device holds bf16 copies, half their size."""
    device: DeviceSku
    """The device planned against."""
    capacity: int | None
    """Bytes one process may use on that device (None: unknown, fit not checked)."""
    world: int
    """Ranks of the run."""
    sampling: int = 0
    """The sampling modes' model copies (grpo's reference policy, sharded; the whole decoding replica under tp / ep)."""
    rollout: int = 0
    """Transient while decoding: the FSDP2 units gathered for the whole rollout (FSDP2 alone) and the KV cache."""
    offloaded: int = 0
    """Block inputs in host memory (trainer.activationOffload): every block's, already taken out of
    ``activations`` but for the two in flight."""
    router_gather: int = 0
    """Transient in the steps anticipatory routing is on: every router's whole Δt-old weight in model.dtype, gathered
    from the ranks' snapshot shards (trex.trainer.spike._whole); 0 in one process, where the snapshot is whole."""

    @property
    def device_params(self) -> int:
        """Parameter bytes on the device: with swap, the masters' bf16 copies stand in for the masters."""
        return self.params - self.masters // 2 if self.swap else self.params

    @property
    def swap_saved(self) -> int:
        """Device bytes optimizer.swap saves: the states and the masters minus the buffers and bf16 copies
        (0 when the buffers are the larger, as SwapStats counts it)."""
        if not self.swap:
            return 0
        return max(0, self.params - self.device_params + self.muon_state + self.adamw_state - self.swap_buffers)

    @property
    def persistent(self) -> int:
        """Held for the whole run."""
        states = self.swap_buffers if self.swap else self.muon_state + self.adamw_state
        return self.device_params + self.grads + states + self.buffers + self.sampling

    @property
    def total(self) -> int:
        """Peak: persistent + the largest of the forward/backward, optimizer and rollout phases."""
        step = self.activations + self.fsdp_gather + self.comm_buffers + self.router_gather
        return self.persistent + max(step, self.optimizer_transient, self.rollout)

    @property
    def fits(self) -> bool | None:
        """total <= capacity (None when the capacity is unknown)."""
        return None if self.capacity is None else self.total <= self.capacity


def gib(n: float) -> str:
    """Bytes as GiB with one decimal (two below 10 GiB; MiB, KiB below; 64 GiB, not 64.0)."""
    if n < 2**20:
        return f"{n / 2**10:.1f} KiB"
    if n < GIB:
        return f"{n / 2**20:.1f} MiB"
    text = f"{n / GIB:.2f}" if n < 10 * GIB else f"{n / GIB:.1f}".removesuffix(".0")
    return f"{text} GiB"


def activation_bytes(v: Mapping[str, Any], lay: Layout, micro_batch: int, seq_len: int, act: int,
                     attention_probs: bool = False, recompute: str = "none") -> int:
    """Saved-for-backward bytes of one micro-batch of ``micro_batch`` x ``seq_len`` tokens (per rank), every
    block, at ``act`` bytes per element: residual/mHC streams and norms (:func:`residual_bytes`, on the rank's
    1/tp of the tokens), attention projections (heads / tp, on the whole micro-batch),
    the attention mask, the CSA compressed keys and lightning-indexer scores, router scores (fp32), routed
    experts (top-k copies, x etp gathered tokens), shared and dense MLPs (the MoE layers' terms on this tp
    rank's 1/tp of the micro-batch's tokens: sequence parallelism, trex.trainer.parallel.parallelize; the dense
    MLPs' on the whole micro-batch they gather), and the fused loss's saved
    input and head-weight gradients. ``attention_probs``: MLA's SDPA keeps the [H, T, T + S] probabilities (the
    math kernel CPUs run with a mask); accelerators' fused attention keeps only the log-sum-exp. DeepSeek-V4's
    sink attention keeps its inputs on every device and its backward holds one block's probabilities at a time
    (:func:`sink_block_bytes`).
    ``recompute``: none, selective (the attention and routed experts keep their inputs only; one layer's
    recompute is live at a time) or full (every block keeps its input; one block's recompute is live)."""
    def g(key: str) -> int:
        return int(v[key])

    d, heads, t, n_tok = g("hidden_size"), g("num_heads"), seq_len, micro_batch * seq_len
    h = heads // lay.tp
    qk, nope, vd, rope = g("qk_nope_head_dim") + g("qk_rope_head_dim"), g("qk_nope_head_dim"), g("v_head_dim"), \
        g("qk_rope_head_dim")
    ql, kl, hc = g("q_lora_rank"), g("kv_lora_rank"), g("hc_mult")
    csa = v["attention"] == "csa"
    m = g("csa_compress_every")
    s = t // m if csa else 0  # compressed entries per sequence
    residual = residual_bytes(v, lay.tp, 1, act)  # per token of the micro-batch (its 1/tp on this rank)
    q = (2 * ql + 3 * h * qk + (h * qk if csa else 0)) * act
    kv = (2 * kl + rope + (h * (nope + vd) + h * qk) * (1 + s / t)) * act
    attn_out = 2 * h * vd * act + 4 * h + (t + s)  # SDPA output, o_proj input, log-sum-exp, boolean mask
    if attention_probs and not csa:
        attn_out += h * (t + s) * act
    indexer = 0.0
    if csa:
        ih, idim = g("csa_indexer_heads"), g("csa_indexer_dim")
        # scores (ReLU output and its reshaped copy), the KL's log-softmax and target (>= fp32), visibility
        indexer = (2 * ih * s + ih * idim + ih) * act + 2 * max(act, 4) * s + s
    core = q + kv + attn_out + indexer  # inside the attention module: what selective recompute drops
    attn = residual + core
    e, k, mi, ns = g("n_routed_experts"), g("experts_per_token"), g("moe_intermediate_size"), g("n_shared_experts")
    moe_tok = n_tok / lay.tp  # the MoE layers' token split
    experts = k * (lay.etp * 2 * d + 3 * mi) * act * moe_tok  # dispatched rows and expert GEMM inputs
    moe = (4 * d + 8 * e + (d + 3 * mi * ns) * act + d * act) * moe_tok + experts
    dense = (2 * d + 3 * _ceil(g("intermediate_size"), lay.tp)) * act * n_tok
    layers, n_dense, mtp, vocab = g("num_layers"), g("n_dense_layers"), g("mtp_depth"), g("vocab_size")
    n_attn, n_moe = layers + mtp, layers - n_dense + mtp
    if recompute == "full":  # each block's input streams, and one block recomputed at a time
        block = attn * n_tok + (moe if n_moe else dense)
        total = n_attn * max(hc, 1) * d * act * n_tok / lay.tp + block
    elif recompute == "selective":  # the modules' inputs (x; expert indices and weights) instead of their insides
        kept_attn = (residual + d * act) * n_tok
        kept_moe = moe - experts + 12 * k * moe_tok
        total = n_attn * kept_attn + n_moe * kept_moe + n_dense * dense + max(core * n_tok, experts if n_moe else 0)
    else:
        total = n_attn * attn * n_tok + n_moe * moe + n_dense * dense
    total += sink_block_bytes(v, lay, micro_batch, t, t + s, act) if csa else 0  # one block's recompute, once
    total += n_tok * hc * d * act / lay.tp + mtp * n_tok * 4 * d * act  # embedded streams (sliced); MTP projections
    total += (1 + mtp) * (n_tok * d * act + vocab * d * act + 2 * n_tok * d * act)  # fused loss + final norms
    return int(total)


def residual_bytes(v: Mapping[str, Any], tp: int, tokens: int, act: int) -> float:
    """Saved-for-backward bytes of one block's residual path for ``tokens`` tokens of a micro-batch, per rank: the
    two norms (input and normalised value each) and, with mHC, both sublayers' mappings (the flattened streams
    and their statistics in >= fp32, the Sinkhorn iterations' intermediates, the read and the write). Under tp the
    residual stream lives on each rank's 1/tp of the tokens (sequence parallelism, trex.trainer.parallel
    .parallelize), so this divides by tp."""
    d, hc, iters = int(v["hidden_size"]), int(v["hc_mult"]), int(v["sinkhorn_iters"])
    norms = 4 * d * act
    streams = 2 * (hc * d * (8 + 2 * act) + 8 * iters * (hc * hc + hc)) if hc > 1 else 0
    return (norms + streams) * tokens / tp


def sink_block_bytes(v: Mapping[str, Any], lay: Layout, micro_batch: int, queries: int, keys: int, act: int) -> int:
    """The bytes DeepSeek-V4's sink attention (trex.trainer.model.v4attention.sink_attention) recomputes and holds
    at once in the backward: one block of min(queries, SINK_BLOCK) query rows of the micro-batch, the local heads'
    probabilities over ``keys`` keys, the two copies its autograd saves (measured: the softmax's output with the
    sink column, the value product's contiguous copy without it). No fused sink-attention kernel exists, so this
    holds on every device."""
    rows = micro_batch * (int(v["num_heads"]) // lay.tp) * min(queries, SINK_BLOCK)
    return rows * (2 * keys + 1) * act


def offload_bytes(v: Mapping[str, Any], lay: Layout, micro_batch: int, seq_len: int, act: int) -> tuple[int, int]:
    """trainer.activationOffload under recompute full: (bytes of every block's input, which move to host memory;
    bytes of the two of them in flight on the device: the one the backward recomputes and the one prefetched,
    or in the forward the one being copied out while the next is saved). A block input is the residual (the mHC
    streams) of the micro-batch's tokens on this rank (1/tp of them under tp), as :func:`activation_bytes` counts it."""
    per_block = max(int(v["hc_mult"]), 1) * int(v["hidden_size"]) * act * micro_batch * seq_len // lay.tp
    n_blocks = int(v["num_layers"]) + int(v["mtp_depth"])
    return n_blocks * per_block, min(2, n_blocks) * per_block


def context_activation_bytes(v: Mapping[str, Any], lay: Layout, micro_batch: int, seq_len: int, act: int,
                             attention_probs: bool = False, recompute: str = "none", cp: int = 1) -> int:
    """activation_bytes under context parallelism (trex.trainer.parallel.context): every rank holds seq_len / cp
    tokens of each sequence, and each attention layer also keeps what it gathered of the other ranks' chunks, with
    the mask (and on CPUs the probabilities) over all seq_len keys: an mla layer the latent (kv_lora_rank + rope)
    and the per-head keys and values expanded from it; a DeepSeek-V4 layer (:func:`v4_context_bytes`) its shared
    key/value entries and its compressor's and indexer's features, pooled over the whole sequences, and its
    backward's block of probabilities spans the halo and the whole sequences' entries (:func:`sink_block_bytes`).
    Those extra keys are kept by every layer without recompute and by the one layer being recomputed with it (under
    recompute they are a transient of one layer). cp = 1 is activation_bytes itself."""
    local = seq_len // cp
    base = activation_bytes(v, lay, micro_batch, local, act, attention_probs, recompute)
    if cp == 1:
        return base
    others = seq_len - local  # keys of the other ranks' chunks, per sequence
    if v["attention"] == "csa":
        per_layer = v4_context_bytes(v, local, others, act)
        kept = sum(per_layer) if recompute == "none" else max(per_layer)
        every = int(v["csa_compress_every"])  # the layers with the most keys: the window's halo and csa's entries
        keys = local + halo_tokens(seq_len, cp, int(v["csa_window"]) - 1) + seq_len // every
        block = sink_block_bytes(v, lay, micro_batch, local, keys, act) - sink_block_bytes(
            v, lay, micro_batch, local, local + local // every, act)  # beyond activation_bytes' block
        return base + micro_batch * kept + block
    h = int(v["num_heads"]) // lay.tp
    nope, rope, vd, kl = (int(v[k]) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank"))
    keys = others * (kl + rope + h * (nope + vd) + h * (nope + rope)) * act
    scores = local * others * (1 + (h * act if attention_probs else 0))
    layers = int(v["num_layers"]) + int(v["mtp_depth"]) if recompute == "none" else 1
    return base + layers * micro_batch * (keys + scores)


def halo_tokens(seq: int, cp: int, reach: int, rank: int | None = None) -> int:
    """The tokens cp rank ``rank`` receives in a halo exchange of ``reach`` (trex.trainer.parallel.context.halo):
    the ``reach`` tokens before each of its two chunks that it does not hold itself (None: the most of any rank)."""
    size = seq // (2 * cp)

    def count(r: int) -> int:
        chunks = (r, 2 * cp - 1 - r)
        return len({g for k in chunks for g in range(max(0, k * size - reach), k * size) if g // size not in chunks})

    return max(count(r) for r in range(cp)) if rank is None else count(rank)


def v4_exchange_bytes(v: Mapping[str, Any], seq: int, cp: int, act: int, rank: int | None = None) -> list[int]:
    """Per DeepSeek-V4 attention layer (trunk, then MTP blocks), the bytes cp rank ``rank`` (None: the most of any
    rank) receives for one sequence of ``seq`` tokens, one document, in the forward (the backward returns as many):
    the halo of the shared key/value entries (head_dim per token, csa_window - 1 tokens before each chunk), the
    halo of the compressor's and the indexer's per-token features (hca: 2 head_dim, hca_compress_every - 1 tokens;
    csa: 4 head_dim + 4 csa_indexer_dim, 2 csa_compress_every - 1 tokens: the overlapping windows) and the other
    ranks' compressed entries (head_dim, csa + csa_indexer_dim), one per complete window (whose last position is
    every - 1 modulo every: seq / every of them in one document). Under cp the exchange replaces the all-gather of
    every per-token value: (cp - 1) / cp seq x (1, 3 or 5 head_dim + 4 csa_indexer_dim)."""
    if rank is None:
        per_rank = [v4_exchange_bytes(v, seq, cp, act, r) for r in range(cp)]
        return [max(layer) for layer in zip(*per_rank, strict=True)]
    args = ModelArgs.from_values(dict(v))
    hd, size = args.head_dim, seq // (2 * cp)
    chunks = (rank, 2 * cp - 1 - rank)
    out = []
    for layer in range(args.num_layers + args.mtp_depth):
        kind = args.layer_kind(layer)
        total = halo_tokens(seq, cp, args.csa_window - 1, rank) * hd
        if kind != "sliding":
            every = args.csa_compress_every if kind == "csa" else args.hca_compress_every
            width = {"csa": 4 * hd + 4 * args.csa_indexer_dim, "hca": 2 * hd}[kind]
            entry = hd + (args.csa_indexer_dim if kind == "csa" else 0)
            others = seq // every - sum((k + 1) * size // every - k * size // every for k in chunks)
            total += halo_tokens(seq, cp, (2 if kind == "csa" else 1) * every - 1, rank) * width + others * entry
        out.append(total * act)
    return out


def v4_context_bytes(v: Mapping[str, Any], local: int, others: int, act: int) -> list[int]:
    """Per DeepSeek-V4 attention layer (trunk, then MTP blocks), the bytes one sequence's ``local`` tokens on a cp
    rank save beyond one process's ``local`` tokens (trex.trainer.parallel.context): the halo tokens before each
    of its chunks (:func:`halo_tokens`): the shared key/value entries of csa_window - 1 of them, and of the
    pooling's reach the compressor's (hca 2 x head_dim, csa 4 x head_dim) and the indexer's (4 x csa_indexer_dim)
    features with the pooling's copies of them; the compressed entries of the other ranks' windows (the whole
    sequences' seq / every, normed and rotated); the masks of the local queries over the halo and those entries
    (sink attention saves no probabilities: its backward recomputes them a block at a time, on every device), and
    the indexer's scores over the entries (two copies), its loss's log-softmax and target over them."""
    args = ModelArgs.from_values(dict(v))
    hd = args.head_dim
    seq = local + others
    cp = seq // local
    window = halo_tokens(seq, cp, args.csa_window - 1)
    out = []
    for layer in range(args.num_layers + args.mtp_depth):
        kind = args.layer_kind(layer)
        every = {"csa": args.csa_compress_every, "hca": args.hca_compress_every}.get(kind, 0)
        entries = others // every if every else 0
        reach = (2 if kind == "csa" else 1) * every - 1
        halo = halo_tokens(seq, cp, reach) if every else 0
        feature = {"csa": 2 * 2 * hd, "hca": 2 * hd}.get(kind, 0)  # key + gate features per token
        indexer = 2 * 2 * args.csa_indexer_dim if kind == "csa" else 0
        copies = 4 if kind == "csa" else 3  # csa's overlapping windows also copy the key features
        tokens = window * (hd * act + 2 * 8) + halo * ((feature + indexer + copies * (feature + indexer) // 2) * act
                                                       + 2 * 8)  # + position, document
        scores = local * (window + entries)  # the boolean mask
        if kind == "csa":
            scores += local * entries * (2 * args.csa_indexer_heads * act + 2 * max(act, 4) + 1)
        out.append(tokens + entries * 4 * hd * act + scores)
    return out


def plan_memory(cfg: TrainerConfig, world: int, device: DeviceSku, capacity: int | None = None) -> MemoryPlan:
    """The per-device plan of ``cfg`` on ``world`` ranks of ``device`` (``capacity`` defaults to the
    device's memory). Assumes parallelism_problems(cfg, world) is empty."""
    values: dict[str, Any] = resolved_model_values(cfg.model)
    c = census(values)
    if not cfg.optimizer.muon.enabled:  # AdamW-only: every parameter has AdamW's two states
        c = replace(c, params=tuple(replace(p, role="adamw") for p in c.params))
    lay = Layout.of(cfg, world)
    sharded = world > 1
    model_bytes = _DTYPE_BYTES[cfg.model.dtype]
    store = max(model_bytes, 4) if sharded else model_bytes  # fp32 masters for bf16; fp64 stays fp64
    act = 2 if "bf16" in (cfg.model.dtype, cfg.model.autocast) else max(model_bytes, 4)
    local = {p.name: math.prod(local_shape(p, lay)) for p in c.params}
    n_params = sum(local.values())
    muon = sum(local[p.name] for p in c.params if p.role == "muon")
    adamw = n_params - muon

    units: dict[str, int] = defaultdict(int)
    for p in c.params:
        units[p.unit] += _unsharded(p, lay)
    gather = 0
    if sharded:
        blocks = sorted((n for u, n in units.items() if u != "root"), reverse=True)
        kept = sum(blocks) if not cfg.parallelism.reshard_after_forward else sum(blocks[:2])
        gather = (units.get("root", 0) + kept) * model_bytes

    seq = max([cfg.data.seq_len, *(s.seq_len for s in cfg.data.seq_len_curriculum)])
    tokens = cfg.data.micro_batch_size * seq // cfg.parallelism.cp
    comm = 0
    if lay.ep > 1 or lay.etp > 1:
        comm += 2 * (tokens // lay.tp) * int(values["experts_per_token"]) * int(values["hidden_size"]) * act * lay.etp
    if sharded:
        comm += max((n for u, n in units.items() if u != "root"), default=0) * 4
    if cfg.parallelism.cp > 1 and values["attention"] == "csa":  # a V4 layer's halo and entries: send + receive
        comm += 2 * cfg.data.micro_batch_size * max(v4_exchange_bytes(values, seq, cfg.parallelism.cp, act))

    opt = muon * store + 3 * _largest_bucket(c.params, lay) * 4  # Nesterov updates + Newton-Schulz workspace
    if sharded:
        dense_muon = [p for p in c.params if p.role == "muon" and p.placement != "experts"]
        full = sum(_unsharded(p, lay) for p in dense_muon) * 4
        if cfg.optimizer.muon.distributed == "gather":
            opt += full
        else:  # owner: send + receive buffers of the matrices this rank owns (balanced)
            opt += 2 * full // max(lay.dp_shard, 1)
    swap = cfg.optimizer.swap
    # fp32 masters: the parameters of a bf16 model that FSDP2 shards (it gathers them in bf16)
    held = {p.name for p in c.params if sharded and cfg.model.dtype == "bf16" and _fsdp_ranks(p, lay) > 1}
    # a swap bucket is at least one parameter's states (and master), or one Newton-Schulz batch's momentum
    # (and masters)
    largest_state = max([local[p.name] * store * ((1 if p.role == "muon" else 2) + (p.name in held))
                         for p in c.params]
                        + [_largest_bucket(c.params, lay) * store * (2 if held else 1)])
    plan = MemoryPlan(
        params=n_params * store, grads=n_params * store, muon_state=muon * store, adamw_state=2 * adamw * store,
        buffers=c.buffer_bytes, activations=context_activation_bytes(
            values, lay, cfg.data.micro_batch_size, seq, act, attention_probs=device.device_type == "cpu",
            recompute=cfg.recompute, cp=cfg.parallelism.cp),
        recompute=cfg.recompute, fsdp_gather=gather, comm_buffers=comm, optimizer_transient=opt, swap=swap.enabled,
        swap_buffers=swap.buffers * max(swap.bucket_mb * 2**20, largest_state),
        masters=sum(local[n] for n in held) * store, device=device,
        capacity=device.memory_bytes if capacity is None else capacity, world=world,
        **sampling_bytes(cfg, values, c, lay, world), router_gather=router_gather_bytes(c, model_bytes, sharded),
    )
    return with_offload(plan, cfg, values, lay, seq // cfg.parallelism.cp, act)  # a cp rank holds seq / cp tokens


def router_gather_bytes(c: Census, model_bytes: int, sharded: bool) -> int:
    """Bytes of every router's whole weight (``...gate.weight``), which anticipatory routing gathers from the ranks'
    snapshot shards for the steps it is on (0 unsharded: the snapshot is the whole weight)."""
    if not sharded:
        return 0
    return sum(math.prod(p.shape) for p in c.params if p.name.endswith(".gate.weight")) * model_bytes


def with_offload(plan: MemoryPlan, cfg: TrainerConfig, values: Mapping[str, Any], lay: Layout, seq: int,
                 act: int) -> MemoryPlan:
    """``plan`` with trainer.activationOffload: the block inputs leave the device activations (but for the two in
    flight) and are counted as ``offloaded`` host bytes (unchanged without offload)."""
    if not cfg.activation_offload or plan.recompute != "full":
        return plan
    moved, in_flight = offload_bytes(values, lay, cfg.data.micro_batch_size, seq, act)
    return replace(plan, activations=plan.activations - moved + in_flight, offloaded=moved)


def _fsdp_ranks(p: ParamInfo, lay: Layout) -> int:
    """Ranks of the FSDP2 mesh that holds ``p`` (1: FSDP2 leaves it alone)."""
    return {"experts": lay.edp, "moe": lay.dp * lay.tp}.get(p.placement, lay.dp)


def reference_bytes(cfg: TrainerConfig, c: Census, lay: Layout, world: int) -> int:
    """Bytes per rank of grpo's reference policy (0 when klCoef is 0): distributed like the student (its local
    shards in model.dtype, frozen: no masters, gradients or states) plus the buffers; whole in one process."""
    if cfg.mode != "grpo" or cfg.grpo.kl_coef == 0:
        return 0
    params = sum(math.prod(local_shape(p, lay)) for p in c.params) if world > 1 else c.total
    return params * _DTYPE_BYTES[cfg.model.dtype] + c.buffer_bytes


def sampling_bytes(cfg: TrainerConfig, values: Mapping[str, Any], c: Census, lay: Layout,
                   world: int) -> dict[str, int]:
    """What modes grpo and opd hold besides training, per rank: ``sampling`` (persistent: grpo's reference policy
    when klCoef > 0, sharded like the student, and under tp / ep the decoding replica, the whole model in
    model.dtype) and ``rollout``
    (transient: with FSDP2 alone every unit gathered for the whole rollout, plus the KV cache of this rank's
    samples at min(maxSeqLen, data.seqLen + maxNewTokens) tokens, exact for mla and an upper bound for the
    DeepSeek-V4 stack). opd's teachers are not planned: their shapes are only known once their folders exist."""
    if cfg.mode not in ("grpo", "opd"):
        return {}
    model_bytes = _DTYPE_BYTES[cfg.model.dtype]
    whole = c.total * model_bytes + c.buffer_bytes
    replica = world > 1 and lay.tp * lay.ep * lay.etp > 1
    sampling = reference_bytes(cfg, c, lay, world) + whole * int(replica)
    if cfg.mode == "grpo":
        prompts, samples, new = cfg.grpo.prompts_per_step, cfg.grpo.group_size, cfg.grpo.max_new_tokens
    else:
        prompts, samples, new = cfg.opd.prompts_per_step, cfg.opd.samples_per_prompt, cfg.opd.sampling.max_new_tokens
    rows = -(-(prompts // max(lay.dp, 1) * samples) // lay.tp)  # the tp ranks split a rank's samples
    args = ModelArgs.from_values(dict(values))
    kv = kv_cache_bytes(args, rows, min(args.max_seq_len, cfg.data.seq_len + new), model_bytes)
    gathered = whole if world > 1 and not replica else 0
    return {"sampling": sampling, "rollout": gathered + kv}


def kv_cache_bytes(args: ModelArgs, rows: int, context: int, elem: int) -> int:
    """Bytes of the rollout engine's KV cache for ``rows`` samples of ``context`` tokens (``elem`` bytes per value):
    mla keeps the latent and the rope key per token and layer (exact); the DeepSeek-V4 stack a window ring, the
    compressed entries and the indexer's keys (bounded by the densest compression on every layer)."""
    if args.attention == "csa":
        compress = min(args.csa_compress_every, args.hca_compress_every)
        per_layer = (min(context, args.csa_window) * args.head_dim + context // compress * args.head_dim
                     + context // args.csa_compress_every * args.csa_indexer_dim)
    else:
        per_layer = context * (args.kv_lora_rank + args.qk_rope_head_dim)
    return rows * args.num_layers * per_layer * elem


def _largest_bucket(params: Iterable[ParamInfo], lay: Layout) -> int:
    """Elements of the largest batched Newton-Schulz call (``ns_batches`` of the local Muon matrices)."""
    from trex.trainer.optim.muon import ns_batches

    shapes = [local_shape(p, lay) for p in params if p.role == "muon"]
    return max((sum(math.prod(shapes[i]) for i in b) for b in ns_batches(shapes)), default=0)


def with_swap(plan: MemoryPlan, enabled: bool) -> MemoryPlan:
    """The same plan with optimizer states on (False) or off (True) the device."""
    return replace(plan, swap=enabled)


def measured_state_bytes(model: nn.Module, optimizers: Optimizers) -> dict[str, int]:
    """Bytes this rank actually holds: its local shards (DTensor.to_local()) of parameters, gradients,
    Muon state and AdamW state (AdamW's scalar step counters left out). The counterpart of plan_memory's
    params, grads, muon_state and adamw_state."""
    import torch

    def nbytes(t: Any) -> int:
        if not isinstance(t, torch.Tensor):
            return 0
        local = t.to_local() if hasattr(t, "to_local") else t
        return int(local.numel() * local.element_size())

    params = [p for p in model.parameters() if p.requires_grad]

    def state(opt: torch.optim.Optimizer | None) -> int:
        if opt is None:
            return 0
        return sum(nbytes(val) for s in opt.state.values() for key, val in s.items() if key != "step")

    return {
        "params": sum(nbytes(p) for p in params),
        "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
        "muon_state": state(optimizers.muon),
        "adamw_state": state(optimizers.adamw),
    }


# --- lifecycle plan: host memory and disk bytes per rank, phase by phase ----------------------------------------
# The phases around the step (start and load, checkpoint save, resume, export, rollout) and the step's host side,
# from the census's local shard shapes alone (no torch work beyond the census). Constants are this trainer's own
# buffers; figures the code does not bound (allocator slack) come from benchmarks/lifecycle_scale.py.

RUNTIME_HOST_BYTES = 512 * 2**20
"""Host bytes a trainer process holds before any phase (torch, the process group, the imports): measured about
400 MiB per rank on CPU gloo runs (benchmarks/lifecycle_scale.py's ``runtime``), rounded up. Device runtimes (CANN,
CUDA) add their own host memory, which is not planned."""
SLICE_BYTES_PER_ELEMENT = 16
"""Host bytes per element of the largest box the sliced HF load holds at once: the stored slice, its fp32
dequantised value and the dequantiser's fp32 temporaries (measured 73 MiB over the model for a 4.2 Mi-element
largest tensor at world 1, 38 MiB at world 2: benchmarks/lifecycle_scale.py)."""
EXPORT_CHUNK_BYTES = 64 * 2**20
"""The distributed HF export's chunk (trex.trainer.hf_export.save_hf_distributed's chunk_bytes)."""
HASH_BLOCK_BYTES = 16 * 2**20
"""The checkpoint's hashing block (trex.trainer.checkpoint.BLOCK)."""
GATHERED_DIGEST_BYTES = 96
"""One file digest or 16 MiB block digest as ``all_gather_object`` carries it (hex sha256 + name, pickled): the
checkpoint's manifest gathers every rank's (trex.trainer.checkpoint._gather)."""
GATHERED_BOX_BYTES = 64
"""One tensor's shard box (offset and shape tuples, pickled) in the export's all-gather of every rank's boxes
(trex.trainer.hf_export.gather_holders)."""
CHECKPOINT_EXTRA_BYTES = 2**20
"""extra-<rank>.pt (data position, RNG, routing state), .metadata and the manifest: under 1 MiB per rank for the
models measured (0.5 MiB at world 1)."""
_FP8_BLOCK, _FP4_BLOCK = 128, 32
Quant = Literal["none", "fp8", "fp8-fp4"]


@dataclass(frozen=True)
class PhasePlan:
    """One phase of a run on its most loaded rank."""

    name: str
    """load, step, checkpoint, resume, export or rollout."""
    host_bytes: int
    """Peak host memory of the rank in this phase (the runtime constant included)."""
    read_bytes: int
    """Bytes the rank reads from disk in the phase (per step for ``step``)."""
    written_bytes: int
    """Bytes the rank writes to disk in the phase."""
    note: str
    """What the figures count."""


@dataclass(frozen=True)
class LifecyclePlan:
    """Every phase of a run, per rank, and the host memory one rank may use."""

    phases: tuple[PhasePlan, ...]
    host_capacity: int | None
    """Host bytes per rank (the pod's resources.limits.memory / ranks per pod; None: not checked)."""

    @property
    def peak(self) -> PhasePlan:
        """The phase with the largest host memory."""
        return max(self.phases, key=lambda p: p.host_bytes)

    @property
    def fits(self) -> bool | None:
        """Every phase's host memory within host_capacity (None when it is unknown)."""
        return None if self.host_capacity is None else self.peak.host_bytes <= self.host_capacity


def _stored_kind(p: ParamInfo, quant: Quant) -> str | None:
    """How the HF export (and DeepSeek's release) stores parameter ``p`` under ``quant``: 'fp8', 'fp4' or None
    (full precision). The export's own rule (trex.trainer.quant_io.quant_kind) on the model's names, which are
    V4's: a DeepSeek-V3 shape stores its MTP e_proj / h_proj as one full-precision eh_proj, planned here as FP8
    (2 x D x D elements per MTP module off). The routed expert stacks are FP4 under fp8-fp4."""
    from trex.trainer.quant_io import quant_kind

    if quant == "none":
        return None
    if p.placement == "experts":
        return "fp4" if quant == "fp8-fp4" else "fp8"
    return quant_kind(p.name, len(p.shape), True, False)


def stored_bytes(shape: tuple[int, ...], kind: str | None, elem: int) -> int:
    """Bytes a tensor of ``shape`` takes stored as ``kind`` (values and scales); ``elem``: full-precision bytes."""
    n = math.prod(shape)
    if kind is None:
        return n * elem
    lead, rows, cols = math.prod(shape[:-2]), shape[-2], shape[-1]
    if kind == "fp4":
        return n // 2 + lead * rows * _ceil(cols, _FP4_BLOCK) * 4
    return n + lead * _ceil(rows, _FP8_BLOCK) * _ceil(cols, _FP8_BLOCK) * 4


def _widened(size: int, piece: int, block: int) -> int:
    """The most a piece of ``piece`` elements of a dim of ``size`` reads when widened to whole ``block``s: pieces
    start at multiples of ``piece`` (tp / ep splits then FSDP chunks), the worst over them."""
    if piece >= size or block == 1:
        return piece
    worst = 0
    for start in range(0, size, piece):
        stop = min(start + piece, size)
        worst = max(worst, min(size, -(-stop // block) * block) - start // block * block)
        if worst >= min(size, _ceil(piece, block) * block + block):
            break
    return worst


def _read_box(p: ParamInfo, lay: Layout, kind: str | None) -> tuple[int, ...]:
    """The box the sliced load reads for ``p`` on the most loaded rank: the local shard, widened to whole scale
    blocks (FP8 128 x 128 over the last two dims, FP4 1 x 32 over the last) where a split cuts them."""
    box = list(local_shape(p, lay))
    if kind is None or len(box) < 2:
        return tuple(box)
    blocks = (_FP8_BLOCK, _FP8_BLOCK) if kind == "fp8" else (1, _FP4_BLOCK)
    for d, blk in zip((len(box) - 2, len(box) - 1), blocks, strict=True):
        box[d] = _widened(p.shape[d], box[d], blk)
    return tuple(box)


def export_outputs(params: Iterable[ParamInfo], quant: Quant, elem: int) -> list[int]:
    """Bytes of each output tensor of the HF export under ``quant`` (``elem``: bytes of the model dtype): one per
    parameter, one per expert of a routed expert stack."""
    out: list[int] = []
    for p in params:
        kind = _stored_kind(p, quant)
        if p.placement == "experts":
            out += [stored_bytes(p.shape[1:], kind, elem)] * p.shape[0]
        else:
            out.append(stored_bytes(p.shape, kind, elem))
    return out


def export_rank_bytes(sizes: Iterable[int], world: int) -> int:
    """Bytes the most loaded rank writes when every output goes to the least loaded of the ranks that hold equal
    parts of it, largest first (trex.trainer.hf_export.plan_outputs' owner rule when FSDP splits every tensor
    evenly; tp and ep splits hand outputs to their holders, which spreads them the same way)."""
    import heapq

    ranks = [(0, r) for r in range(world)]
    for n in sorted(sizes, reverse=True):
        load, r = heapq.heappop(ranks)
        heapq.heappush(ranks, (load + n, r))
    return max(load for load, _ in ranks)


def lifecycle_phases(params: tuple[ParamInfo, ...], lay: Layout, mem: MemoryPlan, *, mode: str, model_dtype: str,
                     export_quant: Quant, source: Quant | None, load: bool, export: bool,
                     tokens_per_step: int, token_bytes: int) -> tuple[PhasePlan, ...]:
    """Host memory and disk bytes per phase on the most loaded rank, from the local shard shapes and the device
    plan ``mem`` (pure arithmetic):

    * load (initFromHf / modelFrom, sliced): the rank reads its local boxes of the folder (``source``; None: not
      known here, planned as unquantised in the model dtype, an upper bound) and holds one box at a time;
    * step: with optimizer.swap the fp32 masters and optimizer states live in host memory; reads one step's
      token windows from the token store;
    * checkpoint (DCP save): writes its shards of parameters and optimizer states plus extra-<rank>.pt, stages
      one tensor at a time on the host, then reads them back once to hash them;
    * resume: reads its shards and verifies them (a second read, widened to 16 MiB hashing blocks);
    * export (distributed HF export): writes the outputs it owns (the export under checkpoint.exportQuant
      balanced over the ranks by bytes, :func:`export_rank_bytes`), one 64 MiB chunk and its quantised form at a
      time;
    * rollout: the in-process decoding replica (grpo, opd) lives on the device (the device plan); none for the
      other modes.

    On a cpu device the device plan is host memory too: its persistent part is in every phase and its step
    transients in the step."""
    elem = _DTYPE_BYTES[model_dtype]
    on_host = mem.device.device_type == "cpu"
    swap_host = (mem.masters + mem.muon_state + mem.adamw_state) if mem.swap else 0
    resident = RUNTIME_HOST_BYTES + swap_host + (mem.persistent if on_host else 0)
    local = [math.prod(local_shape(p, lay)) for p in params]
    largest_local = max(local, default=0)
    store = mem.params // max(sum(local), 1)  # bytes per stored parameter element (fp32 masters when sharded)
    out: list[PhasePlan] = []
    if load:
        src = source or "none"
        boxes = [(math.prod(_read_box(p, lay, k)), stored_bytes(_read_box(p, lay, k), k, elem))
                 for p in params for k in [_stored_kind(p, src)]]
        buffer = max((n * SLICE_BYTES_PER_ELEMENT + b for n, b in boxes), default=0)
        what = f"folder {src}" + ("" if source else " assumed (unknown here: an upper bound)")
        out.append(PhasePlan("load", resident + buffer, sum(b for _, b in boxes), 0,
                             f"local boxes of the HF folder ({what}); one box buffer {gib(buffer)}"))
    step_host = resident + (mem.total - mem.persistent if on_host else 0) + mem.offloaded
    host_note = "swap: fp32 masters + optimizer states in host memory" if mem.swap else "no host-side state"
    if mem.offloaded:
        host_note += f"; offloaded block inputs {gib(mem.offloaded)}"
    out.append(PhasePlan("step", step_host, tokens_per_step * token_bytes, 0,
                         f"{host_note}; reads one step's token windows"))
    shards = mem.params + mem.muon_state + mem.adamw_state
    staging = largest_local * store + HASH_BLOCK_BYTES
    digests = lay.world * (-(-shards // HASH_BLOCK_BYTES) + 2) * GATHERED_DIGEST_BYTES  # every rank's, on every rank
    out.append(PhasePlan("checkpoint", resident + staging + digests, shards, shards + CHECKPOINT_EXTRA_BYTES,
                         "DCP shards (parameters + optimizer states) + extra-<rank>.pt; read back once to hash; "
                         f"every rank's digests gathered ({gib(digests)})"))
    out.append(PhasePlan("resume", resident + staging, 2 * shards + 4 * HASH_BLOCK_BYTES, 0,
                         "its DCP shards, and again to verify them (16 MiB hashing blocks)"))
    if export:
        sizes = export_outputs(params, export_quant, elem)
        total, written = sum(sizes), export_rank_bytes(sizes, lay.world)
        held = lay.world * len(params) * GATHERED_BOX_BYTES  # every rank's shard boxes, on every rank
        out.append(PhasePlan("export", resident + 2 * EXPORT_CHUNK_BYTES + held, 0, written,
                             f"its outputs of the {gib(total)} export (exportQuant {export_quant}); one 64 MiB chunk; "
                             f"every rank's shard boxes gathered ({gib(held)})"))
    if mode in ("grpo", "opd"):
        out.append(PhasePlan("rollout", resident, 0, 0,
                             "in-process decoding replica on the device (device plan); no host copy"))
    else:
        out.append(PhasePlan("rollout", resident, 0, 0, f"none (mode {mode})"))
    return tuple(out)


def plan_lifecycle(cfg: TrainerConfig, world: int, mem: MemoryPlan, host_capacity: int | None = None,
                   source: Quant | None = None, load: bool | None = None) -> LifecyclePlan:
    """The lifecycle plan of ``cfg`` on ``world`` ranks next to its device plan ``mem``; ``host_capacity``: host
    bytes per rank (pod memory / ranks per pod); ``source``: how the initFromHf folder is stored, when known;
    ``load``: the run starts from a Hugging Face folder (default: checkpoint.initFromHf is set; a TrainJob's
    modelFrom sets it when the job is rendered)."""
    values: dict[str, Any] = resolved_model_values(cfg.model)
    c = census(values)
    lay = Layout.of(cfg, world)
    seq = max([cfg.data.seq_len, *(s.seq_len for s in cfg.data.seq_len_curriculum)])
    per_rank = _ceil(cfg.data.global_batch_size, lay.dp) * (seq + 1)
    token_bytes = (2 if int(values["vocab_size"]) <= 1 << 16 else 4) + (cfg.mode == "sft")  # sft: the loss mask
    starts = cfg.checkpoint.init_from_hf is not None if load is None else load
    phases = lifecycle_phases(
        c.params, lay, mem, mode=cfg.mode, model_dtype=cfg.model.dtype, export_quant=cfg.checkpoint.export_quant,
        source=source, load=starts, export=cfg.checkpoint.export_hf, tokens_per_step=per_rank,
        token_bytes=token_bytes)
    return LifecyclePlan(phases, host_capacity)
