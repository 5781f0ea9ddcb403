"""Mixture of experts: router (V3 sigmoid / V4 sqrt-softplus, group-limited, hash), grouped experts, MoE FFN."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from trex.trainer.model.args import ModelArgs
from trex.trainer.model.layers import MLP, TUNED, local_tensor, swiglu, upcast


def router_scores(logits: torch.Tensor, scoring: str) -> torch.Tensor:
    """Affinity scores: sigmoid (DeepSeek-V3) or sqrt(softplus(x)) (DeepSeek-V4)."""
    if scoring == "sigmoid":
        return logits.sigmoid()
    if scoring == "sqrt-softplus":
        return F.softplus(logits).sqrt()
    raise ValueError(f"scoring must be 'sigmoid' or 'sqrt-softplus', got {scoring!r}")


def select_experts(biased: torch.Tensor, k: int, n_groups: int = 1, topk_groups: int = 1) -> torch.Tensor:
    """Top-k expert indices [N, k] from biased scores [N, E], optionally group-limited (DeepSeek-V3:
    a group's score is the sum of its top-2 biased scores; only the best `topk_groups` groups compete)."""
    if n_groups > 1:
        n, e = biased.shape
        grouped = biased.view(n, n_groups, e // n_groups)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, group_scores.topk(topk_groups, dim=-1).indices, True)
        biased = biased.masked_fill(~keep[:, :, None].expand_as(grouped).reshape(n, e), float("-inf"))
    return biased.topk(k, dim=-1).indices


def hash_table(vocab_size: int, n_experts: int, k: int, seed: int, chunk: int = 8192) -> torch.Tensor:
    """Fixed token-id -> k distinct experts table [V, k], deterministic from `seed` (V4 hash routing)."""
    gen = torch.Generator().manual_seed(seed)
    parts = [torch.rand(min(chunk, vocab_size - i), n_experts, generator=gen, device="cpu").topk(k, dim=-1).indices
             for i in range(0, vocab_size, chunk)]
    return torch.cat(parts).long()


def sequence_balance_loss(scores: torch.Tensor, indices: torch.Tensor, n_experts: int) -> torch.Tensor:
    """DeepSeek-V3 sequence-wise balance loss, unweighted: mean over rows of sum_i f_i P_i with
    f_i = E/(k T) * (tokens of the row routed to i) and P_i = mean_t s_{t,i} / sum_j s_{t,j}.
    scores [B, T, E], indices [B, T, k]."""
    b, t, k = indices.shape
    counts = torch.zeros(b, n_experts, device=scores.device, dtype=scores.dtype)
    counts.scatter_add_(1, indices.reshape(b, t * k), torch.ones(b, t * k, device=scores.device, dtype=scores.dtype))
    f = counts * (n_experts / (k * t))
    p = (scores / scores.sum(-1, keepdim=True)).mean(1)
    return (f * p).sum(-1).mean()


class Gate(nn.Module):
    """Router: scores from `weight`, top-k on score + `e_score_correction_bias` (a buffer: selection only),
    weights = unbiased scores at the chosen experts, renormalised and scaled. Hash-routed gates take the
    indices from a fixed token-id table instead."""

    e_score_correction_bias: torch.Tensor
    tid2eid: torch.Tensor

    def __init__(self, args: ModelArgs, hash_routed: bool = False, seed: int = 0, layer: int = 0) -> None:
        super().__init__()
        self.n_experts = args.n_routed_experts
        self.k = args.experts_per_token
        self.scoring = args.scoring
        self.n_groups = args.n_groups
        self.topk_groups = args.topk_groups
        self.scale = args.routed_scaling_factor
        self.norm_topk_prob = args.norm_topk_prob
        self.hash_routed = hash_routed
        self.weight = nn.Parameter(torch.empty(self.n_experts, args.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(self.n_experts, dtype=torch.float32))
        self.anticipatory_weight: torch.Tensor | None = None
        self.vocab_size = args.vocab_size
        self.hash_seed = seed * 1_000_003 + layer
        if hash_routed:
            dev = self.weight.device
            if dev.type == "meta":
                table = torch.empty(args.vocab_size, self.k, dtype=torch.long, device=dev)
            else:
                table = self.hash_table().to(dev)
            self.register_buffer("tid2eid", table)

    def hash_table(self) -> torch.Tensor:
        """This router's fixed token-id -> experts table (on the host)."""
        return hash_table(self.vocab_size, self.n_experts, self.k, self.hash_seed)

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [N, D], token_ids [N] -> (weights [N, k], indices [N, k], scores [N, E])."""
        xf = upcast(x)
        logits = F.linear(xf, self.weight.to(xf.dtype))
        scores = router_scores(logits, self.scoring)
        tuned = TUNED.get("router")
        if tuned is not None and not self.hash_routed and self.anticipatory_weight is None and self.n_groups == 1 \
                and self.norm_topk_prob \
                and (out := tuned(logits, self.e_score_correction_bias, self.k, self.scoring)) is not None:
            w, indices = cast("tuple[torch.Tensor, torch.Tensor]", out)
            return w * self.scale, indices, scores
        with torch.no_grad():
            if self.hash_routed:
                indices = self.tid2eid[token_ids].long()
            else:
                choice = scores
                if self.anticipatory_weight is not None:
                    old = self.anticipatory_weight.to(device=x.device, dtype=xf.dtype)
                    choice = router_scores(F.linear(xf, old), self.scoring)
                indices = select_experts(choice + self.e_score_correction_bias, self.k, self.n_groups, self.topk_groups)
        w = scores.gather(1, indices)
        if self.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return w * self.scale, indices, scores


def _grouped_mm_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    """torch._grouped_mm needs 16-byte aligned rows; on CUDA it runs bf16 on sm90+ (H100/H200); eager only."""
    if not hasattr(torch, "_grouped_mm") or x.dtype != w.dtype or x.dtype == torch.float64:
        return False  # no float64 kernel: the per-expert loop keeps a float64 model float64
    if torch.compiler.is_compiling():
        return False  # the CPU fp32 _grouped_mm kernel has no meta/fake implementation to trace
    size = x.element_size()
    if (w.shape[1] * size) % 16 or (w.shape[2] * size) % 16:
        return False
    if x.device.type == "cuda":
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (9, 0)
    return x.device.type == "cpu"


def _autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The autocast dtype when autocast is on for x's device and x is floating point, else None."""
    kind = x.device.type
    if not x.is_floating_point() or not torch.is_autocast_enabled(kind):
        return None
    return torch.get_autocast_dtype(kind)


def grouped_linear(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Rows of `x` sorted by expert, `counts[e]` rows for expert e; returns x_e @ w[e].T stacked.
    w is [E, out, in]. Uses the tuned grouped GEMM, else torch._grouped_mm when it applies, else a loop over experts."""
    tuned = TUNED.get("grouped_gemm")
    if tuned is not None and (out := tuned(x, w, counts)) is not None:
        return out
    if _grouped_mm_ok(x, w):
        offs = counts.cumsum(0).to(torch.int32)
        y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        if y.requires_grad:
            y.register_hook(lambda g: g.contiguous())  # type: ignore[no-untyped-call]
        return y
    outs = []
    start = 0
    for e, n in enumerate(counts.tolist()):
        if n:
            outs.append(x[start:start + n] @ w[e].t())
            start += n
    if not outs:  # no rows: an empty product that still carries the autograd graph to x and w
        return x[:0] @ w[0].t()
    return torch.cat(outs)


CPU_GROUP_ROWS = 32
"""On CPU, bf16/fp16 expert GEMMs get every expert's row count padded up to a multiple of this. The CPU
library behind them (oneDNN) builds and caches one kernel per shape, and routing gives each expert a new
row count every micro-batch: bucketed counts hit that cache (about 25 % off a small-cpu bf16
forward+backward) for at most 31 zero rows per expert. fp32 GEMMs (no per-shape build) are not padded."""


def bucketed_rows(counts: torch.Tensor, tok: torch.Tensor, n_tokens: int,
                  multiple: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad each expert's group of rows (``counts``, rows in expert order reading tokens ``tok``) to a
    multiple of ``multiple``: returns (padded counts, source token per padded row with ``n_tokens`` for a
    padding row, positions of the real rows among the padded ones, in their original order)."""
    padded = (counts + multiple - 1) // multiple * multiple
    expert = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
    keep = torch.arange(tok.numel(), device=tok.device) + (padded.cumsum(0) - padded - counts.cumsum(0) + counts)[expert]
    src = torch.full((int(padded.sum()),), n_tokens, dtype=tok.dtype, device=tok.device)
    src[keep] = tok
    return padded, src, keep


Compute = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""compute(rows sorted by local expert, counts per local expert) -> expert outputs for those rows."""
Dispatch = Callable[[torch.Tensor, torch.Tensor, Compute], torch.Tensor]
"""dispatch(rows sorted by expert, counts per expert, compute) -> outputs in the same row order."""


class GroupedExperts(nn.Module):
    """Routed experts stored stacked: gate_proj/up_proj [E, I, D], down_proj [E, D, I].

    ``dispatch`` (None: every expert is local) routes the expert-sorted rows to the ranks that hold
    their experts and back; the parallel layer sets it for expert parallelism."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        e, d, i = args.n_routed_experts, args.hidden_size, args.moe_intermediate_size
        self.n_experts = e
        self.limit = args.swiglu_limit
        self.qat = args.qat == "fp4-experts"
        self.gate_proj = nn.Parameter(torch.empty(e, i, d))
        self.up_proj = nn.Parameter(torch.empty(e, i, d))
        self.down_proj = nn.Parameter(torch.empty(e, d, i))
        self.dispatch: Dispatch | None = None

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gate, up, down) as the GEMMs read them: this rank's experts of the parameters, or their FP4
        fake-quantized forms (straight-through gradients) under ``qat: fp4-experts``."""
        gate, up, down = (local_tensor(w) for w in (self.gate_proj, self.up_proj, self.down_proj))
        if not self.qat:
            return gate, up, down
        from trex.trainer.model.quant import fp4_fake_quant

        return fp4_fake_quant(gate), fp4_fake_quant(up), fp4_fake_quant(down)

    def forward(self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, D], indices/weights [N, k] -> sum_k weights * expert_k(x): [N, D]."""
        k = indices.shape[1]
        flat = indices.reshape(-1)
        order = flat.argsort(stable=True)
        tok = order // k
        counts = torch.bincount(flat, minlength=self.n_experts)
        dt = _autocast_dtype(x)
        if dt is not None:  # autocast does not cover the grouped GEMM: cast like it casts F.linear
            x = x.to(dt)
        xs = x[tok]
        y = self.compute(xs, counts) if self.dispatch is None else self.dispatch(xs, counts, self.compute)
        y = y * weights.reshape(-1)[order, None].to(y.dtype)
        return x.new_zeros(x.shape).index_add(0, tok, y.to(x.dtype))

    def compute(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """SwiGLU experts on rows sorted by (local) expert, ``counts[e]`` rows for local expert e."""
        gate_w, up_w, down_w = self.weights()
        if xs.dtype != gate_w.dtype:  # under autocast: cast the weights like autocast casts F.linear's
            gate_w, up_w, down_w = gate_w.to(xs.dtype), up_w.to(xs.dtype), down_w.to(xs.dtype)
        keep = None
        if xs.device.type == "cpu" and xs.dtype in (torch.bfloat16, torch.float16) and CPU_GROUP_ROWS > 1:
            n = xs.shape[0]
            counts, src, keep = bucketed_rows(counts, torch.arange(n, device=xs.device), n, CPU_GROUP_ROWS)
            xs = torch.cat([xs, xs.new_zeros(1, xs.shape[1])])[src]  # padding rows read a zero row
        h = swiglu(grouped_linear(xs, gate_w, counts), grouped_linear(xs, up_w, counts), self.limit)
        y = grouped_linear(h, down_w, counts)
        return y[keep] if keep is not None else y


class MoE(nn.Module):
    """Shared expert(s) + routed experts. Returns output, sequence balance loss and per-expert counts."""

    def __init__(self, args: ModelArgs, hash_routed: bool = False, seed: int = 0, layer: int = 0) -> None:
        super().__init__()
        self.gate = Gate(args, hash_routed=hash_routed, seed=seed, layer=layer)
        self.experts = GroupedExperts(args)
        self.shared_experts = (
            MLP(args.hidden_size, args.moe_intermediate_size * args.n_shared_experts,
                limit=args.swiglu_limit if args.attention == "csa" else 0.0)
            if args.n_shared_experts > 0 else None
        )
        self.balance_loss: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] = sequence_balance_loss
        """sequence_balance_loss, or a context-parallel rank's share of it (trex.trainer.parallel.context)."""

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, D], token_ids [B, T] -> (y [B, T, D], balance loss scalar, counts [E] long)."""
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        w, idx, scores = self.gate(flat, token_ids.reshape(-1))
        y = self.experts(flat, idx, w).view(b, t, d)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        n_e = self.gate.n_experts
        balance = self.balance_loss(scores.view(b, t, n_e), idx.view(b, t, -1), n_e)
        counts = torch.bincount(idx.reshape(-1), minlength=n_e)
        return y, balance, counts
