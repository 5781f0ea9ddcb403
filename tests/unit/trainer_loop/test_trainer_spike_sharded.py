"""Anticipatory routing's snapshots under FSDP2 (spawn, gloo, world 2, float64): each rank keeps only its shards of
the router weights, yet the weights a scripted spike installs equal the whole Δt-old weights (what the gathering
snapshots installed); a resume under another layout drops shards that are not this rank's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.multiprocessing as mp
from helpers.gloo import gloo_rank
from torch import nn
from trex.trainer.spike import AnticipatoryRouting

DELTA, WINDOW, SPIKE = 2, 3, 4


def _worker(rank: int, world: int, out: str) -> None:
    from trex.config_base import load_section
    from trex.trainer.build import distributed_model
    from trex.trainer.config import TrainerConfig
    from trex.trainer.parallel.mesh import ParallelDims, build_meshes

    torch.set_num_threads(1)
    with gloo_rank(rank, world, f"{out}/rendezvous"):
        cfg = load_section(TrainerConfig, {"model": {"preset": "tiny", "dtype": "fp64"}})
        dims = ParallelDims(world=world, dp_shard=world)
        model, _ = distributed_model(cfg.model.args, dims, build_meshes(dims, "cpu"), torch.float64,
                                     torch.device("cpu"), 3)
        gates = model.moe_gates
        ar = AnticipatoryRouting(gates, model.set_anticipatory_router_weights, DELTA, WINDOW)
        whole: dict[int, dict[str, torch.Tensor]] = {}
        checked = 0
        for step in range(9):
            ar.snapshot()
            whole[step] = {n: g.weight.full_tensor().detach().clone() for n, g in gates()}  # the gathering snapshot
            active = ar.prepare(step)
            if step == SPIKE:
                ar.trigger(step)
            assert active == (SPIKE < step <= SPIKE + WINDOW)
            for n, g in gates():
                if active:
                    assert torch.equal(g.anticipatory_weight, whole[step - DELTA][n]), (step, n)
                    checked += 1
                else:
                    assert g.anticipatory_weight is None
            with torch.no_grad():  # the "optimizer step": a different change on every shard
                for k, (_, g) in enumerate(gates()):
                    g.weight.to_local().add_(0.5 * (rank + 1) + k)
        held = sum(t.numel() for snap in ar.snapshots for t in snap.values())
        full = sum(t.numel() for snap in list(whole.values())[-DELTA - 1:] for t in snap.values())
        again = AnticipatoryRouting(gates, model.set_anticipatory_router_weights, DELTA, WINDOW)
        again.load_state_dict(ar.state_dict())
        kept = len(again.snapshots) == DELTA + 1 and all(
            torch.equal(a[n], b[n]) for a, b in zip(again.snapshots, ar.snapshots, strict=True) for n in a)
        Path(out, f"{rank}.json").write_text(json.dumps({"held": held, "full": full, "checked": checked,
                                                          "kept": kept}))


def test_sharded_snapshots_install_the_whole_old_weights(tmp_path: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(2, str(tmp_path)), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    for rank in range(2):
        got = json.loads(Path(tmp_path, f"{rank}.json").read_text())
        assert got["checked"] >= WINDOW and got["kept"]
        assert got["held"] * 2 == got["full"]  # half of every router weight on each rank


class _Gate(nn.Module):
    def __init__(self, rows: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, 3))


def test_snapshots_of_another_layout_are_dropped_on_load() -> None:
    small = {"layers.0.gate": _Gate(2)}
    ar = AnticipatoryRouting(lambda: list(small.items()), lambda _w: None, delta=1, window=2)
    ar.snapshot()
    ar.snapshot()
    ar.trigger(1)
    big = {"layers.0.gate": _Gate(4)}  # the same router, this rank's shard of it larger
    other = AnticipatoryRouting(lambda: list(big.items()), lambda _w: None, delta=1, window=2)
    other.load_state_dict(ar.state_dict())
    assert not other.snapshots and other.active_until == 3 and not other.prepare(2)
