"""Every parallel layout against the single-process trainer (float64, same data and seeds): per-step losses
and every parameter after 3 optimizer steps agree to 1e-10. The model has MTP (a sliding-window block), a csa and an hca
layer (DeepSeek-V4 attention with sinks and the indexer), a dense layer, a hash-routed
layer, group-limited routing, mHC and CSA with query LoRA. Also: the token dispatcher on degenerate routing
(every token to one expert, so one rank receives none) against the local experts, forward and backward;
and a checkpoint resharded from 4 ranks to 2 to 1 continuing the single-process loss history."""

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
RESHARD_STEPS = 6
WORLD2 = {
    "dp2": {},
    "dp2-gather": {"muon": "gather"},
    "ep2": {"ep": 2},
    "etp2": {"etp": 2},
    "tp2": {"tp": 2},
}
INIT_LAYOUTS = {"tp2xep2": {"tp": 2, "ep": 2}, "dp2xetp2": {"etp": 2}, "hsdp2x2": {"dpReplicate": 2}}
WORLD4 = {
    "dp2xep2": {"ep": 2},
    "hsdp2x2": {"dpReplicate": 2},
    "ep2xetp2": {"ep": 2, "etp": 2},
    "tp2xep2": {"tp": 2, "ep": 2},
    "tp2xep2-gather": {"tp": 2, "ep": 2, "muon": "gather"},
}


def _cfg(ckpt: Path, layout: dict[str, Any], steps: int = STEPS, interval: int = 100) -> TrainerConfig:
    layout = dict(layout)
    muon = layout.pop("muon", "owner")
    return load_section(TrainerConfig, {
        "model": {"preset": "tiny", "dtype": "fp64", "overrides": {
            "attention": "csa", "hcMult": 2, "mtpDepth": 1, "numLayers": 2, "nDenseLayers": 1, "nHashLayers": 1,
            "nGroups": 2, "topkGroups": 1, "qLoraRank": 16, "vHeadDim": 24,
            "layerTypes": ["csa", "hca"]}},
        "maxSteps": steps, "parallelism": layout,
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 8},
        # AdamW's eps at the usual 1e-8: parameters whose gradients are ~1e-19 (mHC gates at init) would
        # otherwise take sign-like steps that amplify last-digit differences of the gradient sums.
        "optimizer": {"schedule": {"warmupSteps": 1}, "muon": {"distributed": muon}, "adamw": {"eps": 1e-8}},
        "routing": {"biasUpdateSpeed": 0.01, "sequenceBalanceWeight": 0.01},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(ckpt), "intervalSteps": interval, "exportHf": False},
    })


def _hf_cfg(ckpt: Path, layout: dict[str, Any], hf: Path) -> TrainerConfig:
    """A DeepSeek-V3-shaped model (it has a transformers form) initialised from the folder ``hf``."""
    return load_section(TrainerConfig, {
        "model": {"preset": "tiny", "dtype": "fp64"}, "parallelism": layout,
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 8},
        "checkpoint": {"dir": str(ckpt), "exportHf": False, "initFromHf": str(hf)}})


def _bytes(cfg: TrainerConfig, tr: Any, world: int) -> dict[str, dict[str, int]]:
    """Rank 0's measured local bytes of parameters and optimizer states, and the memory plan's."""
    from trex.trainer.mfu import DEVICES
    from trex.trainer.plan import measured_state_bytes, plan_memory

    plan = plan_memory(cfg, world, DEVICES["cpu"], capacity=1 << 40)
    measured = measured_state_bytes(tr.model, tr.opts)
    keys = ("params", "muon_state", "adamw_state")
    return {"measured": {k: measured[k] for k in keys}, "plan": {k: int(getattr(plan, k)) for k in keys}}


def _example(name: str) -> dict[str, Any]:
    import yaml

    doc: dict[str, Any] = yaml.safe_load((Path(__file__).parents[3] / "examples" / name).read_text())
    return doc


def _example_cfg(ckpt: Path, name: str = "trainjob-v4-flash-cpu.yaml", one_process: bool = False) -> TrainerConfig:
    """An example's trainer section for one step (``one_process``: its layout dropped, the same batches)."""
    trainer = _example(name)["spec"]["trainer"]
    trainer["checkpoint"] = {**trainer["checkpoint"], "dir": str(ckpt), "exportHf": False}
    trainer["maxSteps"] = 1
    if one_process:
        trainer["parallelism"] = {}
    return load_section(TrainerConfig, trainer)


