"""What DeepSeek-V4 attention exchanges under context parallelism, float64, spawn + gloo.

Every V4 layer sends, in the forward, only the halo its chunks need (the csa_window - 1 tokens before each chunk
for the shared key/value entries, 2 x csa_compress_every - 1 or hca_compress_every - 1 for the pooling's
features) and the compressed entries of the complete windows whose last token another rank holds. The bytes are
counted by wrapping the rank's differentiable exchange and compared, call by call, with a count made here from
the global token indices; on one-document rows also with trex.trainer.plan.v4_exchange_bytes. The tiny model's
window (16) reaches past a chunk at cp2 x 36 tokens (chunks of 9) and three chunks back at cp4 x 40 (chunks of
5); both equal one process to 1e-12 (outputs, indexer loss, every gradient). The trainer at cp2 x tp2 (heads split
over tp, entries and halos over cp) equals one process to 1e-10 over 3 steps.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_context_parallel_v4 import STEPS, _cfg, _corpus, _forward, _model, _run

LAYOUTS = {2: 36, 4: 40}  # cp: sequence length


def _batch(seq: int) -> dict[str, torch.Tensor]:
    """Two packed rows: boundaries inside chunks, a document across several chunks, a 2-token document."""
    from trex.trainer.model.layers import positions_from_docs

    i = torch.arange(seq)
    doc_ids = torch.stack([i * 3 // seq, (i >= 3).long() + (i >= seq - 2).long()])
    ids = torch.randint(0, 512, (2, seq), generator=torch.Generator().manual_seed(3))
    return {"input_ids": ids, "doc_ids": doc_ids, "position_ids": positions_from_docs(doc_ids)}


def _probe(seq: int) -> torch.Tensor:
    return torch.randn(2, seq, 64, generator=torch.Generator().manual_seed(4), dtype=torch.float64)


def _trainer_worker(rank: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous-tp", rank=rank, world_size=4)
    try:
        root = Path(out)
        losses, state = _run(_cfg(root / "cp2xtp2", {"cp": 2, "tp": 2}, root / "corpus.jsonl"), root,
                             dist.group.WORLD)
        if rank == 0:
            torch.save((losses, state), root / "cp2xtp2.pt")
    finally:
        dist.destroy_process_group()


def _worker(rank: int, cp: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous-{cp}", rank=rank, world_size=cp)
    try:
        from trex.trainer.parallel.context import GatheredKeys, chunk_indices, install, split_batch

        seq = LAYOUTS[cp]
        model = _model()
        install(model, dist.group.WORLD, cp, rank)
        keys = model.keys
        assert isinstance(keys, GatheredKeys)
        exchange = keys.exchange
        calls: list[int] = []

        def counted(flat: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
            calls.append(sum(out_splits) * flat.element_size())
            return exchange(flat, out_splits, in_splits)

        keys.exchange = counted  # type: ignore[method-assign]
        idx = chunk_indices(seq, cp, rank)
        hidden, indexer = _forward(model, split_batch(_batch(seq), cp, rank), _probe(seq)[:, idx])
        packed = list(calls)
        dist.all_reduce(indexer)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        for g in grads.values():
            dist.all_reduce(g)
        calls.clear()
        one = split_batch({"ids": _batch(seq)["input_ids"], "pos": torch.arange(seq).expand(2, seq)}, cp, rank)
        with torch.no_grad():
            model(one["ids"], one["pos"], None, logits=False)
        torch.save({"hidden": hidden, "indexer": indexer, "idx": idx, "grads": grads}, Path(out) / f"{cp}-{rank}.pt")
        (Path(out) / f"{cp}-{rank}.json").write_text(json.dumps({"packed": packed, "one": list(calls)}))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cpv4halo")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for cp in LAYOUTS:
        mp.spawn(_worker, args=(cp, str(out)), nprocs=cp, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return out


def _expected(args: Any, pos: torch.Tensor, seq: int, cp: int, rank: int) -> list[int]:
    """Bytes rank ``rank`` should receive per exchange (float64): for each layer (csa, hca, the sliding MTP
    block) the halo, then on compressed layers the other ranks' entries. Halo: the tokens some held token reaches
    ``reach`` back that the rank does not hold; entries: tokens ending a complete window (position every - 1
    modulo every) that it does not hold."""
    size = seq // (2 * cp)
    held = {g for k in (rank, 2 * cp - 1 - rank) for g in range(k * size, (k + 1) * size)}

    def halo(reach: int) -> int:
        return len({j for i in held for j in range(max(0, i - reach), i)} - held)

    hd, idx_dim, rows = args.head_dim, args.csa_indexer_dim, pos.shape[0]
    out = []
    for layer in range(args.num_layers + args.mtp_depth):
        kind = args.layer_kind(layer)
        if kind == "sliding":
            out.append(rows * halo(args.csa_window - 1) * hd * 8)
            continue
        every = args.csa_compress_every if kind == "csa" else args.hca_compress_every
        reach = 2 * every - 1 if kind == "csa" else every - 1
        width = 4 * hd + 4 * idx_dim if kind == "csa" else 2 * hd
        out.append(rows * (halo(args.csa_window - 1) * hd + halo(reach) * width) * 8)
        ends = int(sum(int(pos[b, g]) % every == every - 1 for b in range(rows) for g in range(seq) if g not in held))
        out.append(ends * (hd + (idx_dim if kind == "csa" else 0)) * 8)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("cp", list(LAYOUTS))
def test_v4_layers_exchange_the_halo_and_the_entries_only(cp: int, runs: Path) -> None:
    from trex.trainer.config import resolved_model_values
    from trex.trainer.plan import v4_exchange_bytes

    model = _model()
    args, seq = model.args, LAYOUTS[cp]
    assert args.csa_window - 1 > seq // (2 * cp)  # the window's halo reaches past the previous chunk
    kinds = [args.layer_kind(i) for i in range(args.num_layers + args.mtp_depth)]
    assert kinds == ["csa", "hca", "sliding"]
    plan_values = resolved_model_values(_cfg_model())
    pos = _batch(seq)["position_ids"]
    for rank in range(cp):
        got = json.loads((runs / f"{cp}-{rank}.json").read_text())
        assert got["packed"] == _expected(args, pos, seq, cp, rank), rank
        one = got["one"]
        per_layer = [one[0] + one[1], one[2] + one[3], one[4]]
        assert per_layer == [2 * b for b in v4_exchange_bytes(plan_values, seq, cp, 8, rank)], rank
        gathered = 2 * (seq - seq // cp) * (9 * args.head_dim + 4 * args.csa_indexer_dim) * 8  # every feature
        assert sum(got["packed"]) < gathered


def _cfg_model() -> Any:
    return _cfg(Path("unused"), {}, None).model


@pytest.mark.slow
@pytest.mark.parametrize("cp", list(LAYOUTS))
def test_v4_halo_past_a_chunk_matches_one_process(cp: int, runs: Path) -> None:
    seq = LAYOUTS[cp]
    model = _model()
    hidden, indexer = _forward(model, _batch(seq), _probe(seq))
    want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert float(indexer) > 0
    for rank in range(cp):
        got = torch.load(runs / f"{cp}-{rank}.pt")
        assert float((got["hidden"] - hidden[:, got["idx"]]).abs().max()) < 1e-12
        assert abs(float(got["indexer"] - indexer)) < 1e-12
        assert sorted(got["grads"]) == sorted(want)
        for name, g in want.items():
            assert float((got["grads"][name] - g).abs().max()) < 1e-12, name


@pytest.mark.slow
def test_v4_cp2_x_tp2_trainer_matches_one_process(tmp_path: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _corpus(tmp_path / "corpus.jsonl")
    mp.spawn(_trainer_worker, args=(str(tmp_path),), nprocs=4, join=True)  # type: ignore[attr-defined,no-untyped-call]
    losses, state = torch.load(tmp_path / "cp2xtp2.pt")
    torch.set_num_threads(1)
    (tmp_path / "one").mkdir()
    ref_losses, ref_state = _run(_cfg(tmp_path / "one" / "ckpt", {}, tmp_path / "corpus.jsonl"), tmp_path / "one",
                                 None)
    assert len(losses) == STEPS
    assert losses == pytest.approx(ref_losses, abs=1e-10, rel=0)
    assert sorted(state) == sorted(ref_state)
    for key, want in ref_state.items():
        assert float((state[key].double() - want.double()).abs().max()) < 1e-10, key
