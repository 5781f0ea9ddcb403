"""rollout.weightPush transfer against recorded fake vLLM servers (HTTP on loopback) and a recording transfer group:
the request sequence of vLLM's weight-transfer API, the init info (rank offsets over the servers' workers, packing),
and every broadcast decoded the way vLLM's packed consumer cuts it (re-derived here from the update infos alone)
equal to the Hugging Face export the disk path writes, bit for bit, in one process and from a two-rank sharded
model (spawn, gloo). NCCL itself needs GPUs: the group here records what rank 0 would broadcast."""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors import safe_open
from tokenizers import Tokenizer, models, pre_tokenizers
from trex.config_base import load_section
from trex.prompt_contract import BOS, END, EOS, PAD
from trex.trainer.config import RolloutConfig, TrainerConfig
from trex.trainer.export import export_hf, export_trainer
from trex.trainer.model import build_model
from trex.trainer.rollout.vllm_engine import VLLMEngine, VLLMRollouts
from trex.trainer.rollout.weight_transfer import NcclGroup, TrainerWeights, TransferPush, trainer_weights
from trex.trainer.rules import job_problems

MOE = {"preset": "tiny-vllm", "overrides": {"nDenseLayers": 0}}
"""tiny-vllm with both layers MoE: per-expert output names, expert stacks split over ep ranks."""
UID = bytes(range(128))