def _run(cfg: TrainerConfig, out: Path, group: Any, until: int = STEPS) -> tuple[list[float], dict[str, torch.Tensor], Any]:
    tr = Trainer(cfg, out, group=group, measure_peak=False, log=lambda _m: None)
    res = tr.run(until)
    return [r.loss for r in res.history], tr.full_state_dict(), tr


def _dispatch_degenerate(out: Path) -> None:
    """ep2: every token to expert 0 (rank 1 receives nothing and sends everything) vs the local experts."""
    from torch.distributed.tensor import Shard, distribute_tensor
    from trex.trainer.model.args import ModelArgs
    from trex.trainer.model.moe import GroupedExperts
    from trex.trainer.parallel.expert import ExpertDispatch

    torch.manual_seed(0)
    args = ModelArgs(hidden_size=16, moe_intermediate_size=8, n_routed_experts=4, experts_per_token=2)
    ref = GroupedExperts(args).double()
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x_all = torch.randn(2, 6, 16, dtype=torch.float64)
    idx = torch.zeros(6, 2, dtype=torch.long)
    idx[:, 1] = torch.tensor([0, 1, 0, 1, 1, 0])  # experts 0 and 1: both on rank 0
    w = torch.rand(6, 2, dtype=torch.float64)
    rank = dist.get_rank()
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("ep",))
    par = GroupedExperts(args).double()
    for name in ("gate_proj", "up_proj", "down_proj"):
        setattr(par, name, torch.nn.Parameter(distribute_tensor(getattr(ref, name).data.clone(), mesh, [Shard(0)],
                                                                src_data_rank=None)))
    par.dispatch = ExpertDispatch(4, 2, 1, mesh.get_group(), None)
    x = x_all[rank].clone().requires_grad_(True)
    y = par(x, idx, w)
    y.pow(2).sum().backward()
    x_ref = x_all.reshape(12, 16).clone().requires_grad_(True)
    y_ref = ref(x_ref, torch.cat([idx, idx]), torch.cat([w, w]))
    y_ref.pow(2).sum().backward()
    got = {"y": y.detach(), "gx": x.grad, "g_gate": par.gate_proj.grad.full_tensor(),
           "g_down": par.down_proj.grad.full_tensor()}
    want = {"y": y_ref.detach()[rank * 6:(rank + 1) * 6], "gx": x_ref.grad[rank * 6:(rank + 1) * 6],
            "g_gate": ref.gate_proj.grad, "g_down": ref.down_proj.grad}
    err = {k: float((got[k] - want[k]).abs().max()) for k in got}
    (out / f"degenerate-{rank}.json").write_text(json.dumps(err))


