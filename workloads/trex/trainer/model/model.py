"""DeepSeekModel: embedding -> blocks (attention + dense/MoE FFN, plain or mHC residual) -> norm -> head, plus MTP."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from trex.trainer.model.args import ModelArgs
from trex.trainer.model.attention import build_attention
from trex.trainer.model.context import AttentionCache, AttnContext, SequenceKeys
from trex.trainer.model.hc import HyperConnection, HyperHead
from trex.trainer.model.init import Init, constant, explicit, fill, normal
from trex.trainer.model.layers import MLP, RMSNorm, positions_from_docs, rope_cos_sin, upcast
from trex.trainer.model.moe import Gate, GroupedExperts, MoE
from trex.trainer.model.v4attention import Pool, V4Attention

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from trex.trainer.config import ModelConfig

Role = Literal["muon", "adamw"]


@dataclass
class ModelOutput:
    """Everything one forward returns.

    logits [B, T, V]; mtp_logits[k] [B, T, V] predicts token t + 1 + (k + 1) at position t;
    balance_loss: sequence balance loss summed over MoE layers (unweighted); expert_counts
    [n_moe_layers, E] long (trunk MoE layers, then one per MTP module); indexer_loss: csa indexer
    KL summed over layers (zero for mla); doc_ids: the forward's doc_ids (the loss keeps MTP
    targets inside documents).
    """

    logits: torch.Tensor | None
    mtp_logits: list[torch.Tensor]
    balance_loss: torch.Tensor
    expert_counts: torch.Tensor
    indexer_loss: torch.Tensor
    doc_ids: torch.Tensor | None = field(default=None)
    hidden: torch.Tensor | None = field(default=None)
    """With ``logits=False``: the final normed hidden [B, T, D] the head would read (logits are None)."""
    mtp_hidden: list[torch.Tensor] = field(default_factory=list)
    """With ``logits=False``: each MTP module's normed hidden (mtp_logits is empty)."""
    head_weight: torch.Tensor | None = field(default=None)
    """With ``logits=False``: the output head's weight [V, D], for a fused head + cross-entropy."""


@dataclass
class _Acc:
    """Per-forward accumulators of auxiliary outputs."""

    balance: list[torch.Tensor] = field(default_factory=list)
    counts: list[torch.Tensor] = field(default_factory=list)
    indexer: list[torch.Tensor] = field(default_factory=list)

    def block(self, out: BlockOutput) -> torch.Tensor:
        """Collect one block's auxiliary outputs; returns its hidden states."""
        x, indexer, balance, counts = out
        self.indexer.append(indexer)
        if balance is not None and counts is not None:
            self.balance.append(balance)
            self.counts.append(counts)
        return x


BlockOutput = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]
"""(hidden, indexer loss, balance loss or None, expert counts or None): a block returns its auxiliary
outputs rather than storing them aside, so everything the loss uses flows out of the block's forward
(wrappers such as FSDP2 hook the backward of a module's outputs)."""