class FakeServer:
    """A vLLM server's weight-transfer routes on 127.0.0.1: records (method, path, body), answers /get_world_size
    with its worker count and every POST with {}."""

    def __init__(self, workers: int) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.calls.append(("GET", self.path, None))
                self._answer({"world_size": workers})

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", 0))
                outer.calls.append(("POST", self.path, json.loads(self.rfile.read(n) or b"null")))
                self._answer({})

            def _answer(self, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *_: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class RecordingGroup:
    """A transfer group that keeps what rank 0 broadcasts (copies: the buffer is reused)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.joined: list[int] = []
        self.sent: list[torch.Tensor] = []

    def init_info(self) -> dict[str, object]:
        return {"nccl_unique_id_b64": base64.b64encode(UID).decode()}

    def join(self, world_size: int) -> None:
        self.joined.append(world_size)

    def broadcast(self, buffer: torch.Tensor) -> None:
        assert buffer.dtype == torch.uint8 and buffer.dim() == 1
        self.sent.append(buffer.clone())

    def close(self) -> None:
        pass


def _tokenizer() -> Tokenizer:
    vocab = {f"t{i}": i for i in range(508)}
    for j, t in enumerate((BOS, EOS, END, PAD)):
        vocab[t] = 508 + j
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def _files(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                out[k] = h.get_tensor(k)
    return out


def _consumer_buffers(sizes: list[int], buffer_bytes: int) -> list[list[int]]:
    """The indices of each packed buffer vLLM 0.32's packed_nccl_broadcast_consumer receives: it appends
    tensors' metadata until their byte total exceeds packed_buffer_size_bytes, broadcasts, starts the next; at the
    end of the update info it broadcasts what remains."""
    out: list[list[int]] = [[]]
    total = 0
    for i, n in enumerate(sizes):
        out[-1].append(i)
        total += n
        if total > buffer_bytes:
            out.append([])
            total = 0
    return [b for b in out if b]


def _decode(infos: list[dict[str, Any]], sent: list[torch.Tensor], buffer_bytes: int) -> dict[str, torch.Tensor]:
    """The tensors the workers load, from the update infos and the broadcast buffers alone."""
    out: dict[str, torch.Tensor] = {}
    buffers = iter(sent)
    for info in infos:
        dtypes = [getattr(torch, d) for d in info["dtype_names"]]
        sizes = [math.prod(s) * d.itemsize for s, d in zip(info["shapes"], dtypes, strict=True)]
        for idx in _consumer_buffers(sizes, buffer_bytes):
            buf = next(buffers)
            assert buf.numel() == sum(sizes[i] for i in idx)
            pos = 0
            for i in idx:
                raw = buf[pos:pos + sizes[i]].clone()
                out[info["names"][i]] = raw.view(dtypes[i]).reshape(info["shapes"][i])
                pos += sizes[i]
    assert next(buffers, None) is None, "more broadcasts than the update infos describe"
    return out


def _assert_bitwise(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for k, t in want.items():
        assert got[k].dtype == t.dtype and got[k].shape == t.shape, k
        assert torch.equal(got[k].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), k


def _check_sequence(calls: list[tuple[str, str, Any]], versions: list[int]) -> list[list[dict[str, Any]]]:
    """The API's order: world size and init once, then per push pause, start, update_weights per bucket, finish,
    version tag, resume; the update infos of each push."""
    assert calls[0] == ("GET", "/get_world_size?include_dp=true", None)
    assert calls[1][:2] == ("POST", "/init_weight_transfer_engine")
    pushes: list[list[dict[str, Any]]] = []
    rest = calls[2:]
    for v in versions:
        assert [c[1] for c in rest[:2]] == ["/pause?mode=wait", "/start_weight_update"]
        n = next(i for i, c in enumerate(rest) if c[1] == "/finish_weight_update")
        updates = rest[2:n]
        assert updates and all(c[:2] == ("POST", "/update_weights") for c in updates)
        pushes.append([c[2]["update_info"] for c in updates])
        assert rest[n + 1] == ("POST", "/update_weight_version", {"new_version": str(v)})
        assert rest[n + 2][1] == "/resume"
        rest = rest[n + 3:]
    assert rest == []
    return pushes


@pytest.mark.parametrize("quant", ["none", "fp8"])
def test_transfer_sends_the_export_in_buckets_through_the_api(tmp_path: Path, quant: str) -> None:
    """Two servers (two workers and one): one init each with its rank offset; two pushes of different weights;
    every bucket within the bucket size unless one tensor exceeds it; the decoded broadcasts are the export's
    tensors bit for bit (fp8: a quantised weight larger than a bucket and its scale are two buffers of one
    request, as the worker cuts them)."""
    cfg = load_section(TrainerConfig, {"model": MOE, "device": "cpu"})
    servers = [FakeServer(2), FakeServer(1)]
    bucket = 20_000
    group = RecordingGroup(torch.device("cpu"))
    try:
        engine = VLLMEngine([s.url for s in servers], tmp_path / "unused")
        push = TransferPush(engine, bucket, group_factory=lambda _d: group)
        models_ = [build_model(cfg.model, device="cpu", dtype=torch.float32, seed=s) for s in (3, 4)]
        sent_per_push = []
        for version, m in zip((5, 6), models_, strict=True):

            @contextlib.contextmanager
            def weights(m: Any = m) -> Iterator[TrainerWeights]:
                state = m.state_dict()
                yield TrainerWeights(state, m.args, {k: v.dtype for k, v in state.items()}, quant)

            before = len(group.sent)
            stats = push.push(weights, version)
            sent_per_push.append(group.sent[before:])
            assert stats is not None and stats.bytes == sum(b.numel() for b in group.sent[before:])
        assert engine.version == 6 and group.joined == [4]  # trainer rank 0 + 2 + 1 workers, joined once
        for s, offset in zip(servers, (1, 3), strict=True):
            init = s.calls[1][2]["init_info"]
            assert init == {"nccl_unique_id_b64": base64.b64encode(UID).decode(), "world_size": 4, "packed": True,
                            "packed_buffer_size_bytes": bucket, "packed_num_buffers": 2, "rank_offset": offset}
        infos = _check_sequence(servers[0].calls, [5, 6])
        assert _check_sequence(servers[1].calls, [5, 6]) == infos
        split = False
        for m, push_infos, sent, name in zip(models_, infos, sent_per_push, ("a", "b"), strict=True):
            for info in push_infos:
                sizes = [math.prod(s) * getattr(torch, d).itemsize
                         for s, d in zip(info["shapes"], info["dtype_names"], strict=True)]
                outputs = {n.removesuffix("_scale_inv") for n in info["names"]}  # a weight and its scale: one
                assert sum(sizes) <= bucket or len(outputs) == 1
                split |= len(_consumer_buffers(sizes, bucket)) > 1
            _assert_bitwise(_decode(push_infos, sent, bucket), _files(export_hf(m, _tokenizer(), tmp_path / name,
                                                                                quant=quant)))
        assert split == (quant == "fp8")
    finally:
        for s in servers:
            s.close()


def test_the_vllm_engine_pushes_by_transfer_when_asked(tmp_path: Path) -> None:
    """rollout.weightPush transfer: the run's engine sends the weights through the API, writes no step folder, and
    pushes a version once."""
    cfg = load_section(TrainerConfig, {"model": MOE, "device": "cpu"})
    model = build_model(cfg.model, device="cpu", dtype=torch.float32, seed=3)

    @contextlib.contextmanager
    def weights() -> Iterator[TrainerWeights]:
        state = model.state_dict()
        yield TrainerWeights(state, model.args, {k: v.dtype for k, v in state.items()})

    def export(_d: Path) -> Path:
        raise AssertionError("a disk export on a transfer push")

    server = FakeServer(1)
    try:
        rollouts = VLLMRollouts(RolloutConfig(engine="vllm", servers=[server.url], weight_push="transfer",
                                              transfer_bucket_bytes=50_000), tmp_path)
        assert rollouts.transfer is not None
        rollouts.transfer.group_factory = RecordingGroup
        stats = rollouts.ensure(export, 2, weights)
        assert stats is not None and stats.version == 2 and rollouts.engine.version == 2
        assert rollouts.ensure(export, 2, weights) is None
        rollouts.close()
        _check_sequence(server.calls, [2])
    finally:
        server.close()
    assert not (tmp_path / "rollout-weights").exists()


def _cfg(root: Path, layout: dict[str, Any]) -> TrainerConfig:
    return load_section(TrainerConfig, {
        "model": MOE, "device": "cpu", "maxSteps": 1, "parallelism": layout, "stability": {"enabled": False},
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 4},
        "checkpoint": {"dir": str(root)}})


def _worker(rank: int, world: int, out: str, url: str) -> None:
    from trex.trainer.loop import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
    try:
        root = Path(out)
        tr = Trainer(_cfg(root / "ep2", {"ep": 2}), root, group=dist.group.WORLD, measure_peak=False,
                     log=lambda _m: None)
        group = RecordingGroup(torch.device("cpu"))
        push = TransferPush(VLLMEngine([url], root / "unused"), 30_000, rank, world, group_factory=lambda _d: group)
        stats = push.push(lambda: trainer_weights(tr), 1)
        assert (stats is None) == (rank != 0) and push.engine.version == 1
        if rank == 0:
            torch.save(group.sent, root / "sent.pt")
    finally:
        dist.destroy_process_group()


def test_transfer_from_two_sharded_ranks_equals_the_single_process_export(tmp_path: Path) -> None:
    """Experts split over two ep ranks (spawn, gloo): rank 1 sends its parts to rank 0 bucket by bucket, rank 0
    alone talks to the server; what it broadcasts is the single-process export of the same weights, bit for
    bit."""
    from trex.trainer.loop import Trainer

    server = FakeServer(1)
    try:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(_worker, args=(2, str(tmp_path), server.url), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
        infos = _check_sequence(server.calls, [1])[0]
    finally:
        server.close()
    single = Trainer(_cfg(tmp_path / "single", {}), tmp_path, measure_peak=False, log=lambda _m: None)
    want = _files(export_trainer(single, tmp_path / "single" / "hf"))
    _assert_bitwise(_decode(infos, torch.load(tmp_path / "sent.pt"), 30_000), want)


def test_transfer_is_refused_where_there_is_no_nccl() -> None:
    """weightPush transfer on a CPU trainer or with a spawnLocal (CPU) server: one line naming the field."""
    with pytest.raises(ValueError, match=r"weightPush: 'transfer'.*spawnLocal"):
        RolloutConfig(engine="vllm", spawn_local=True, weight_push="transfer")
    cfg = load_section(TrainerConfig, {"model": MOE, "device": "cpu", "mode": "grpo",
                                       "rollout": {"engine": "vllm", "servers": ["http://127.0.0.1:1"],
                                                   "weightPush": "transfer"}})
    problems = [p for p in job_problems(cfg, 1) if p[0] == "rollout.weightPush"]
    assert len(problems) == 1 and "NCCL" in problems[0][1] and "cpu" in problems[0][1]
    ok = load_section(TrainerConfig, {"model": MOE, "device": "cuda", "mode": "grpo",
                                      "rollout": {"engine": "vllm", "servers": ["http://127.0.0.1:1"],
                                                  "weightPush": "transfer"}})
    assert not [p for p in job_problems(ok, 1) if p[0] == "rollout.weightPush"]
    with pytest.raises(RuntimeError, match=r"rollout\.weightPush transfer: NCCL needs the trainer on cuda"):
        NcclGroup(torch.device("cpu"))