def _worker(rank: int, world: int, out: str, layouts: dict[str, dict[str, Any]]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous-{world}", rank=rank, world_size=world)
    try:
        root = Path(out)
        if world == 2:
            _dispatch_degenerate(root)
        for name, layout in layouts.items():
            cfg = _cfg(root / name, layout)
            losses, state, tr = _run(cfg, root, dist.group.WORLD)
            if rank == 0:
                (root / f"{name}.json").write_text(json.dumps(losses))
                torch.save(state, root / f"{name}.pt")
                (root / f"{name}-bytes.json").write_text(json.dumps(_bytes(cfg, tr, world)))
        if world == 4:
            # Meta-device initialisation: the materialised shards of each layout are the single-process weights.
            for name, layout in INIT_LAYOUTS.items():
                cfg = _cfg(root / f"init-{name}", layout)
                tr = Trainer(cfg, root, group=dist.group.WORLD, measure_peak=False, log=lambda _m: None)
                state = tr.full_state_dict()
                hf = _hf_cfg(root / f"hf-{name}", layout, root / "hf")
                tr = Trainer(hf, root, group=dist.group.WORLD, measure_peak=False, log=lambda _m: None)
                tr.prepare()
                hf_state = tr.full_state_dict()
                if rank == 0:
                    torch.save({"init": state, "hf": hf_state}, root / f"init-{name}.pt")
            # The CPU copy of the flagship example runs its own layout (ep2 x etp2 on 2 x 2).
            losses, _, tr = _run(_example_cfg(root / "example"), root, dist.group.WORLD, 1)
            if rank == 0:
                (root / "example.json").write_text(json.dumps({"losses": losses, "step": tr.step,
                                                               "dims": [tr.dims.edp, tr.dims.ep, tr.dims.etp]}))
            # The CPU copy of the long-context examples runs theirs (cp4 at micro-batch 1, ep2 x etp2).
            losses, _, tr = _run(_example_cfg(root / "longctx", LONGCTX_CPU), root, dist.group.WORLD, 1)
            if rank == 0:
                (root / "longctx.json").write_text(json.dumps({"losses": losses, "step": tr.step,
                                                               "dims": [tr.dims.cp, tr.dims.ep, tr.dims.etp]}))
        # Resharding: steps 1-2 at 4 ranks (dp2 x ep2), 3-4 at 2 ranks (ep2), 5-6 in one process (the test).
        until = {4: 2, 2: 4}[world]
        losses, _, _ = _run(_cfg(root / "reshard", {"ep": 2}, RESHARD_STEPS, 2), root, dist.group.WORLD, until)
        if rank == 0:
            (root / f"reshard-{world}.json").write_text(json.dumps(losses))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[float], dict[str, torch.Tensor]]:
    tmp = tmp_path_factory.mktemp("single")
    losses, state, _ = _run(_cfg(tmp / "ckpt", {}), tmp, None)
    return losses, state


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trex.trainer.hf import save_hf
    from trex.trainer.model import build_model

    out = tmp_path_factory.mktemp("parallel")
    save_hf(build_model(_hf_cfg(out, {}, out).model, seed=123), out / "hf")  # the initFromHf source (another seed)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(4, str(out), WORLD4), nprocs=4, join=True)  # type: ignore[attr-defined,no-untyped-call]
    mp.spawn(_worker, args=(2, str(out), WORLD2), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("layout", [*WORLD2, *WORLD4])
def test_layout_matches_single_process(layout: str, runs: Path,
                                       reference: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    ref_losses, ref_state = reference
    losses = json.loads((runs / f"{layout}.json").read_text())
    assert len(losses) == STEPS
    assert losses == pytest.approx(ref_losses, abs=1e-10, rel=0)
    state = torch.load(runs / f"{layout}.pt")
    assert sorted(state) == sorted(ref_state)
    for key, want in ref_state.items():
        got = state[key]
        assert got.shape == want.shape, key
        assert float((got.double() - want.double()).abs().max()) < 1e-10, key
    moved = [k for k, v in ref_state.items() if k.endswith("weight")]
    assert moved  # the comparison covers the trained weights


@pytest.mark.slow
def test_dispatch_with_an_idle_rank_matches_local_experts(runs: Path) -> None:
    for rank in (0, 1):
        err = json.loads((runs / f"degenerate-{rank}.json").read_text())
        assert max(err.values()) < 1e-12, (rank, err)


@pytest.mark.slow
def test_checkpoint_reshards_from_four_ranks_to_two_to_one(runs: Path, tmp_path: Path) -> None:
    """Saved at 4 ranks (dp2 x ep2), continued at 2 (ep2), then in one process: the same loss history as one
    uninterrupted single-process run (DCP reshards model, both optimizers' states and the data position)."""
    torch.set_num_threads(1)
    ref, _, _ = _run(_cfg(tmp_path / "ref", {}, RESHARD_STEPS, 100), tmp_path, None, RESHARD_STEPS)
    four = json.loads((runs / "reshard-4.json").read_text())
    two = json.loads((runs / "reshard-2.json").read_text())
    assert len(four) == 2 and len(two) == 2
    one, _, tr = _run(_cfg(runs / "reshard", {}, RESHARD_STEPS, 2), runs, None, RESHARD_STEPS)
    assert len(one) == 2 and tr.step == RESHARD_STEPS
    assert four + two + one == pytest.approx(ref, abs=1e-10, rel=0)


@pytest.mark.slow
def test_cpu_copy_of_the_flagship_runs_its_layout(runs: Path) -> None:
    """examples/trainjob-v4-flash-cpu.yaml, which `trex validate` accepts, trains a step at its world size."""
    got = json.loads((runs / "example.json").read_text())
    assert got["step"] == 1 and got["dims"] == [1, 2, 2]
    assert len(got["losses"]) == 1 and 0 < got["losses"][0] < 20


LONGCTX_CPU = "trainjob-v4-longctx-cpu.yaml"
LONGCTX_NPU = ("trainjob-v4-pro-sft-npu.yaml", "trainjob-v4-flash-longctx-npu.yaml")


def _layout_kinds(trainer: dict[str, Any]) -> dict[str, Any]:
    """What makes a long-context layout: which parallel dimensions are split, micro-batch, recompute, swap."""
    par = trainer["parallelism"]
    return {"split": sorted(k for k in ("tp", "pp", "cp", "ep", "etp") if par.get(k, 1) > 1),
            "microBatchSize": trainer["data"]["microBatchSize"], "recompute": trainer["recompute"],
            "swap": trainer["optimizer"]["swap"]["enabled"]}


def test_cpu_copy_of_the_long_context_examples_has_their_layout_kinds() -> None:
    """examples/trainjob-v4-longctx-cpu.yaml splits what the two 910C long-context examples split (cp, ep, etp;
    micro-batch 1, full recompute, swap) on a model with all three V4 attention kinds."""
    cpu = _example(LONGCTX_CPU)["spec"]["trainer"]
    for name in LONGCTX_NPU:
        assert _layout_kinds(_example(name)["spec"]["trainer"]) == _layout_kinds(cpu), name
    over = cpu["model"]["overrides"]
    assert over["attention"] == "csa" and set(over["layerTypes"]) == {"sliding", "csa", "hca"}


@pytest.mark.slow
def test_cpu_copy_of_the_long_context_examples_runs_their_layout(runs: Path, tmp_path: Path) -> None:
    """examples/trainjob-v4-longctx-cpu.yaml, which `trex validate` accepts, trains a step at cp4 x ep2 x etp2 with
    the loss one process computes on the same batch."""
    got = json.loads((runs / "longctx.json").read_text())
    assert got["step"] == 1 and got["dims"] == [4, 2, 2]
    want, _, _ = _run(_example_cfg(tmp_path / "one", LONGCTX_CPU, one_process=True), tmp_path, None, 1)
    assert got["losses"] == pytest.approx(want, rel=1e-5, abs=0)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [*WORLD2, *WORLD4])
def test_memory_plan_equals_the_bytes_a_rank_holds(layout: str, runs: Path) -> None:
    """trex plan's per-device parameters, Muon and AdamW state against rank 0's local shards: within 5 %."""
    got = json.loads((runs / f"{layout}-bytes.json").read_text())
    for key, planned in got["plan"].items():
        measured = got["measured"][key]
        assert measured > 0 and abs(measured - planned) <= 0.05 * planned, (key, measured, planned)


@pytest.mark.slow
@pytest.mark.parametrize("layout", INIT_LAYOUTS)
def test_meta_initialisation_and_hf_init_match_single_process(layout: str, runs: Path, tmp_path: Path) -> None:
    """A distributed model built on meta and materialised shard by shard starts at the single-process weights;
    initFromHf loads the same weights into every layout."""
    from trex.trainer.hf import load_hf
    from trex.trainer.model import build_model

    got = torch.load(runs / f"init-{layout}.pt")
    cfg, hf_cfg = _cfg(tmp_path, {}), _hf_cfg(tmp_path, {}, tmp_path)
    fresh = build_model(cfg.model, seed=cfg.seed).state_dict()
    loaded = load_hf(runs / "hf", dtype=torch.float64).state_dict()
    assert any(k.startswith("mtp.") for k in loaded)  # the MTP module came through too
    assert not torch.equal(build_model(hf_cfg.model, seed=hf_cfg.seed).state_dict()["lm_head.weight"],
                           loaded["lm_head.weight"])  # initFromHf changes the weights
    for want, state in ((fresh, got["init"]), (loaded, got["hf"])):
        assert sorted(state) == sorted(want)
        for key, value in want.items():
            assert torch.equal(state[key], value), key