class Block(nn.Module):
    """Pre-norm transformer block; residual is plain (hc_mult = 1) or mHC over hc_mult streams."""

    def __init__(self, args: ModelArgs, moe: bool, hash_routed: bool = False, seed: int = 0,
                 layer: int = 0) -> None:
        super().__init__()
        v4 = args.attention == "csa"
        self.input_layernorm = RMSNorm(args.hidden_size, args.norm_eps, scale_in_fp32=v4)
        self.self_attn = build_attention(args, layer)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.norm_eps, scale_in_fp32=v4)
        self.mlp: MoE | MLP = (
            MoE(args, hash_routed=hash_routed, seed=seed, layer=layer) if moe
            else MLP(args.hidden_size, args.intermediate_size)
        )
        self.hc = args.hc_mult
        if self.hc > 1:
            self.hc_attn = HyperConnection(self.hc, args.hidden_size, args.sinkhorn_iters, args.norm_eps, args.hc_eps)
            self.hc_ffn = HyperConnection(self.hc, args.hidden_size, args.sinkhorn_iters, args.norm_eps, args.hc_eps)

    def _ffn(self, h: torch.Tensor, token_ids: torch.Tensor, acc: _Acc) -> torch.Tensor:
        y: torch.Tensor
        if isinstance(self.mlp, MoE):
            y, balance, counts = self.mlp(h, token_ids)
            acc.balance.append(balance)
            acc.counts.append(counts)
            return y
        y = self.mlp(h)
        return y

    def _attn(self, h: torch.Tensor, ctx: AttnContext, acc: _Acc) -> torch.Tensor:
        y: torch.Tensor
        y, aux = self.self_attn(h, ctx)
        acc.indexer.append(aux)
        return y

    def forward(self, x: torch.Tensor, ctx: AttnContext, token_ids: torch.Tensor) -> BlockOutput:
        """x: [B, T, D] (hc_mult = 1) or [B, T, n, D] streams."""
        acc = _Acc()
        if self.hc == 1:
            x = x + self._attn(self.input_layernorm(x), ctx, acc)
            x = x + self._ffn(self.post_attention_layernorm(x), token_ids, acc)
        else:
            pre, post, res = self.hc_attn.mappings(x)
            y = self._attn(self.input_layernorm(self.hc_attn.read(x, pre)), ctx, acc)
            x = self.hc_attn.write(x, y, post, res)
            pre, post, res = self.hc_ffn.mappings(x)
            y = self._ffn(self.post_attention_layernorm(self.hc_ffn.read(x, pre)), token_ids, acc)
            x = self.hc_ffn.write(x, y, post, res)
        return (x, acc.indexer[0], acc.balance[0] if acc.balance else None,
                acc.counts[0] if acc.counts else None)


def _to_streams(h: torch.Tensor, n: int) -> torch.Tensor:
    return h if n == 1 else h[:, :, None, :].expand(-1, -1, n, -1).contiguous()


class MTPModule(nn.Module):
    """Multi-token prediction module; shares the embedding and output head with the trunk.

    DeepSeek-V3 (mla): eh_proj([hnorm(h); enorm(emb)]) -> block -> norm, h the previous depth's hidden.
    DeepSeek-V4 (csa): the released layout (e_proj, h_proj, hc_head_*): every mHC stream s of the previous
    depth's pre-head residual becomes h_proj(hnorm(x_s)) + e_proj(enorm(emb)), runs through the block, and
    norm(hc_head(streams)) feeds the head; the next depth reads the streams."""

    def __init__(self, args: ModelArgs, seed: int, layer: int) -> None:
        super().__init__()
        d = args.hidden_size
        self.v4 = args.attention == "csa"
        self.hnorm = RMSNorm(d, args.norm_eps, scale_in_fp32=self.v4)
        self.enorm = RMSNorm(d, args.norm_eps, scale_in_fp32=self.v4)
        if self.v4:
            self.e_proj = nn.Linear(d, d, bias=False)
            self.h_proj = nn.Linear(d, d, bias=False)
        else:
            self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.block = Block(args, moe=True, seed=seed, layer=layer)
        self.hc_head = HyperHead(args.hc_mult, d, args.norm_eps, args.hc_eps) if args.hc_mult > 1 else None
        self.norm = RMSNorm(d, args.norm_eps, scale_in_fp32=self.v4)

    def forward(self, h: torch.Tensor, emb: torch.Tensor, ctx: AttnContext, token_ids: torch.Tensor,
                acc: _Acc) -> tuple[torch.Tensor, torch.Tensor]:
        """h: the previous depth's streams [B, T, n, D] (V4; [B, T, D] without mHC) or its hidden [B, T, D]
        (V3); emb: embedding of the shifted tokens. Returns (what the next depth reads, hidden [B, T, D])."""
        n = self.block.hc
        if self.v4:
            e = self.e_proj(self.enorm(emb))
            x = self.h_proj(self.hnorm(h)) + (e[:, :, None, :] if n > 1 else e)
        else:
            x = _to_streams(self.eh_proj(torch.cat([self.hnorm(h), self.enorm(emb)], dim=-1)), n)
        x = acc.block(self.block(x, ctx, token_ids))
        out: torch.Tensor = self.hc_head(x) if self.hc_head is not None else x
        return (x if self.v4 else out), out


