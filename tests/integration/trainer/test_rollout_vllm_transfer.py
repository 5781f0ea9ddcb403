"""rollout.weightPush transfer into a real vLLM server (CPU build, .venv-vllm) on 127.0.0.1: vLLM's nccl weight-transfer
engine as it is (init info parsing, update infos, its packed consumer cutting the buffers, layerwise reload, the
model's load_weights), with only its data plane moved to CPU for this test: the server's ``sitecustomize`` gets
``GLOO_DATA_PLANE`` (the worker's communicator a gloo process group over vLLM's TCP rendezvous fields, and the
CUDA stream and device calls the consumer makes made no-ops), the trainer's group is :class:`GlooGroup`. After a
transfer push of a MoE model the server's greedy tokens and log-probs equal those after a disk push of the same
weights.
NCCL itself needs GPUs (docs/ARCHITECTURE.md, "Rollouts")."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.vllm_env import vllm_venv
from test_rollout_vllm import _prompts, _push, _tokenizer
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.export import export_hf
from trex.trainer.model import build_model
from trex.trainer.model.model import DeepSeekModel
from trex.trainer.rollout import vllm_server
from trex.trainer.rollout.sampling import SamplingParams
from trex.trainer.rollout.vllm_engine import VLLMEngine
from trex.trainer.rollout.vllm_server import VLLMServer, free_port
from trex.trainer.rollout.weight_transfer import TrainerWeights, TransferPush

GLOO_DATA_PLANE = """
import torch
import torch.distributed as _dist
from vllm.distributed.weight_transfer import nccl_engine as _ne, packed_tensor as _pt


class _NoStream:
    def synchronize(self):
        pass


class _GlooComm:
    def __init__(self, info, rank):
        store = _dist.TCPStore(info.master_address, info.master_port, info.world_size, is_master=False)
        self.pg = _dist.ProcessGroupGloo(store, rank, info.world_size)

    def broadcast(self, tensor, src, stream=None):
        opts = _dist.BroadcastOptions()
        opts.rootRank = src
        self.pg.broadcast([tensor], opts).wait()

    def destroy(self):
        self.pg = None


def _init_group(info, parallel_config):
    rank = parallel_config.data_parallel_index * parallel_config.world_size + parallel_config.rank + info.rank_offset
    return _GlooComm(info, rank)


_ne.worker_init_process_group = _init_group
_pt._get_streams = lambda *_a: tuple(_NoStream() for _ in range(64))
_consume = _pt.packed_nccl_broadcast_consumer


def _consumer(*a, **k):
    index = torch.accelerator.current_device_index
    torch.accelerator.current_device_index = lambda: 0
    try:
        return _consume(*a, **k)
    finally:
        torch.accelerator.current_device_index = index


_ne.packed_nccl_broadcast_consumer = _consumer
torch.accelerator.synchronize = lambda *a, **k: None
"""
"""The server-side test shim: vLLM's NCCLWeightTransferEngine with a gloo communicator (TCPStore rendezvous on
the init info's master_address/master_port) and the consumer's CUDA streams, device index and synchronize as
no-ops. Everything else is vLLM's."""


class GlooGroup:
    """The trainer's end of the test's transfer group: the TCPStore master and rank 0 of a gloo group."""

    def __init__(self, device: torch.device) -> None:
        self.port = free_port()
        self.pg: dist.ProcessGroupGloo | None = None

    def init_info(self) -> dict[str, object]:
        return {"master_address": "127.0.0.1", "master_port": self.port}

    def join(self, world_size: int) -> None:
        store = dist.TCPStore("127.0.0.1", self.port, world_size, is_master=True)
        self.pg = dist.ProcessGroupGloo(store, 0, world_size)

    def broadcast(self, buffer: torch.Tensor) -> None:
        assert self.pg is not None
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([buffer], opts).wait()

    def close(self) -> None:
        self.pg = None


def _moe(seed: int) -> DeepSeekModel:
    """tiny-vllm with both layers MoE (per-expert names on the wire, the CPU experts' prepack after a load) and a
    sharpened head (greedy paths far from ties)."""
    cfg = load_section(TrainerConfig, {"model": {"preset": "tiny-vllm", "overrides": {"nDenseLayers": 0}},
                                       "device": "cpu"})
    m = build_model(cfg.model, device="cpu", dtype=torch.float32, seed=seed)
    with torch.no_grad():
        m.lm_head.weight.mul_(8.0)
    return m.eval()


def _weights(model: DeepSeekModel) -> contextlib.AbstractContextManager[TrainerWeights]:
    @contextlib.contextmanager
    def opened() -> Iterator[TrainerWeights]:
        state = model.state_dict()
        yield TrainerWeights(state, model.args, {k: v.dtype for k, v in state.items()})

    return opened()


@pytest.mark.timeout(900)
def test_transfer_push_serves_what_a_disk_push_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = vllm_venv()
    a, b = _moe(3), _moe(4)
    monkeypatch.setattr(vllm_server, "MOE_REPACK", vllm_server.MOE_REPACK + GLOO_DATA_PLANE)
    server = VLLMServer(export_hf(a, _tokenizer(), tmp_path / "a"), venv=venv, max_model_len=256,
                        log_path=tmp_path / "server.log",
                        extra_args=["--weight-transfer-config", json.dumps({"backend": "nccl"})]).start()
    try:
        print(f"vLLM server (weight transfer: nccl engine, gloo data plane) ready in {server.wait_ready(600):.1f} s")
        engine = VLLMEngine([server.url], tmp_path / "weights")
        prompts, greedy = _prompts(8), SamplingParams(temperature=0.0, max_new_tokens=12)
        on_a = engine.generate(prompts, greedy, 0)
        transfer = TransferPush(engine, 64 * 1024, group_factory=GlooGroup)
        moved = transfer.push(lambda: _weights(b), 1)
        assert moved is not None
        sent = engine.generate(prompts, greedy, 0)
        _push(engine, a, 2)
        _push(engine, b, 3)
        disk = engine.pushes[-1]
        loaded = engine.generate(prompts, greedy, 0)
        for s, d in zip(sent, loaded, strict=True):
            assert s.tokens == d.tokens
            assert max(abs(x - y) for x, y in zip(s.logprobs, d.logprobs, strict=True)) < 1e-5
        assert sum(s.tokens != x.tokens for s, x in zip(sent, on_a, strict=True)) >= 4  # the push changed the policy
        again = transfer.push(lambda: _weights(a), 4)  # a second transfer on the same group
        assert again is not None
        back = engine.generate(prompts, greedy, 0)
        print(f"transfer push {moved.bytes / 1e6:.2f} MB in 64 KiB buckets: {moved.reload_seconds:.3f} s with the "
              f"group's init, {again.reload_seconds:.3f} s after (pause to resume); disk push {disk.bytes / 1e6:.2f} "
              f"MB: export {disk.export_seconds:.3f} s + reload {disk.reload_seconds:.3f} s")
        assert [r.tokens for r in back] == [r.tokens for r in on_a]
        transfer.close()
    finally:
        server.stop()
