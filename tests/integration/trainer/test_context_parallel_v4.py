"""Context parallelism on DeepSeek-V4 attention against one process, float64, spawn + gloo.

The model has a csa and an hca layer and a sliding-window MTP block (every V4 attention kind), mHC, a hash-routed
layer and the sequence-balance loss, with an indexer top-k of 2 and sequences of 36 tokens (cp2: chunks of 9, so
4-token CSA windows and 8-token HCA windows are cut by chunk boundaries).

- The trainer on packed documents: losses and every parameter after 3 optimizer steps equal the single-process
  run to 1e-10 at cp2 and cp2 x ep2; the batches put document boundaries inside and across chunks, compression
  windows across chunk boundaries, and more visible compressed entries than the indexer keeps.
- One forward and backward with hand-placed document boundaries (on a chunk edge, inside a chunk, a document
  from the head chunk into the tail chunk): trunk and MTP outputs, the indexer loss and every parameter gradient
  equal one process to 1e-12.
- The plan's cp term for V4 (what a rank saves of the other ranks' chunks) against the storages autograd saves on
  each cp2 rank beyond one process holding the same number of tokens.
- Validate accepts V4 attention under cp and still refuses the sampling modes with one line.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_context_parallel import saved_bytes
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer

STEPS = 3
SEQ = 36
ACT_SEQ = 256
TOP_K = 2
WORLD2 = {"cp2": {"cp": 2}}
WORLD4 = {"cp2xep2": {"cp": 2, "ep": 2}}


def _corpus(path: Path) -> Path:
    """Documents of 3 to 30 words: several per 36-token row, some long enough for many compressed entries."""
    rng = random.Random(11)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
    lines = [json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(3, 30)))})
             for _ in range(300)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _cfg(ckpt: Path, layout: dict[str, Any], data: Path | None, seq: int = SEQ) -> TrainerConfig:
    return load_section(TrainerConfig, {
        "model": {"preset": "tiny", "dtype": "fp64", "overrides": {
            "attention": "csa", "hcMult": 2, "mtpDepth": 1, "numLayers": 2, "nDenseLayers": 0, "nHashLayers": 1,
            "qLoraRank": 16, "vHeadDim": 24, "csaTopK": TOP_K, "layerTypes": ["csa", "hca"]}},
        "maxSteps": STEPS, "parallelism": layout,
        "data": {"seqLen": seq, "microBatchSize": 2, "globalBatchSize": 4,
                 **({"train": str(data), "tokenizer": {"vocabSize": 300}} if data is not None else {})},
        "optimizer": {"schedule": {"warmupSteps": 1}, "adamw": {"eps": 1e-8}},
        "routing": {"biasUpdateSpeed": 0.01, "sequenceBalanceWeight": 0.01},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(ckpt), "intervalSteps": 100, "exportHf": False},
    })


def _run(cfg: TrainerConfig, out: Path, group: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
    tr = Trainer(cfg, out, group=group, measure_peak=False, log=lambda _m: None)
    res = tr.run(STEPS)
    return [r.loss for r in res.history], tr.full_state_dict()


# --- one forward and backward with hand-placed document boundaries --------------------------------------------
def _hand_batch() -> dict[str, torch.Tensor]:
    """Two rows of 36 tokens (chunks of 9 at cp2: rank 0 holds 0-8 and 27-35, rank 1 holds 9-26)."""
    from trex.trainer.model.layers import positions_from_docs

    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 512, (2, SEQ), generator=gen)
    doc_ids = torch.tensor([[0] * 9 + [1] * 13 + [2] * 14,  # boundary on a chunk edge (9) and inside one (22)
                            [0] * 3 + [1] * 31 + [2] * 2])  # doc 1 runs from the head chunk into the tail chunk
    return {"input_ids": ids, "doc_ids": doc_ids, "position_ids": positions_from_docs(doc_ids)}


def _forward(model: Any, batch: dict[str, torch.Tensor], probe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of a probe of the final and the MTP module's hidden states plus the balance and indexer losses;
    returns both hidden states side by side, and the indexer loss."""
    out = model(batch["input_ids"], batch["position_ids"], batch["doc_ids"], logits=False)
    ((out.hidden * probe).sum() + (out.mtp_hidden[0] * probe.flip(-1)).sum() + 0.1 * out.balance_loss
     + out.indexer_loss).backward()
    return torch.cat([out.hidden, out.mtp_hidden[0]], dim=-1).detach(), out.indexer_loss.detach()


