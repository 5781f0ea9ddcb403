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
