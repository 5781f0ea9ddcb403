"""Token-split tensor parallelism against one process, float64, spawn + gloo: under tp each rank holds a slice of
every micro-batch's tokens (batch x sequence flattened) outside the attention and dense-FFN GEMMs (the residual
stream, norms, mHC, the MoE layers: sequence parallelism), so tp runs at micro-batch 1.

- tp2 at micro-batch 1 (a sequence's tokens on both tp ranks) and at micro-batch 3 (a sequence cut across the
  two ranks' slices), on a DeepSeek-V4 model (sliding, CSA and HCA layers, mHC, a hash-routed layer, MTP) with
  the sequence-balance loss and aux-free bias updates on: losses and every parameter after 3 optimizer steps
  equal the single-process run to 1e-10.
- The plan's activation term at tp 1 and tp 2 (micro-batch 1) against the storages autograd saves on a rank.
- Validate: tp2 at micro-batch 1 is accepted when the tokens divide; otherwise one line naming the field.
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
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer
from trex.trainer.rules import job_problems

STEPS = 3
RUNS = {"tp2-mb1": ({"tp": 2}, 1), "tp2-mb3": ({"tp": 2}, 3)}
"""name -> (layout, micro-batch size); a step is two micro-batches of the single-process run."""
ACT_SEQ = 256


def _raw(ckpt: Path, layout: dict[str, int], micro: int, seq: int = 32) -> dict[str, Any]:
    return {
        "model": {"preset": "tiny", "dtype": "fp64", "overrides": {
            "attention": "csa", "hcMult": 2, "mtpDepth": 1, "numLayers": 2, "nDenseLayers": 1, "nHashLayers": 1,
            "qLoraRank": 16, "vHeadDim": 24, "layerTypes": ["csa", "hca"]}},
        "maxSteps": STEPS, "parallelism": layout,
        "data": {"seqLen": seq, "microBatchSize": micro, "globalBatchSize": 2 * micro},
        "optimizer": {"schedule": {"warmupSteps": 1}, "adamw": {"eps": 1e-8}},
        "routing": {"biasUpdateSpeed": 0.01, "sequenceBalanceWeight": 0.01},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(ckpt), "intervalSteps": 100, "exportHf": False},
    }


def _run(cfg: TrainerConfig, out: Path, group: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
    tr = Trainer(cfg, out, group=group, measure_peak=False, log=lambda _m: None)
    res = tr.run(STEPS)
    return [r.loss for r in res.history], tr.full_state_dict()


def _act_cfg(tp: int) -> TrainerConfig:
    """An MLA model (a dense and an MoE layer, MTP) at micro-batch 1 of ACT_SEQ tokens."""
    return load_section(TrainerConfig, {
        "model": {"preset": "tiny", "dtype": "fp64", "overrides": {
            "mtpDepth": 1, "numLayers": 2, "nDenseLayers": 1, "qLoraRank": 16, "maxSeqLen": 2 * ACT_SEQ}},
        "parallelism": {"tp": tp}, "data": {"seqLen": ACT_SEQ, "microBatchSize": 1, "globalBatchSize": 2}})


def saved_bytes(tp: int) -> int:
    """Bytes of the distinct storages autograd saves for one forward + loss on this rank (parameters excluded),
    with tensor parallelism applied when tp > 1 (DTensors counted by their local tensors)."""
    from torch.distributed.tensor import DTensor
    from trex.trainer.model import build_model, compute_loss
    from trex.trainer.model.layers import positions_from_docs

    cfg = _act_cfg(tp)
    model = build_model(cfg.model)
    if tp > 1:
        from trex.trainer.parallel.mesh import ParallelDims, build_meshes
        from trex.trainer.parallel.parallelize import Parallelized, apply_tensor_parallel

        dims = ParallelDims(world=tp, tp=tp)
        apply_tensor_parallel(model, dims, build_meshes(dims, "cpu"), Parallelized())
    ids = torch.randint(0, 512, (1, ACT_SEQ), generator=torch.Generator().manual_seed(0))
    docs = torch.zeros(1, ACT_SEQ, dtype=torch.long)
    sizes: dict[int, int] = {}

    def local(t: torch.Tensor) -> torch.Tensor:
        return t._local_tensor if isinstance(t, DTensor) else t

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = local(t).untyped_storage()
        sizes[st.data_ptr()] = max(sizes.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(ids, positions_from_docs(docs), docs, logits=False)
        compute_loss(out, ids, torch.ones_like(ids, dtype=torch.bool), cfg.routing, 0)
    params = {local(p).untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in sizes.items() if ptr not in params)


def _worker(rank: int, world: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
    try:
        root = Path(out)
        (root / f"saved-tp2-{rank}.json").write_text(json.dumps(saved_bytes(2)))
        for name, (layout, micro) in RUNS.items():
            losses, state = _run(load_section(TrainerConfig, _raw(root / name, layout, micro)), root,
                                 dist.group.WORLD)
            if rank == 0:
                (root / f"{name}.json").write_text(json.dumps(losses))
                torch.save(state, root / f"{name}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tp-tokens")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(2, str(out)), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return out


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[list[float], dict[str, torch.Tensor]]]:
    """The single-process run at each micro-batch size."""
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("single")
    return {micro: _run(load_section(TrainerConfig, _raw(tmp / f"mb{micro}", {}, micro)), tmp, None)
            for micro in sorted({m for _, m in RUNS.values()})}


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_token_split_matches_single_process(name: str, runs: Path,
                                            references: dict[int, tuple[list[float], dict[str, torch.Tensor]]]) -> None:
    ref_losses, ref_state = references[RUNS[name][1]]
    losses = json.loads((runs / f"{name}.json").read_text())
    assert len(losses) == STEPS
    assert losses == pytest.approx(ref_losses, abs=1e-10, rel=0)
    state = torch.load(runs / f"{name}.pt")
    assert sorted(state) == sorted(ref_state)
    for key, want in ref_state.items():
        assert float((state[key].double() - want.double()).abs().max()) < 1e-10, key
    biases = [k for k in ref_state if k.endswith("e_score_correction_bias")]
    assert biases and any(float(ref_state[k].abs().max()) > 0 for k in biases)  # the bias update ran


@pytest.mark.slow
def test_activation_plan_tracks_what_a_tp_rank_saves(runs: Path) -> None:
    """At micro-batch 1 the MoE layers hold 1/tp of the tokens on each rank: the plan's activation term at tp 1
    and tp 2 against the storages autograd saves, within 15 %, and a tp 2 rank saves less than one process."""
    from trex.trainer.config import resolved_model_values
    from trex.trainer.plan import Layout, activation_bytes

    torch.set_num_threads(1)
    values = resolved_model_values(_act_cfg(1).model)
    one = saved_bytes(1)
    plan_one = activation_bytes(values, Layout(1, 1, 1, 1, 1, 1), 1, ACT_SEQ, 8, attention_probs=True)
    assert 0.85 <= plan_one / one <= 1.15, (plan_one, one)
    plan_two = activation_bytes(values, Layout(2, 1, 2, 1, 1, 1), 1, ACT_SEQ, 8, attention_probs=True)
    for rank in (0, 1):
        two = json.loads((runs / f"saved-tp2-{rank}.json").read_text())
        assert two < one
        assert 0.85 <= plan_two / two <= 1.15, (rank, plan_two, two)


def test_validate_accepts_tp_at_micro_batch_one_when_the_tokens_divide() -> None:
    def problems(seq: int, **data: Any) -> list[tuple[str, str]]:
        raw = _raw(Path("unused"), {"tp": 2}, 1, seq)
        raw["model"] = {"preset": "tiny"}
        raw["data"].update(data)
        return job_problems(load_section(TrainerConfig, raw), 2)

    assert problems(32) == []
    [(field, message)] = problems(33)
    assert field == "parallelism.tp" and "\n" not in message
    assert "does not divide the 33 tokens of a micro-batch (data.microBatchSize 1 x data.seqLen 33)" in message
    [(field, message)] = problems(32, seqLenCurriculum=[{"step": 1, "seqLen": 17}])
    assert field == "parallelism.tp" and "data.seqLenCurriculum[0].seqLen 17" in message


def test_fit_message_suggests_tp_only_where_the_tokens_split() -> None:
    from trex.trainer.mfu import DEVICES

    def advice(seq: int, heads: int = 4) -> str:
        raw = _raw(Path("unused"), {}, 1, seq)
        raw["model"] = {"preset": "tiny", "dtype": "fp64", "overrides": {"numHeads": heads, "maxSeqLen": 2048}}
        problems = job_problems(load_section(TrainerConfig, raw), 2, DEVICES["cpu"], capacity=64 << 20)
        assert len(problems) == 1 and problems[0][0] == "parallelism", problems
        return problems[0][1]

    assert "raise parallelism.tp (to 2)" in advice(1024)
    assert "parallelism.tp" not in advice(1023)  # 1023 tokens do not split over 2 ranks
    assert "parallelism.tp" not in advice(1024, heads=3)  # nor 3 heads
