"""Parameter split between Muon and AdamW, AdamW parity with torch.optim.AdamW, LR schedule, batch ramp."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from trex.trainer.config import OptimizerConfig
from trex.trainer.optim.build import build_optimizers, clip_grad_norm, schedule_factor, split_params
from trex.trainer.optim.schedule import global_batch_at, lr_factor, micro_steps, seq_len_at


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 24, bias=False)
        self.experts = nn.Parameter(torch.randn(3, 24, 16) * 0.1)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 50, bias=False)

    def roles(self) -> dict[str, str]:
        r = {n: "adamw" for n, _ in self.named_parameters()}
        r["proj.weight"] = r["experts"] = "muon"
        return r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = torch.relu(self.proj(h))
        h = h @ self.experts.mean(0)
        out: torch.Tensor = self.head(self.norm(h))
        return out


def test_every_parameter_in_exactly_one_group() -> None:
    torch.manual_seed(0)
    m = Small()
    opts = build_optimizers(m, m.roles(), OptimizerConfig())
    assert opts.muon is not None and opts.adamw is not None
    ids = [id(p) for o in opts.all() for g in o.param_groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in m.parameters())
    assert len(ids) == len(set(ids))
    muon_ids = {id(p) for g in opts.muon.param_groups for p in g["params"]}
    assert muon_ids == {id(m.proj.weight), id(m.experts)}


def test_missing_or_unknown_role_is_an_error() -> None:
    m = Small()
    roles = m.roles()
    roles.pop("norm.bias")
    with pytest.raises(ValueError, match=r"missing \['norm.bias'\]"):
        split_params(m, roles)
    roles = m.roles() | {"norm.bias": "sgd"}
    with pytest.raises(ValueError, match="unknown optimizer roles"):
        split_params(m, roles)


def test_adamw_group_matches_torch_adamw_step_by_step() -> None:
    torch.manual_seed(0)
    m = Small()
    ref = Small()
    ref.load_state_dict(m.state_dict())
    cfg = OptimizerConfig()
    opts = build_optimizers(m, m.roles(), cfg)
    adamw_names = [n for n, r in m.roles().items() if r == "adamw"]
    ref_params = dict(ref.named_parameters())
    ref_opt = torch.optim.AdamW([ref_params[n] for n in adamw_names], lr=2e-3, betas=(0.9, 0.95), eps=1e-20,
                                weight_decay=0.1)
    x = torch.randint(0, 50, (2, 7))
    for step in range(4):
        factor = schedule_factor(cfg, step, 10)
        opts.set_lr_factor(factor)
        for g in ref_opt.param_groups:
            g["lr"] = 2e-3 * factor
        with torch.no_grad():  # Muon parameters follow our model; only the AdamW ones are compared
            ref.proj.weight.copy_(m.proj.weight)
            ref.experts.copy_(m.experts)
        for model in (m, ref):
            model.zero_grad()
            model(x).logsumexp(-1).mean().backward()
        opts.step()
        ref_opt.step()
        got = dict(m.named_parameters())
        for n in adamw_names:
            torch.testing.assert_close(got[n], ref_params[n], atol=0, rtol=0)


def test_lr_schedule_boundaries() -> None:
    # warmup 10, constant 5, cosine over the remaining 85 steps of 100 down to 0.1
    def f(s: int) -> float:
        return float(lr_factor(s, 100, 10, 5, "cosine", 0.1))

    assert f(0) == pytest.approx(0.1)
    assert f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(14) == pytest.approx(1.0)
    assert f(15) == pytest.approx(1.0)
    mid = 15 + 84 / 2
    assert lr_factor(int(mid), 100, 10, 5, "cosine", 0.1) == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (int(mid) - 15) / 84)))
    assert f(99) == pytest.approx(0.1)
    assert f(500) == pytest.approx(0.1)
    assert lr_factor(50, 100, 10, 0, "none", 0.1) == 1.0
    assert lr_factor(0, 100, 0, 0, "cosine", 0.0) == pytest.approx(1.0)


def test_batch_ramp_and_seq_len_curriculum() -> None:
    ramp = [(0, 4), (10, 8), (20, 16)]
    assert [global_batch_at(s, ramp, 2) for s in (0, 9, 10, 19, 20, 1000)] == [4, 4, 8, 8, 16, 16]
    assert global_batch_at(5, [], 6) == 6
    assert micro_steps(16, 4, 2) == 2
    with pytest.raises(ValueError, match="not a multiple"):
        micro_steps(6, 4, 1)
    assert seq_len_at(3, [(0, 32), (2, 64)], 128) == 64


def test_clip_grad_norm_matches_closed_form() -> None:
    a = torch.nn.Parameter(torch.zeros(3))
    b = torch.nn.Parameter(torch.zeros(2, 2))
    a.grad = torch.tensor([3.0, 0.0, 0.0])
    b.grad = torch.tensor([[0.0, 4.0], [0.0, 0.0]])
    norm = clip_grad_norm([a, b], 1.0)
    assert norm == pytest.approx(5.0)
    total = math.sqrt(float(a.grad.pow(2).sum() + b.grad.pow(2).sum()))
    assert total == pytest.approx(1.0, rel=1e-5)


def test_ns_dtype_resolution() -> None:
    from trex.trainer.optim.build import resolve_ns_dtype

    assert resolve_ns_dtype("auto", fast_bf16=False) is torch.float32
    assert resolve_ns_dtype("auto", fast_bf16=True) is torch.bfloat16
    assert resolve_ns_dtype("fp32", fast_bf16=True) is torch.float32
    assert resolve_ns_dtype("bf16", fast_bf16=False) is torch.bfloat16
    m = Small()
    opts = build_optimizers(m, m.roles(), OptimizerConfig(), ns_dtype=torch.bfloat16)
    assert opts.muon is not None
    group = opts.muon.param_groups[0]
    assert group["ns_dtype"] is torch.bfloat16 and group["final_dtype"] is torch.float32


def test_fast_bf16_detection_from_cpu_flags() -> None:
    """AVX512-BF16 or AMX-BF16 in /proc/cpuinfo's flags line means fast bf16 GEMMs; plain AVX-512 does not."""
    from trex.runtime.device import BF16_CPU_FLAGS, cpu_flags

    zen4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n"
    skylake = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd bf16\n"
    assert any(f in cpu_flags(zen4) for f in BF16_CPU_FLAGS)
    assert not any(f in cpu_flags(skylake) for f in BF16_CPU_FLAGS)
    assert "bf16" in cpu_flags(arm) and cpu_flags("") == set()


def test_mixed_newton_schulz_as_accurate_as_fp32() -> None:
    """auto's bf16 leading stages + fp32 cleanup: singular values in [0.999, 1.001] like all-fp32 (float64 SVD)."""
    from trex.trainer.optim.muon import newton_schulz

    gen = torch.Generator().manual_seed(3)
    for shape in ((96, 48), (48, 96), (64, 64), (4, 32, 80)):
        g = torch.randn(shape, generator=gen)
        s = torch.linalg.svdvals(newton_schulz(g, dtype=torch.bfloat16, final_dtype=torch.float32).double())
        assert float(s.min()) >= 0.999 and float(s.max()) <= 1.001, shape
