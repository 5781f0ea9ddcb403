"""DeepSeek-V4's lightning indexer where it really selects (index_topk well below the visible compressed
entries): logits and loss against transformers' DeepseekV4ForCausalLM (fp32 and float64, both
directions), packed documents against separate runs, exact score ties against a float64 reference of
the release's selection, and the released MTP layout against a reference built from transformers'
decoder layer.

The release (DeepSeek's inference/model.py, vLLM's deepseek_v4) scores compressed entry s for query t as
sum_h w_h(t) relu(q_h(t) . k_s) / sqrt(index_head_dim), w = weights_proj(x) / sqrt(index_n_heads), masks
the entries whose window the query has not finished ((s + 1) m > t + 1) and keeps torch.topk of the rest.
trex, transformers and the release agree on all of it; they differ only where scores tie exactly
(ReLU makes every head's term 0 for an entry all heads score negative, so with few index heads whole
rows tie at 0): torch.topk leaves the order of equal values unspecified (it differs by device and row
length), and trex resolves a tie to the later window. The tie test pins that rule against a reference
written here; the other tests assert that no tie reaches the top-k boundary, so they compare selection.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.hf_float64 import hf_float64
from trex.trainer.config import RoutingConfig
from trex.trainer.hf import load_hf, save_hf
from trex.trainer.model import ModelArgs, build_model_from_args, compute_loss

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as hf_v4  # noqa: E402

T = 37
VOCAB = 64
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
CSA, HCA, SLIDING = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
BASE: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, head_dim=16, partial_rotary_factor=0.25,
    q_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, o_groups=2,
    o_lora_rank=8, index_head_dim=8, sliding_window=6, hc_mult=4, num_nextn_predict_layers=1,
    scoring_func="sqrtsoftplus", swiglu_limit=10.0,
)
# every config keeps index_topk well below the entries a late query sees (T // m = 18, 9 or 12)
CONFIGS: dict[str, dict[str, Any]] = {
    "csa-m2": dict(layer_types=[CSA, CSA], csa=2, hca=4, index_topk=3, index_n_heads=8, n_hash=0),
    "csa-m4": dict(layer_types=[CSA, CSA], csa=4, hca=8, index_topk=2, index_n_heads=8, n_hash=0),
    "mixed-hash": dict(layer_types=[SLIDING, CSA, HCA, CSA], csa=3, hca=8, index_topk=3, index_n_heads=6,
                       n_hash=2),
}


def _hf_config(name: str, **over: Any) -> Any:
    c = {**CONFIGS[name], **over}
    n = len(c["layer_types"])
    return transformers.DeepseekV4Config(
        **BASE, num_hidden_layers=n, layer_types=c["layer_types"], index_topk=c["index_topk"],
        index_n_heads=c["index_n_heads"],
        compress_rates={CSA: c["csa"], HCA: c["hca"]},
        mlp_layer_types=["hash_moe"] * c["n_hash"] + ["moe"] * (n - c["n_hash"]))


def _hf_model(cfg: Any, dtype: torch.dtype, seed: int) -> Any:
    """transformers' model with every weight drawn from N(0, 0.08) (the hash tables: distinct experts)."""
    torch.manual_seed(seed)
    hf = transformers.DeepseekV4ForCausalLM(cfg).to(dtype).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, p in sorted(hf.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * 0.08)
        for name, buf in hf.named_buffers():
            if name.endswith("tid2eid"):
                buf.copy_(torch.rand(buf.shape[0], 4, generator=gen).argsort(-1)[:, :2])
    hf.config._experts_implementation = "eager"  # the grouped-GEMM path has no float64 kernel
    return hf