class DeepSeekModel(nn.Module):
    """DeepSeek-V3/V4-style MoE language model."""

    def __init__(self, args: ModelArgs, seed: int = 0) -> None:
        super().__init__()
        self.args = args
        d = args.hidden_size
        self.embed_tokens = nn.Embedding(args.vocab_size, d)
        self.layers = nn.ModuleList()
        for i in range(args.num_layers):
            moe_index = i - args.n_dense_layers
            self.layers.append(Block(args, moe=moe_index >= 0, hash_routed=0 <= moe_index < args.n_hash_layers,
                                     seed=seed, layer=i))
        self.hc_head = HyperHead(args.hc_mult, d, args.norm_eps, args.hc_eps) if args.hc_mult > 1 else None
        self.norm = RMSNorm(d, args.norm_eps, scale_in_fp32=args.attention == "csa")
        self.lm_head = nn.Linear(d, args.vocab_size, bias=False)
        self.mtp = nn.ModuleList(MTPModule(args, seed, args.num_layers + k) for k in range(args.mtp_depth))
        self.keys = SequenceKeys()
        """Which keys the attention layers' queries see (trex.trainer.parallel.context gathers them under cp)."""

    # --- initialisation ------------------------------------------------------------------
    def init_spec(self) -> dict[str, Init]:
        """How every parameter and buffer starts: Normal(0, init_std) GEMM/embedding weights, unit norms,
        mHC near a plain residual, zero sinks, biases and position biases, the hash routers' fixed tables.
        Values depend on (seed, name, index) only (trex.trainer.model.init), never on a layout."""
        std = normal(self.args.init_std)
        spec: dict[str, Init] = {}
        for mod_name, mod in self.named_modules():
            here: dict[str, Init] = {}
            if isinstance(mod, nn.Linear | nn.Embedding | Gate):
                here["weight"] = std
            if isinstance(mod, GroupedExperts):
                here.update(gate_proj=std, up_proj=std, down_proj=std)
            if isinstance(mod, Gate):
                here["e_score_correction_bias"] = constant(0.0)
                if mod.hash_routed:
                    here["tid2eid"] = explicit(mod.hash_table)
            if isinstance(mod, RMSNorm):
                here["weight"] = constant(1.0)
            if isinstance(mod, HyperConnection | HyperHead):
                here.update(fn=std, scale=constant(0.01), base=explicit(mod.static_base))
            if isinstance(mod, V4Attention):
                here["sinks"] = constant(0.0)
            if isinstance(mod, Pool):
                here["position_bias"] = constant(0.0)
            spec.update({f"{mod_name}.{k}" if mod_name else k: v for k, v in here.items()})
        tensors = [n for n, _ in self.named_parameters()] + [n for n, _ in self.named_buffers()]
        missing = sorted(set(tensors) - set(spec))
        if missing:
            raise ValueError(f"no initial value for {missing[:5]}")
        return {n: spec[n] for n in tensors}

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Write init_spec's values for ``seed`` into every (plain, materialised) tensor; no-op on meta."""
        if self.embed_tokens.weight.device.type == "meta":
            return
        tensors = dict(self.named_parameters()) | dict(self.named_buffers())
        for name, init in self.init_spec().items():
            fill(tensors[name], init, name, seed)

    # --- forward -------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                doc_ids: torch.Tensor | None = None, logits: bool = True,
                cache: AttentionCache | None = None, mtp: bool = True) -> ModelOutput:
        """input_ids [B, T] -> ModelOutput. doc_ids [B, T] isolates packed documents; position_ids
        default to positions restarting per document (plain 0..T-1 without doc_ids). ``logits=False``
        skips the output head and returns the normed hidden states instead, so the loss can fuse the
        head with the cross-entropy and never hold [B, T, V] logits. ``cache`` (decoding): the tokens
        continue each row of the cache, every attention layer reads and extends it, and the MTP
        modules are skipped (they do not change the trunk's logits). ``mtp=False`` skips them too, for
        losses that read the trunk only (GRPO): their expert-count rows are zeros (no bias moves)."""
        b, t = input_ids.shape
        if cache is not None:
            position_ids = cache.positions(t)
        elif position_ids is None:
            position_ids = (positions_from_docs(doc_ids) if doc_ids is not None
                            else torch.arange(t, device=input_ids.device).expand(b, t))
        rope_dtype = torch.float64 if self.embed_tokens.weight.dtype == torch.float64 else torch.float32
        cos, sin = rope_cos_sin(position_ids, self.args.qk_rope_head_dim, self.args.rope_theta, dtype=rope_dtype)
        mask = self.keys.mask(doc_ids, b, t, input_ids.device) if self.args.attention == "mla" else None
        ctx = AttnContext(position_ids=position_ids, doc_ids=doc_ids, cos=cos, sin=sin, mask=mask, cache=cache,
                          gather=self.keys.gather, keys=self.keys)
        ctx.ropes[(self.args.rope_theta, self.args.qk_rope_head_dim)] = (cos, sin)
        acc = _Acc()
        n = self.args.hc_mult
        x = _to_streams(self.embed_tokens(input_ids), n)
        for layer in self.layers:
            x = acc.block(layer(x, ctx, input_ids))
        h = self.hc_head(x) if self.hc_head is not None else x
        hidden = self.norm(h)
        mtp_hidden = []
        if cache is not None:
            cache.advance(t)
        prev = x if self.args.attention == "csa" else h  # V4's MTP reads the trunk's streams, V3's its hidden
        for k, mod in enumerate(self.mtp if cache is None and mtp else []):
            assert isinstance(mod, MTPModule)
            shifted = self.keys.shift(input_ids, k + 1)
            prev, h = mod(prev, self.embed_tokens(shifted), ctx, shifted, acc)
            mtp_hidden.append(mod.norm(h))
        zero = upcast(hidden.new_zeros(()))
        if cache is None and not mtp and acc.counts:
            skipped = self.args.n_moe_layers - len(acc.counts)
            acc.counts += [torch.zeros_like(acc.counts[0]) for _ in range(skipped)]
        return ModelOutput(
            logits=self.lm_head(hidden) if logits else None,
            mtp_logits=[self.lm_head(m) for m in mtp_hidden] if logits else [],
            balance_loss=torch.stack(acc.balance).sum() if acc.balance else zero,
            expert_counts=(torch.stack(acc.counts) if acc.counts
                           else torch.zeros(0, self.args.n_routed_experts, dtype=torch.long, device=hidden.device)),
            indexer_loss=upcast(torch.stack(acc.indexer)).sum() if acc.indexer else zero,
            doc_ids=doc_ids,
            hidden=None if logits else hidden,
            mtp_hidden=[] if logits else mtp_hidden,
            head_weight=None if logits else self.lm_head.weight,
        )

    # --- hooks used by the training loop ------------------------------------------------
    def moe_gates(self) -> list[tuple[str, Gate]]:
        """Routers in expert_counts row order (trunk MoE layers, then MTP blocks), with module names."""
        return [(name, mod) for name, mod in self.named_modules() if isinstance(mod, Gate)]

    def set_anticipatory_router_weights(self, weights: dict[str, torch.Tensor] | None) -> None:
        """While set, each named gate picks its top-k indices with the given (older) weight; routing
        weights still come from the current weight. Keys: gate names from moe_gates() (a trailing
        '.weight' is accepted). None restores normal routing for every gate."""
        gates = dict(self.moe_gates())
        for gate in gates.values():
            gate.anticipatory_weight = None
        if weights is None:
            return
        for key, value in weights.items():
            name = key.removesuffix(".weight")
            if name not in gates:
                raise ValueError(f"unknown router {key!r}; routers: {', '.join(gates)}")
            gate = gates[name]
            if tuple(value.shape) != tuple(gate.weight.shape):
                raise ValueError(f"router {key!r}: weight shape {tuple(value.shape)} != {tuple(gate.weight.shape)}")
            gate.anticipatory_weight = value.detach()

    def param_roles(self) -> dict[str, Role]:
        """Optimizer of every trainable parameter: GEMM weights (2-D, stacked 3-D experts, routers,
        mHC projections) -> muon; embedding, output head, norms, mHC static gates/biases, attention
        sinks, compressor position biases, 1-D -> adamw."""
        roles: dict[str, Role] = {}
        for mod_name, mod in self.named_modules():
            for p_name, p in mod.named_parameters(recurse=False):
                if not p.requires_grad:
                    continue
                full = f"{mod_name}.{p_name}" if mod_name else p_name
                muon = (
                    (isinstance(mod, nn.Linear) and mod is not self.lm_head)
                    or isinstance(mod, GroupedExperts)
                    or (isinstance(mod, Gate) and p_name == "weight")
                    or (isinstance(mod, HyperConnection | HyperHead) and p_name == "fn")
                )
                roles[full] = "muon" if muon and p.dim() >= 2 else "adamw"
        return roles