def _model() -> Any:
    from trex.trainer.model.model import build_model

    return build_model(_cfg(Path("unused"), {}, None).model, seed=5)


def _probe() -> torch.Tensor:
    return torch.randn(2, SEQ, 64, generator=torch.Generator().manual_seed(4), dtype=torch.float64)


def _hand_forward(rank: int, out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from trex.trainer.parallel.context import chunk_indices, install, split_batch

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
    model = _model()
    install(model, mesh.get_group(), 2, rank)
    idx = chunk_indices(SEQ, 2, rank)
    hidden, indexer = _forward(model, split_batch(_hand_batch(), 2, rank), _probe()[:, idx])
    dist.all_reduce(indexer)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    for g in grads.values():
        dist.all_reduce(g)
    torch.save({"hidden": hidden, "indexer": indexer, "idx": idx, "grads": grads}, out / f"hand-{rank}.pt")


# --- workers -------------------------------------------------------------------------------------------------
def _worker(rank: int, world: int, out: str, layouts: dict[str, dict[str, Any]]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous-{world}", rank=rank, world_size=world)
    try:
        root = Path(out)
        if world == 2:
            _hand_forward(rank, root)
            (root / f"saved-cp2-{rank}.json").write_text(json.dumps(
                saved_bytes(_cfg(Path("unused"), {}, None, ACT_SEQ), ACT_SEQ, 2, 2, rank, dist.group.WORLD, backward=True)))
        for name, layout in layouts.items():
            losses, state = _run(_cfg(root / name, layout, root / "corpus.jsonl"), root, dist.group.WORLD)
            if rank == 0:
                (root / f"{name}.json").write_text(json.dumps(losses))
                torch.save(state, root / f"{name}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cpv4")
    _corpus(out / "corpus.jsonl")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(2, str(out), WORLD2), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    mp.spawn(_worker, args=(4, str(out), WORLD4), nprocs=4, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return out


@pytest.fixture(scope="module")
def reference(runs: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("single")
    return _run(_cfg(tmp / "ckpt", {}, runs / "corpus.jsonl"), tmp, None)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [*WORLD2, *WORLD4])
def test_v4_cp_layout_matches_single_process(layout: str, runs: Path,
                                             reference: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    ref_losses, ref_state = reference
    losses = json.loads((runs / f"{layout}.json").read_text())
    assert len(losses) == STEPS
    assert losses == pytest.approx(ref_losses, abs=1e-10, rel=0)
    state = torch.load(runs / f"{layout}.pt")
    assert sorted(state) == sorted(ref_state)
    assert any(".compressor.indexer." in k for k in state) and any("hc" in k for k in state)
    for key, want in ref_state.items():
        assert float((state[key].double() - want.double()).abs().max()) < 1e-10, key


@pytest.mark.slow
def test_v4_batches_cut_windows_and_documents_at_chunk_boundaries(runs: Path, tmp_path: Path) -> None:
    """The training batches put document boundaries inside chunks and documents across chunk boundaries, CSA and
    HCA windows across chunk boundaries, and more visible CSA entries than the indexer's top-k."""
    from trex.trainer.data.build import build_data
    from trex.trainer.model.v4attention import windows

    cfg = _cfg(tmp_path, {}, runs / "corpus.jsonl")
    args = cfg.model.args
    _, loader, _ = build_data(cfg.data, tmp_path / "tokenizer", args.vocab_size)
    batch = loader.next_batch(2, SEQ, 0, 1)
    docs, pos = batch["doc_ids"], batch["position_ids"]
    chunk = SEQ // 4  # cp2: 4 chunks
    starts = (docs[:, 1:] != docs[:, :-1]).nonzero()[:, 1] + 1
    assert any(int(s) % chunk for s in starts)  # a boundary inside a chunk
    spans = [(docs[r] == d).nonzero().flatten() for r in range(2) for d in docs[r].unique()]
    assert any(int(s[0]) // chunk != int(s[-1]) // chunk for s in spans)  # a document across a chunk boundary
    for every in (args.csa_compress_every, args.hca_compress_every):
        win = windows(pos, docs, every)
        cut = [(r, int(w)) for r in range(2) for w in win.seg[r].unique()
               if len({int(i) // chunk for i in (win.seg[r] == w).nonzero().flatten()}) > 1
               and int((win.seg[r] == w).sum()) == every]
        assert cut, every  # a complete compression window whose tokens lie in two chunks
    csa = windows(pos, docs, args.csa_compress_every)
    visible = csa.visible(pos, docs, args.csa_compress_every).sum(-1)
    assert int(visible.max()) > TOP_K  # the indexer drops visible entries


@pytest.mark.slow
def test_v4_hand_placed_boundaries_forward_and_backward_match_one_process(runs: Path) -> None:
    model = _model()
    hidden, indexer = _forward(model, _hand_batch(), _probe())
    want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert any(".compressor.indexer." in n for n in want) and float(indexer) > 0
    for rank in (0, 1):
        got = torch.load(runs / f"hand-{rank}.pt")
        assert float((got["hidden"] - hidden[:, got["idx"]]).abs().max()) < 1e-12
        assert abs(float(got["indexer"] - indexer)) < 1e-12
        assert sorted(got["grads"]) == sorted(want)
        for name, g in want.items():
            assert float((got["grads"][name] - g).abs().max()) < 1e-12, name


def test_validate_accepts_v4_under_cp_and_still_refuses_grpo_with_one_line() -> None:
    from trex.trainer.rules import job_problems

    cfg = _cfg(Path("unused"), {"cp": 2}, None)
    assert job_problems(cfg, 2) == []
    grpo = cfg.model_copy(update={"mode": "grpo"})
    hits = [p for p in job_problems(grpo, 2) if p[0] == "parallelism.cp"]
    assert len(hits) == 1 and "mode grpo" in hits[0][1] and "\n" not in hits[0][1], hits


@pytest.mark.slow
def test_v4_activation_plan_counts_what_a_cp_rank_keeps_of_the_other_chunks(runs: Path) -> None:
    """cp2 rank by rank: saved bytes, with the backward's recomputed block of attention probabilities, minus those
    of one process on the rank's ACT_SEQ / 2 tokens (what the rank keeps of the other chunks: gathered entries,
    pooling over them, masks over all keys, the indexer's scores over the whole sequences' entries, probabilities
    over the halo and those entries) against the plan's cp term, within 10 %."""
    from trex.trainer.config import resolved_model_values
    from trex.trainer.plan import Layout, activation_bytes, context_activation_bytes

    torch.set_num_threads(1)
    cfg = _cfg(Path("unused"), {}, None, ACT_SEQ)
    values, lay = resolved_model_values(cfg.model), Layout(1, 1, 1, 1, 1, 1)
    local = saved_bytes(cfg, ACT_SEQ // 2, 2, backward=True)
    planned = (context_activation_bytes(values, lay, 2, ACT_SEQ, 8, attention_probs=True, cp=2)
               - activation_bytes(values, lay, 2, ACT_SEQ // 2, 8, attention_probs=True))
    for rank in (0, 1):
        extra = json.loads((runs / f"saved-cp2-{rank}.json").read_text()) - local
        assert extra > 0 and 0.9 <= planned / extra <= 1.1, (rank, planned, extra)
