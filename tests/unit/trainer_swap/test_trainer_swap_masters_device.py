"""fp32 masters in host memory on the device the process has: FSDP2 over a one-rank mesh (gloo on CPU, NCCL on
a CUDA GPU) with bf16 compute, AdamW through the swap optimizer and the device's copy engine (side streams
and pinned host memory on CUDA). After 5 steps the parameters and states equal the run with the masters
on the device bit for bit; on CUDA the device memory the masters leave is measured (fp32 shard out, bf16
copy in) and the host copies are pinned."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from trex.runtime.copy_engine import make_copy_engine
from trex.trainer.optim.build import Optimizers
from trex.trainer.optim.masters import hold_masters
from trex.trainer.optim.swap import SwapOptimizers

STEPS = 5
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _train(kind: str, masters: bool) -> tuple[dict[str, torch.Tensor], int]:
    """Final parameters and AdamW states (on CPU), and the device bytes hold_masters released."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device = torch.device(kind)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.GELU(), torch.nn.Linear(160, 64)).to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=init_device_mesh(kind, (1,)),
                        mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = torch.cuda.memory_allocated() if kind == "cuda" else 0
    held = hold_masters(model, pin=kind != "cpu") if masters else []
    assert len(held) == (4 if masters else 0)  # two weights and two biases: every parameter is a master
    released = before - torch.cuda.memory_allocated() if kind == "cuda" else 0
    if kind == "cuda" and held:
        assert all(m.host.is_pinned() and m.compute.is_cuda and not m.local.is_cuda for m in held)
    engine = make_copy_engine(kind)
    opts = SwapOptimizers(Optimizers(None, adamw), buffers=2, bucket_bytes=64 * 160 * 4 * 3, engine=engine,
                          device_kind=kind, masters=held)
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(8, 96, generator=gen).to(device)
        model(x).float().square().mean().backward()
        opts.step()
        opts.zero_grad()
        if held:
            assert all(m.local.data_ptr() == m.host_view.data_ptr() for m in held)
    opts.close()
    out = {n: p.to_local().detach().cpu().clone() for n, p in model.named_parameters()}
    out |= {f"{n}.{k}": v.to_local().detach().cpu().clone() for n, p in model.named_parameters()
            for k, v in adamw.state[p].items() if k != "step"}
    return out, released


@pytest.mark.parametrize("kind", DEVICES)
def test_masters_in_host_memory_equal_masters_on_the_device(kind: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("nccl" if kind == "cuda" else "gloo", init_method=f"file://{tmp_path}/rendezvous",
                            rank=0, world_size=1)
    try:
        on_device, _ = _train(kind, masters=False)
        in_host, released = _train(kind, masters=True)
    finally:
        dist.destroy_process_group()
    assert sorted(on_device) == sorted(in_host) and any(k.endswith("exp_avg_sq") for k in in_host)
    for k, v in on_device.items():
        assert v.dtype == torch.float32 and torch.equal(v, in_host[k]), k
    if kind == "cuda":  # fp32 shards (4 B a parameter) out, bf16 copies (2 B) in
        params = (96 * 160 + 160) + (160 * 64 + 64)
        assert released >= 2 * params * 0.9
