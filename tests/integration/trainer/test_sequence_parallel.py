"""Sequence parallelism under tp against one process, float64, spawn + gloo: between the attention and FFN GEMMs
each tp rank holds only its slice of the micro-batch's tokens (the residual stream, its norms and mHC mappings).

- cp2 x tp2 (world 4) and tp2 under full recompute (the blocks' gathers and reduce-scatters run again in the
  backward) on a DeepSeek-V4 model (CSA and HCA layers, sliding MTP block, mHC, a hash-routed layer, a dense
  layer, the sequence-balance loss and aux-free bias updates) at micro-batch 1: losses and every parameter after 3
  optimizer steps equal the single-process run to 1e-10 (under cp the chunks are cut first, then the tp slices of
  a rank's tokens).
- What a tp rank saves for the backward in the blocks' residual path (mHC mappings, norms, the residual adds;
  attention and FFN internals excluded) is about half of one process's at tp 2, and the plan's residual term
  (trex.trainer.plan.residual_bytes) agrees with both.
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

STEPS = 3
WORLD2 = {"tp2-recompute": {"tp": 2, "recompute": "full"}}
WORLD4 = {"cp2xtp2": {"cp": 2, "tp": 2}}
ACT_SEQ = 128


def _raw(ckpt: Path, layout: dict[str, Any], seq: int = 32) -> dict[str, Any]:
    layout = dict(layout)
    return {"recompute": layout.pop("recompute", "none"),
        "model": {"preset": "tiny", "dtype": "fp64", "overrides": {
            "attention": "csa", "hcMult": 2, "mtpDepth": 1, "numLayers": 3, "nDenseLayers": 1, "nHashLayers": 1,
            "qLoraRank": 16, "vHeadDim": 24, "layerTypes": ["sliding", "csa", "hca"], "maxSeqLen": 2 * ACT_SEQ}},
        "maxSteps": STEPS, "parallelism": layout,
        "data": {"seqLen": seq, "microBatchSize": 1, "globalBatchSize": 2},
        "optimizer": {"schedule": {"warmupSteps": 1}, "adamw": {"eps": 1e-8}},
        "routing": {"biasUpdateSpeed": 0.01, "sequenceBalanceWeight": 0.01},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(ckpt), "intervalSteps": 100, "exportHf": False},
    }


def _run(cfg: TrainerConfig, out: Path, group: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
    tr = Trainer(cfg, out, group=group, measure_peak=False, log=lambda _m: None)
    res = tr.run(STEPS)
    return [r.loss for r in res.history], tr.full_state_dict()


def residual_saved_bytes(tp: int) -> int:
    """Bytes of the distinct storages autograd saves, for one forward + loss at micro-batch 1 of ACT_SEQ tokens,
    while a block runs outside its attention and FFN (its mHC mappings, norms and residual adds), on this rank,
    with tensor (and sequence) parallelism applied when tp > 1. Parameters are excluded."""
    from torch import nn
    from torch.distributed.tensor import DTensor
    from trex.trainer.model import build_model, compute_loss
    from trex.trainer.model.model import blocks

    cfg = load_section(TrainerConfig, _raw(Path("unused"), {"tp": tp}, ACT_SEQ))
    model = build_model(cfg.model)
    if tp > 1:
        from trex.trainer.parallel.mesh import ParallelDims, build_meshes
        from trex.trainer.parallel.parallelize import Parallelized, apply_tensor_parallel

        dims = ParallelDims(world=tp, tp=tp)
        apply_tensor_parallel(model, dims, build_meshes(dims, "cpu"), Parallelized())
    where = ["outside"]

    def tag(region: str) -> Any:
        def hook(*_args: Any) -> None:
            where[0] = region
        return hook

    for block in blocks(model):
        block.register_forward_pre_hook(tag("residual"))
        block.register_forward_hook(tag("outside"))
        inner: list[nn.Module] = [block.self_attn, block.mlp]
        for mod in inner:
            mod.register_forward_pre_hook(tag("inner"))
            mod.register_forward_hook(tag("residual"))
    ids = torch.randint(0, 512, (1, ACT_SEQ), generator=torch.Generator().manual_seed(0))
    sizes: dict[int, tuple[str, int]] = {}

    def local(t: torch.Tensor) -> torch.Tensor:
        return t._local_tensor if isinstance(t, DTensor) else t

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = local(t).untyped_storage()
        region, size = sizes.get(st.data_ptr(), (where[0], 0))
        sizes[st.data_ptr()] = (region, max(size, st.nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(ids, logits=False)
        compute_loss(out, ids, torch.ones_like(ids, dtype=torch.bool), cfg.routing, 0)
    params = {local(p).untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, (region, n) in sizes.items() if region == "residual" and ptr not in params)


def _worker(rank: int, world: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous-{world}", rank=rank, world_size=world)
    try:
        root = Path(out)
        if world == 2:
            (root / f"residual-tp2-{rank}.json").write_text(json.dumps(residual_saved_bytes(2)))
        for name, layout in (WORLD2 if world == 2 else WORLD4).items():
            losses, state = _run(load_section(TrainerConfig, _raw(root / name, layout)), root, dist.group.WORLD)
            if rank == 0:
                (root / f"{name}.json").write_text(json.dumps(losses))
                torch.save(state, root / f"{name}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sp")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(2, str(out)), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    mp.spawn(_worker, args=(4, str(out)), nprocs=4, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("single")
    return _run(load_section(TrainerConfig, _raw(tmp / "ckpt", {})), tmp, None)


@pytest.mark.slow
@pytest.mark.parametrize("name", [*WORLD2, *WORLD4])
def test_sequence_parallel_layout_matches_single_process(
        name: str, runs: Path, reference: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    ref_losses, ref_state = reference
    losses = json.loads((runs / f"{name}.json").read_text())
    assert len(losses) == STEPS
    assert losses == pytest.approx(ref_losses, abs=1e-10, rel=0)
    state = torch.load(runs / f"{name}.pt")
    assert sorted(state) == sorted(ref_state)
    assert any("hc_attn" in k for k in state) and any("input_layernorm" in k for k in state)
    for key, want in ref_state.items():
        assert float((state[key].double() - want.double()).abs().max()) < 1e-10, key
    biases = [k for k in ref_state if k.endswith("e_score_correction_bias")]
    assert biases and any(float(ref_state[k].abs().max()) > 0 for k in biases)  # the bias update ran


@pytest.mark.slow
def test_residual_activations_divide_by_tp(runs: Path) -> None:
    """A tp 2 rank saves about half of one process's residual-path bytes (mHC, norms), and the plan's residual
    term agrees with both within 15 %."""
    from trex.trainer.config import resolved_model_values
    from trex.trainer.plan import residual_bytes

    torch.set_num_threads(1)
    cfg = load_section(TrainerConfig, _raw(Path("unused"), {}, ACT_SEQ))
    values = resolved_model_values(cfg.model)
    blocks = cfg.model.args.num_layers + cfg.model.args.mtp_depth
    one = residual_saved_bytes(1)
    plan_one = blocks * residual_bytes(values, 1, ACT_SEQ, 8)
    assert 0.85 <= plan_one / one <= 1.15, (plan_one, one)
    plan_two = blocks * residual_bytes(values, 2, ACT_SEQ, 8)
    for rank in (0, 1):
        two = json.loads((runs / f"residual-tp2-{rank}.json").read_text())
        assert 0.45 <= two / one <= 0.55, (rank, two, one)
        assert 0.85 <= plan_two / two <= 1.15, (rank, plan_two, two)