def _ids(b: int = 2, t: int = T, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


@contextmanager
def _captured_scores() -> Iterator[list[tuple[torch.Tensor, int, int]]]:
    """(index scores [B, T, S], compress rate, top-k) of every indexer call inside the block."""
    seen: list[tuple[torch.Tensor, int, int]] = []
    orig = hf_v4.DeepseekV4Indexer.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        hook = self.scorer.register_forward_hook(
            lambda _m, _i, out: seen.append((out.detach().double(), self.compress_rate, self.index_topk)))
        try:
            return orig(self, *args, **kwargs)
        finally:
            hook.remove()

    hf_v4.DeepseekV4Indexer.forward = forward
    try:
        yield seen
    finally:
        hf_v4.DeepseekV4Indexer.forward = orig


def _visible_rows(scores: torch.Tensor, m: int) -> Iterator[list[float]]:
    """Per query, the scores of the compressed entries it may see (window complete: (s + 1) m <= t + 1)."""
    b, t, s = scores.shape
    for row in range(b):
        for q in range(t):
            yield scores[row, q, : min(s, (q + 1) // m)].tolist()


def _selection_stats(seen: list[tuple[torch.Tensor, int, int]]) -> tuple[int, int]:
    """(queries whose top-k is a strict subset of their visible entries, of those the ones with an exact tie
    at the top-k boundary)."""
    strict = ties = 0
    for scores, m, k in seen:
        for vis in _visible_rows(scores, m):
            if len(vis) > k:
                strict += 1
                ordered = sorted(vis, reverse=True)
                ties += ordered[k - 1] == ordered[k]
    return strict, ties


def _hf_out(hf: Any, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
    with torch.no_grad(), hf_float64():
        out = hf(input_ids=ids, labels=ids)
    return out.logits, out.loss.item()


def _our_out(model: Any, ids: torch.Tensor, doc_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    with torch.no_grad():
        out = model(ids, doc_ids=doc_ids)
        _, parts = compute_loss(out, labels, None, RoutingConfig(), step=0)
    return out.logits, parts["lm"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_selecting_indexer_transformers_to_trex(tmp_path: Path, name: str, dtype: torch.dtype) -> None:
    hf = _hf_model(_hf_config(name), dtype, seed=11)
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path, dtype=dtype).eval()
    ids = _ids()
    with _captured_scores() as seen:
        ref, ref_loss = _hf_out(hf, ids)
    strict, ties = _selection_stats(seen)
    assert strict > 20 and ties == 0  # the indexer chooses, and no tie decides what
    mine, loss = _our_out(ours, ids)
    assert ref.abs().max() > 0.1
    assert (mine - ref).abs().max().item() < TOL[dtype]
    assert abs(loss - ref_loss) < TOL[dtype]


def _our_args(name: str, **over: Any) -> ModelArgs:
    c = {**CONFIGS[name], **over}
    kinds = {CSA: "csa", HCA: "hca", SLIDING: "sliding"}
    return ModelArgs(
        attention="csa", vocab_size=VOCAB, hidden_size=32, num_heads=4, q_lora_rank=16, qk_nope_head_dim=12,
        qk_rope_head_dim=4, v_head_dim=16, hc_mult=4, csa_compress_every=c["csa"], hca_compress_every=c["hca"],
        csa_top_k=c["index_topk"], csa_window=6, csa_indexer_heads=c["index_n_heads"], csa_indexer_dim=8,
        scoring="sqrt-softplus", n_routed_experts=4, experts_per_token=2, moe_intermediate_size=16, o_groups=2,
        o_lora_rank=8, routed_scaling_factor=1.5, swiglu_limit=10.0, init_std=0.08, n_dense_layers=0,
        n_shared_experts=1, mtp_depth=1, num_layers=len(c["layer_types"]),
        layer_types=[kinds[k] for k in c["layer_types"]], n_hash_layers=c["n_hash"])


@torch.no_grad()
def _perturb_constants(model: Any, seed: int) -> None:
    """Non-trivial values for what initialises to constants (sinks, biases, mHC gates, norm scales)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(dict(model.named_parameters()).items()):
        if any(s in name for s in ("sinks", "position_bias", "base", "scale", "norm", "bias")):
            p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * 0.3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_selecting_indexer_trex_to_transformers(tmp_path: Path, name: str, dtype: torch.dtype) -> None:
    from helpers.hf_float64 import from_pretrained_float64

    ours = build_model_from_args(_our_args(name), dtype=dtype, seed=5).eval()
    _perturb_constants(ours, seed=6)
    save_hf(ours, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["index_topk"] == CONFIGS[name]["index_topk"]
    cls = transformers.AutoModelForCausalLM
    hf = (from_pretrained_float64(cls, tmp_path) if dtype == torch.float64
          else cls.from_pretrained(tmp_path, dtype=dtype)).eval()
    hf.config._experts_implementation = "eager"
    ids = _ids(seed=3)
    with _captured_scores() as seen:
        ref, ref_loss = _hf_out(hf, ids)
    strict, ties = _selection_stats(seen)
    assert strict > 20 and ties == 0
    mine, loss = _our_out(ours, ids)
    assert ref.abs().max() > 0.1
    assert (mine - ref).abs().max().item() < TOL[dtype]
    assert abs(loss - ref_loss) < TOL[dtype]


def test_packed_documents_select_as_they_would_alone(tmp_path: Path) -> None:
    hf = _hf_model(_hf_config("mixed-hash"), torch.float64, seed=21)
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path, dtype=torch.float64).eval()
    a, b = _ids(1, 23, seed=4), _ids(1, 29, seed=5)
    with _captured_scores() as seen:
        ref_a, _ = _hf_out(hf, a)
        ref_b, _ = _hf_out(hf, b)
    strict, ties = _selection_stats(seen)
    assert strict > 10 and ties == 0
    packed = torch.cat([a, b], dim=1)
    docs = torch.cat([torch.zeros(1, 23, dtype=torch.long), torch.ones(1, 29, dtype=torch.long)], dim=1)
    mine, _ = _our_out(ours, packed, doc_ids=docs)
    assert (mine[:, :23] - ref_a).abs().max().item() < 1e-10
    assert (mine[:, 23:] - ref_b).abs().max().item() < 1e-10


def _reference_top_k(self: torch.Tensor, k: int, dim: int = -1, **_: Any) -> Any:
    """torch.topk over the last dim with exact ties resolved to the later entry, row by row in Python."""
    assert dim in (-1, self.dim() - 1)
    flat = self.reshape(-1, self.shape[-1]).tolist()
    picks = [sorted(range(len(row)), key=lambda s, row=row: (row[s], s), reverse=True)[:k] for row in flat]
    idx = torch.tensor(picks, dtype=torch.long).reshape(*self.shape[:-1], k)
    return torch.return_types.topk((self.gather(-1, idx), idx))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("heads", [1, 2])
def test_exact_score_ties_go_to_the_later_window(tmp_path: Path, heads: int, dtype: torch.dtype) -> None:
    """Few index heads: many entries score exactly 0; trex keeps the later ones (the release leaves it to
    torch.topk). The reference is transformers' model with its top-k replaced by the rule above."""
    hf = _hf_model(_hf_config("csa-m2", index_n_heads=heads), dtype, seed=31)
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path, dtype=dtype).eval()
    ids = _ids(seed=6)
    orig_topk = torch.Tensor.topk
    with _captured_scores() as seen:
        orig_forward = hf_v4.DeepseekV4Indexer.forward

        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            torch.Tensor.topk = _reference_top_k  # type: ignore[method-assign,assignment]
            try:
                return orig_forward(self, *args, **kwargs)
            finally:
                torch.Tensor.topk = orig_topk  # type: ignore[method-assign]

        hf_v4.DeepseekV4Indexer.forward = forward
        try:
            ref, ref_loss = _hf_out(hf, ids)
        finally:
            hf_v4.DeepseekV4Indexer.forward = orig_forward
    _, ties = _selection_stats(seen)
    assert ties > 5  # ties decide the selection here
    mine, loss = _our_out(ours, ids)
    assert (mine - ref).abs().max().item() < TOL[dtype]
    assert abs(loss - ref_loss) < TOL[dtype]


# The released MTP layout (DeepSeek's MTPBlock; vLLM's DeepSeekV4 MTP loader reads the same names): the
# block's tensors directly under mtp.0. as in a trunk block, plus e_proj / h_proj / enorm / hnorm / norm /
# hc_head_*. Written here from transformers' names, independently of trex's own name mapping.
_RELEASE_BLOCK = {
    "self_attn.q_a_proj.weight": "attn.wq_a.weight", "self_attn.q_a_norm.weight": "attn.q_norm.weight",
    "self_attn.q_b_proj.weight": "attn.wq_b.weight", "self_attn.kv_proj.weight": "attn.wkv.weight",
    "self_attn.kv_norm.weight": "attn.kv_norm.weight", "self_attn.o_a_proj.weight": "attn.wo_a.weight",
    "self_attn.o_b_proj.weight": "attn.wo_b.weight", "self_attn.sinks": "attn.attn_sink",
    "mlp.gate.weight": "ffn.gate.weight", "mlp.gate.e_score_correction_bias": "ffn.gate.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn.shared_experts.w1.weight",
    "mlp.shared_experts.down_proj.weight": "ffn.shared_experts.w2.weight",
    "mlp.shared_experts.up_proj.weight": "ffn.shared_experts.w3.weight",
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "attn_hc.fn": "hc_attn_fn", "attn_hc.base": "hc_attn_base", "attn_hc.scale": "hc_attn_scale",
    "ffn_hc.fn": "hc_ffn_fn", "ffn_hc.base": "hc_ffn_base", "ffn_hc.scale": "hc_ffn_scale",
}
_RELEASE_TOP = {"model.norm.weight": "norm.weight", "model.hc_head.hc_fn": "hc_head_fn",
                "model.hc_head.hc_base": "hc_head_base", "model.hc_head.hc_scale": "hc_head_scale"}


def _release_mtp_tensors(block_model: Any, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """mtp.0.* tensors in the release's names: the one-layer transformers model's layer 0 as the MTP block,
    its final norm and hc head as the MTP module's, plus the input projections and norms."""
    out = {f"mtp.0.{k}": v.contiguous() for k, v in extra.items()}
    for name, t in block_model.state_dict().items():
        if name in _RELEASE_TOP:
            out[f"mtp.0.{_RELEASE_TOP[name]}"] = t.contiguous()
        elif name.startswith("model.layers.0."):
            rest = name.removeprefix("model.layers.0.")
            if rest == "mlp.experts.gate_up_proj":
                gate, up = t.chunk(2, dim=1)
                for e in range(t.shape[0]):
                    out[f"mtp.0.ffn.experts.{e}.w1.weight"] = gate[e].contiguous()
                    out[f"mtp.0.ffn.experts.{e}.w3.weight"] = up[e].contiguous()
            elif rest == "mlp.experts.down_proj":
                for e in range(t.shape[0]):
                    out[f"mtp.0.ffn.experts.{e}.w2.weight"] = t[e].contiguous()
            else:
                out[f"mtp.0.{_RELEASE_BLOCK[rest]}"] = t.contiguous()
    return out


def test_mtp_block_in_the_released_layout_loads_and_predicts(tmp_path: Path) -> None:
    """An MTP block written in the release's names loads, and trex's MTP logits equal a float64 reference:
    transformers' decoder layer run on h_proj(hnorm(x_s)) + e_proj(enorm(emb(next token))) for every
    mHC stream x_s of the trunk's pre-head residual, then its hc head, norm and the shared output head."""
    from safetensors.torch import load_file, save_file

    dtype = torch.float64
    trunk = _hf_model(_hf_config("mixed-hash"), dtype, seed=41)
    block_cfg = _hf_config("mixed-hash", layer_types=[SLIDING], n_hash=0)
    block = _hf_model(block_cfg, dtype, seed=42)
    with torch.no_grad():
        block.lm_head.weight.copy_(trunk.lm_head.weight)  # the MTP module shares the output head
    gen = torch.Generator().manual_seed(43)
    d = BASE["hidden_size"]
    extra = {"e_proj.weight": torch.randn(d, d, generator=gen, dtype=dtype) * 0.2,
             "h_proj.weight": torch.randn(d, d, generator=gen, dtype=dtype) * 0.2,
             "enorm.weight": 1 + 0.3 * torch.randn(d, generator=gen, dtype=dtype),
             "hnorm.weight": 1 + 0.3 * torch.randn(d, generator=gen, dtype=dtype)}
    trunk.save_pretrained(tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    save_file({**stored, **_release_mtp_tensors(block, extra)}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    ours = load_hf(tmp_path, dtype=dtype).eval()

    ids = _ids(seed=8)
    streams: list[torch.Tensor] = []
    grab = trunk.model.hc_head.register_forward_pre_hook(lambda _m, args: streams.append(args[0]))
    with torch.no_grad(), hf_float64():
        trunk(input_ids=ids)
    grab.remove()
    shifted = torch.zeros_like(ids)
    shifted[:, :-1] = ids[:, 1:]

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    emb = trunk.model.embed_tokens.weight[shifted]
    mtp_in = (rms(streams[0], extra["hnorm.weight"]) @ extra["h_proj.weight"].T
              + (rms(emb, extra["enorm.weight"]) @ extra["e_proj.weight"].T)[:, :, None, :])
    swap = block.model.layers[0].register_forward_pre_hook(lambda _m, args: (mtp_in, *args[1:]))
    with torch.no_grad(), hf_float64():
        ref = block(input_ids=shifted).logits
    swap.remove()
    with torch.no_grad():
        out = ours(ids)
    assert len(out.mtp_logits) == 1 and ref.abs().max() > 0.1
    assert (out.mtp_logits[0] - ref).abs().max().item() < 1e-10
    with torch.no_grad(), hf_float64():
        assert (out.logits - trunk(input_ids=ids).logits).abs().max().item() < 1e-10


def _csa_layer() -> tuple[Any, torch.Tensor, Any]:
    """A tiny float64 csa attention layer (top-2 of up to 6 entries), its input and context."""
    from trex.trainer.model.context import AttnContext
    from trex.trainer.model.layers import rope_cos_sin
    from trex.trainer.model.v4attention import V4Attention

    args = ModelArgs(attention="csa", vocab_size=VOCAB, hidden_size=12, num_heads=2, q_lora_rank=8,
                     qk_nope_head_dim=6, qk_rope_head_dim=2, v_head_dim=8, csa_compress_every=2, csa_top_k=2,
                     csa_window=3, csa_indexer_heads=3, csa_indexer_dim=4, o_groups=1, o_lora_rank=4,
                     num_layers=1, layer_types=["csa"], mtp_depth=0)
    layer = V4Attention(args, "csa").double()
    gen = torch.Generator().manual_seed(51)
    with torch.no_grad():
        for _, p in sorted(layer.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.4 + (1.0 if "norm" in _ else 0.0))
    x = torch.randn(1, 13, 12, generator=gen, dtype=torch.float64)
    pos = torch.arange(13)[None]
    cos, sin = rope_cos_sin(pos, 2, args.rope_theta, dtype=torch.float64)
    return layer, x, AttnContext(position_ids=pos, doc_ids=None, cos=cos, sin=sin)


def test_indexer_gradients_against_finite_differences() -> None:
    """float64 gradcheck of the two indexer paths: its KL loss in the indexer's own weights (the only ones it
    trains), and the attention output through the selected set in the input and the main weights (the
    selection itself is piecewise constant; no entry sits within the step of the top-k boundary)."""
    from torch.func import functional_call

    layer, x, ctx = _csa_layer()
    params = dict(layer.named_parameters())
    idx_names = sorted(n for n in params if ".indexer." in n)
    main_names = ["kv_proj.weight", "compressor.gate_proj.weight"]
    indexer = layer.compressor.indexer
    with torch.no_grad():  # the selection must be decided by a margin, and be a strict subset
        scores = indexer.scores(x, layer.project(x, ctx)[0], ctx, *_windows_of(layer, ctx))
        strict = 0
        for vis in _visible_rows(scores, 2):
            if len(vis) > 2:
                strict += 1
                ordered = sorted(vis, reverse=True)
                assert ordered[1] - ordered[2] > 1e-4
        assert strict >= 4

    def kl(*ws: torch.Tensor) -> torch.Tensor:
        return functional_call(layer, {**params, **dict(zip(idx_names, ws, strict=True))}, (x, ctx))[1]

    def out(xx: torch.Tensor, *ws: torch.Tensor) -> torch.Tensor:
        return functional_call(layer, {**params, **dict(zip(main_names, ws, strict=True))}, (xx, ctx))[0]

    idx_w = tuple(params[n].detach().clone().requires_grad_() for n in idx_names)
    main_w = tuple(params[n].detach().clone().requires_grad_() for n in main_names)
    assert kl(*idx_w).item() > 1e-3
    assert torch.autograd.gradcheck(kl, idx_w, eps=1e-6, atol=1e-8, rtol=1e-6)
    assert torch.autograd.gradcheck(out, (x.clone().requires_grad_(), *main_w), eps=1e-6, atol=1e-8, rtol=1e-6,
                                    fast_mode=True)
    # the KL trains the indexer only; the output does not reach the indexer's weights
    loss_kl, output = layer(x.requires_grad_(), ctx)[::-1]
    grads = torch.autograd.grad(loss_kl, [params[n] for n in main_names] + [x], allow_unused=True)
    assert all(g is None or g.abs().max() == 0 for g in grads)
    grads = torch.autograd.grad(output.sum(), [params[n] for n in idx_names], allow_unused=True)
    assert all(g is None or g.abs().max() == 0 for g in grads)


def _windows_of(layer: Any, ctx: Any) -> tuple[Any, torch.Tensor]:
    from trex.trainer.model.v4attention import windows

    doc = torch.zeros_like(ctx.position_ids)
    return windows(ctx.position_ids, doc, layer.compressor.every), doc
