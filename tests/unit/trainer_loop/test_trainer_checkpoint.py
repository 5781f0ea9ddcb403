"""DCP checkpoints: bit-identical continuation, manifest verification, truncation fallback, pruning."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from torch import nn
from trex.trainer.checkpoint import MANIFEST, CheckpointCorruptError, CheckpointManager
from trex.trainer.optim.muon import Muon


class Net(nn.Module):
    e_score_correction_bias: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 12)
        self.experts = nn.Parameter(torch.randn(2, 12, 12) * 0.2)
        self.out = nn.Linear(12, 3)
        self.register_buffer("e_score_correction_bias", torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        h = h @ self.experts[0] + h @ self.experts[1] + self.e_score_correction_bias.sum()
        out: torch.Tensor = self.out(h)
        return out


def make() -> tuple[nn.Module, list[torch.optim.Optimizer]]:
    torch.manual_seed(0)
    net = Net()
    muon = Muon([net.inp.weight, net.experts], lr=0.02)
    adamw = torch.optim.AdamW([net.inp.bias, net.out.weight, net.out.bias], lr=1e-2, betas=(0.9, 0.95), eps=1e-20)
    return net, [muon, adamw]


def train(net: nn.Module, opts: list[torch.optim.Optimizer], steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 6)
        loss = net(x).pow(2).mean()
        loss.backward()
        for o in opts:
            o.step()
            o.zero_grad()
        with torch.no_grad():
            net.get_buffer("e_score_correction_bias").add_(1e-3 * torch.sign(torch.randn(2)))
        losses.append(loss.item())
    return losses


def test_resume_continues_bit_identically(tmp_path: Path) -> None:
    net, opts = make()
    train(net, opts, 3)
    mgr = CheckpointManager(tmp_path, keep_last=2, cfg_hash="abc")
    mgr.save(3, net, opts, {"rng": torch.get_rng_state(), "py": random.getstate(), "note": [1, 2]})
    ref_losses = train(net, opts, 4)
    ref = {k: v.clone() for k, v in net.state_dict().items()}

    net2, opts2 = make()
    train(net2, opts2, 1)  # different state, to be overwritten
    loaded, _, _ = mgr.load_latest(net2, opts2)
    assert loaded is not None and loaded.step == 3 and loaded.extra["note"] == [1, 2]
    torch.set_rng_state(loaded.extra["rng"])
    assert train(net2, opts2, 4) == ref_losses
    for k, v in net2.state_dict().items():
        assert torch.equal(v, ref[k]), k


def test_truncated_shard_is_named_and_loader_falls_back(tmp_path: Path) -> None:
    net, opts = make()
    logs: list[str] = []
    mgr = CheckpointManager(tmp_path, keep_last=3, log=logs.append)
    train(net, opts, 1)
    mgr.save(1, net, opts, {"step": 1})
    w1 = dict(net.named_parameters())["inp.weight"].detach().clone()
    train(net, opts, 1)
    p2 = mgr.save(2, net, opts, {"step": 2})
    shard = next(p2.glob("*.distcp"))
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointCorruptError, match=rf"step-00000002: file {shard.name} is truncated"):
        mgr.verify(p2)
    net2, opts2 = make()
    loaded, model, _ = mgr.load_latest(net2, opts2, rebuild=make)
    assert loaded is not None and loaded.step == 1 and loaded.extra == {"step": 1}
    assert torch.equal(dict(model.named_parameters())["inp.weight"], w1)
    assert any(shard.name in line and "falling back" in line for line in logs)


def test_flipped_byte_and_missing_manifest(tmp_path: Path) -> None:
    net, opts = make()
    mgr = CheckpointManager(tmp_path, keep_last=5)
    p = mgr.save(4, net, opts, {})
    meta = p / ".metadata"
    raw = bytearray(meta.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    meta.write_bytes(bytes(raw))
    with pytest.raises(CheckpointCorruptError, match=r"\.metadata fails its sha256 check"):
        mgr.verify(p)
    (p / MANIFEST).unlink()
    with pytest.raises(CheckpointCorruptError, match="incomplete"):
        mgr.verify(p)
    assert mgr.latest_step() is None
    loaded, _, _ = mgr.load_latest(*make())
    assert loaded is None


def test_keep_last_prunes_oldest(tmp_path: Path) -> None:
    net, opts = make()
    mgr = CheckpointManager(tmp_path, keep_last=2)
    (tmp_path / "step-00000001.tmp-0").mkdir(parents=True)
    for s in (1, 2, 3):
        mgr.save(s, net, opts, {})
    assert [s for s, _ in mgr.step_dirs()] == [3, 2]
    assert not list(tmp_path.glob("*.tmp-*"))
    assert mgr.latest_step() == 3