def blocks(model: DeepSeekModel) -> list[Block]:
    """Every transformer block: the trunk's, then each MTP module's."""
    out = [b for b in model.layers if isinstance(b, Block)]
    out += [m.block for m in model.mtp if isinstance(m, MTPModule)]
    return out


def update_expert_bias(model: DeepSeekModel, expert_counts: torch.Tensor, speed: float,
                       group: ProcessGroup | None = None) -> None:
    """Aux-loss-free balancing: bias += speed * sign(mean load - load) per gate, from the counts
    (summed over `group` when given). Hash-routed gates are skipped (their bias never selects)."""
    counts = expert_counts.detach().to(torch.float32).clone()
    if group is not None:
        import torch.distributed as dist

        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
    gates = model.moe_gates()
    if counts.shape[0] != len(gates):
        raise ValueError(f"expert_counts has {counts.shape[0]} rows but the model has {len(gates)} MoE layers")
    for row, (_, gate) in zip(counts, gates, strict=True):
        if gate.hash_routed:
            continue
        bias = gate.e_score_correction_bias
        bias.add_((torch.sign(row.mean() - row) * speed).to(bias.device))


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}


def build_model(model_cfg: ModelConfig, device: torch.device | str | None = None,
                dtype: torch.dtype | None = None, seed: int = 0) -> DeepSeekModel:
    """Instantiate and initialise (seeded) on `device`; on "meta" nothing is materialised."""
    args = ModelArgs.from_config(model_cfg)
    return build_model_from_args(args, device=device, dtype=dtype or _DTYPES[model_cfg.dtype], seed=seed)


def build_model_from_args(args: ModelArgs, device: torch.device | str | None = None,
                          dtype: torch.dtype = torch.float32, seed: int = 0) -> DeepSeekModel:
    """build_model for an explicit ModelArgs (tests, HF import)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    with dev:
        model = DeepSeekModel(args, seed=seed)
    model.to(dtype)
    for _, gate in model.moe_gates():
        gate.e_score_correction_bias.data = gate.e_score_correction_bias.data.float()
    model.init_weights(seed)  # after the cast: values are drawn in the tensors' own dtypes (as on meta)
    return model
