"""fp32 master shards in host memory for a bf16 model at dp2 (spawn, gloo; FSDP2 gathers the masters in bf16).

With optimizer.swap the masters live in host memory between steps (FSDP2's sharded data is the host copy; the
device keeps only a bf16 copy, which is exactly the master cast to bf16), and after 5 steps every parameter
and every Muon/AdamW state equals the run without swap bit for bit; small buckets on a simulated link with
random per-copy delays equal the same buckets stepped in place; checkpoint at step 3 + resume equals the
uninterrupted run, and so does initialisation from a Hugging Face folder with and without swap. With updates far below bf16's resolution the fp32 masters accumulate them as the fp32
model does, where a pure bf16 model (one process) rounds every one of them away.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import trex.trainer.build as build_mod
from optimizer_states import InPlaceSwap, assert_identical, full_copy
from trex.config_base import load_section
from trex.runtime.copy_engine import LatencyCopyEngine
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer
from trex.trainer.optim import swap
from trex.trainer.optim.swap import SwapOptimizers

STEPS = 5
BUCKET = 24 * 1024
TINY_LR = {"muon": {"lr": 1e-4}, "adamw": {"lr": 1e-4}}
"""Updates of about 1e-4 per step: below half a bf16 ulp of a norm weight at 1.0 (2^-8)."""


def _cfg(root: Path, dtype: str, enabled: bool, interval: int = 100, lr: dict[str, Any] | None = None,
         hf: Path | None = None) -> TrainerConfig:
    ckpt: dict[str, Any] = {"initFromHf": str(hf)} if hf is not None else {}
    return load_section(TrainerConfig, {
        "model": {"preset": "tiny", "dtype": dtype}, "maxSteps": STEPS,
        "data": {"seqLen": 16, "microBatchSize": 1, "globalBatchSize": 2},
        "optimizer": {"schedule": {"warmupSteps": 1}, "swap": {"enabled": enabled}, **(lr or {})},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(root / "ckpt"), "intervalSteps": interval, "exportHf": False, **ckpt},
    })


def _states(tr: Trainer) -> dict[str, torch.Tensor]:
    """Parameters and optimizer states as full tensors (a collective: the same order on every rank)."""
    opts = tr.opts.all()  # waits for outstanding write-backs
    names = {id(p): n for n, p in tr.model.named_parameters()}
    out = {f"param.{n}": full_copy(p) for n, p in tr.model.named_parameters()}
    for opt in opts:
        for p in [p for g in opt.param_groups for p in g["params"]]:
            for key, val in sorted(opt.state[p].items()):
                if isinstance(val, torch.Tensor) and val.ndim > 0:
                    out[f"{names[id(p)]}.{key}"] = full_copy(val)
    return out


def _where(tr: Trainer) -> dict[str, Any]:
    """Where this rank's masters are between steps, checked against FSDP2's own records."""
    from trex.trainer.mfu import DEVICES
    from trex.trainer.optim.masters import held_masters, master_params
    from trex.trainer.plan import plan_memory

    assert isinstance(tr.opts, SwapOptimizers)
    masters = list(tr.opts.masters.values())
    records = {id(fp.sharded_param): fp for fp in master_params(tr.model)}
    dense = [p for p in tr.model.parameters() if p.requires_grad]
    planned = plan_memory(tr.cfg, 2, DEVICES["cpu"], capacity=1 << 40)
    return {
        "count": len(masters), "params": len(dense), "records": len(records),
        "found": sorted(id(m) for m in held_masters(tr.model)) == sorted(id(m) for m in masters),
        "fp32": all(m.local.dtype == torch.float32 for m in masters),
        "in_host_copy": all(m.local.data_ptr() == m.host_view.data_ptr() for m in masters),
        "fsdp_data_is_host": all(records[id(m.param)]._sharded_param_data.data_ptr() == m.host.data_ptr()
                                 for m in masters),
        "bf16_copy_is_cast": all(m.compute.dtype == torch.bfloat16
                                 and torch.equal(m.compute, m.host.to(torch.bfloat16)) for m in masters),
        "pinned_on_cpu": all(not m.host.is_pinned() for m in masters),
        "bytes": tr.opts.last.host_bytes if tr.opts.last else 0,
        "compute_bytes": tr.opts.compute_bytes(),
        "master_bytes": sum(m.nbytes()[0] for m in masters),
        "planned": {k: int(getattr(planned, k)) for k in ("masters", "params", "device_params")},
    }


def _worker(rank: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    original = build_mod.with_swap
    try:
        def run(variant: str, cfg: TrainerConfig, root: Path, steps: int = STEPS) -> Trainer:
            tr = Trainer(cfg, root, group=dist.group.WORLD, measure_peak=False, log=lambda _m: None)
            tr.run(steps)
            return tr

        base = Path(out)
        results: dict[str, Any] = {}
        off = run("off", _cfg(base / "off", "bf16", False), base / "off")
        results["off"], results["off-export"] = _states(off), off.full_state_dict()
        on = run("on", _cfg(base / "on", "bf16", True), base / "on")
        results["where"] = _where(on)
        results["on"], results["on-export"] = _states(on), on.full_state_dict()
        results["where-after-export"] = _where(on)
        build_mod.with_swap = lambda o, c, k, **kw: swap.with_swap(  # type: ignore[assignment]
            o, c, k, engine=LatencyCopyEngine(2.0, jitter=2e-3, seed=rank), bucket_bytes=BUCKET, **kw)
        results["small"] = _states(run("small", _cfg(base / "small", "bf16", True), base / "small"))
        first = run("first", _cfg(base / "resume", "bf16", True, interval=3), base / "resume", steps=3)
        assert first.last_checkpoint == 3
        second = run("second", _cfg(base / "resume", "bf16", True, interval=3), base / "resume")
        assert second.step == STEPS
        results["resumed"] = _states(second)
        build_mod.with_swap = lambda o, c, k, **kw: InPlaceSwap(  # type: ignore[assignment]
            o, buffers=2, bucket_bytes=BUCKET, engine=LatencyCopyEngine(1.0), device_kind=k)
        results["in-place"] = _states(run("in-place", _cfg(base / "in-place", "bf16", True), base / "in-place"))
        build_mod.with_swap = original
        for enabled in (False, True):  # weights from a Hugging Face folder (another seed) loaded into the masters
            name = f"hf-{'on' if enabled else 'off'}"
            results[name] = _states(run(name, _cfg(base / name, "bf16", enabled, hf=base / "hf"), base / name))
        results["tiny"] = _states(run("tiny", _cfg(base / "tiny", "bf16", True, lr=TINY_LR), base / "tiny"))
        if rank == 0:
            torch.save(results, base / "results.pt")
    finally:
        build_mod.with_swap = original
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from trex.trainer.hf import save_hf
    from trex.trainer.model import build_model

    out = tmp_path_factory.mktemp("masters")
    save_hf(build_model(_cfg(out, "bf16", True).model, seed=123), out / "hf")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(str(out),), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    results: dict[str, Any] = torch.load(out / "results.pt")
    return results


@pytest.mark.slow
def test_masters_are_fp32_in_host_memory_between_steps(runs: dict[str, Any]) -> None:
    w = runs["where"]
    assert w["count"] == w["records"] == w["params"] > 0  # dp2: every parameter is an FSDP2 master shard
    assert w["found"] and w["fp32"] and w["in_host_copy"] and w["fsdp_data_is_host"] and w["bf16_copy_is_cast"]
    assert w["pinned_on_cpu"]  # plain host memory on CPU (pinned on accelerators)
    assert w["compute_bytes"] > 0 and w["bytes"] > 2 * w["compute_bytes"]  # masters (4 B) + states in host
    # the memory plan counts the same padded shards: fp32 masters in host memory, bf16 copies on the device
    assert w["planned"]["masters"] == w["master_bytes"] == 2 * w["compute_bytes"]
    assert w["planned"]["device_params"] == w["planned"]["params"] - w["compute_bytes"]


@pytest.mark.slow
def test_swap_with_masters_is_bit_identical_at_dp2(runs: dict[str, Any]) -> None:
    assert_identical(runs["off"], runs["on"])
    # the Hugging Face export's full state dict gathers the masters from the device and leaves them in host
    assert runs["off-export"] and sorted(runs["off-export"]) == sorted(runs["on-export"])
    assert all(torch.equal(v, runs["on-export"][k]) for k, v in runs["off-export"].items())
    assert runs["where-after-export"]["in_host_copy"]
    assert_identical(runs["in-place"], runs["small"])
    # the resumed runs use the small buckets and latency engine: their uninterrupted twin is "small" (the Newton-Schulz
    # batches follow the buckets, and batched matmuls of other batch sizes may round differently on some CPUs)
    assert_identical(runs["small"], runs["resumed"])
    assert_identical(runs["hf-off"], runs["hf-on"])
    assert not torch.equal(runs["hf-on"]["param.lm_head.weight"], runs["on"]["param.lm_head.weight"])
    assert all(v.dtype == torch.float32 for k, v in runs["on"].items() if k.startswith("param."))


@pytest.mark.slow
def test_fp32_masters_keep_updates_that_bf16_rounds_away(runs: dict[str, Any], tmp_path: Path) -> None:
    torch.set_num_threads(1)
    finals: dict[str, dict[str, torch.Tensor]] = {}
    inits: dict[str, dict[str, torch.Tensor]] = {}
    for dtype in ("fp32", "bf16"):
        tr = Trainer(_cfg(tmp_path / dtype, dtype, True, lr=TINY_LR), tmp_path / dtype, measure_peak=False,
                     log=lambda _m: None)
        inits[dtype] = {n: p.detach().double().clone() for n, p in tr.model.named_parameters()}
        tr.run(STEPS)
        finals[dtype] = {n: p.detach().double().clone() for n, p in tr.model.named_parameters()}
    masters = {k.removeprefix("param."): v.double() for k, v in runs["tiny"].items() if k.startswith("param.")}
    norms = [n for n in inits["fp32"] if n.endswith("norm.weight")]  # AdamW, initialised to 1.0
    assert norms
    for n in norms:
        assert torch.equal(finals["bf16"][n], inits["bf16"][n]), n  # pure bf16: every update rounded away

    def err(final: dict[str, torch.Tensor], init: dict[str, torch.Tensor], names: list[str]) -> float:
        """Squared distance of the run's updates from the fp32 model's (from each run's own start)."""
        return sum(float((final[n] - init[n] - finals["fp32"][n] + inits["fp32"][n]).square().sum()) for n in names)

    every = list(inits["fp32"])
    assert err(inits["fp32"], inits["fp32"], every) > 0  # the fp32 model's updates themselves: not nothing
    # the masters (starting from the fp32 model's weights) keep the norm weights' updates to within 1 %...
    assert err(masters, inits["fp32"], norms) < 1e-2 * err(inits["fp32"], inits["fp32"], norms)
    # ...and over all parameters they are much closer to the fp32 model than pure bf16 updates are
    assert err(masters, inits["fp32"], every) < 0.5 * err(finals["bf16"], inits["bf16"], every)


def _toy_worker(rank: int, out: str) -> None:
    """A toy model whose shards are uneven at 2 ranks (3 rows: 2 + 1; 1 row: 1 + 0), FSDP2 in bf16 over fp32
    shards, AdamW through the swap optimizer with and without the masters in host memory."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from trex.trainer.optim.build import Optimizers
    from trex.trainer.optim.masters import hold_masters

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous-toy", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        finals = []
        for masters in (False, True):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Linear(3, 1), torch.nn.Linear(1, 4))
            fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                         reduce_dtype=torch.float32))
            adamw = torch.optim.AdamW(model.parameters(), lr=1e-2)
            held = hold_masters(model, pin=False) if masters else []
            assert len(held) == (6 if masters else 0)
            opts = SwapOptimizers(Optimizers(None, adamw), buffers=2, bucket_bytes=64, device_kind="cpu",
                                  engine=LatencyCopyEngine(1.0, jitter=1e-3, seed=rank), masters=held)
            for step in range(STEPS):
                x = torch.randn(4, 5, generator=torch.Generator().manual_seed(10 * step + rank))
                model(x).float().square().mean().backward()
                opts.step()
                opts.zero_grad()
            opts.close()
            finals.append({n: full_copy(p) for n, p in model.named_parameters()}
                          | {f"{n}.{k}": full_copy(v) for n, p in model.named_parameters()
                             for k, v in adamw.state[p].items() if k != "step"})
        if rank == 0:
            torch.save(finals, Path(out) / "toy.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_uneven_shards_gather_and_update_as_without_masters(tmp_path: Path) -> None:
    mp.spawn(_toy_worker, args=(str(tmp_path),), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    without, held = torch.load(tmp_path / "toy.pt")
    assert sorted(without) == sorted(held) and any(k.endswith("exp_avg_sq") for k in held)
    for k, v in without.items():
        assert v.dtype == torch.float32 and torch.equal(v, held[k]), k
