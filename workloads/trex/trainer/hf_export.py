"""Distributed Hugging Face export: every rank writes the output tensors it owns; nothing is gathered whole.

Every rank computes the same plan from the global shapes and the DTensor placements (no communication):
each output tensor (one HF name: a renamed parameter, one expert of a stack, V4's gate_up_proj made of two
parameters, V3's MTP copies of the embedding and head) is a list of pieces of our parameters. Its owner is the
rank holding most of it (ties: the rank with the fewest bytes to write so far), so replicated tensors spread
over their replicas and experts are written by the ep rank that holds them. The owner receives only that
tensor's missing pieces (point-to-point, from one holder per distinct box, cast to the export dtype), so a
rank holds its shards plus one output tensor at a time. The owner quantises the whole tensor, so the FP8
128 x 128 and FP4 1 x 32 block grids are never cut by a rank's slice, and streams it into its own
safetensors file at an offset fixed by the header it wrote first (the sizes are known from the plan).
Files are ``model-0000i-of-0000n.safetensors``, each written by one rank (a rank whose tensors exceed
``max_shard_bytes`` writes several); rank 0 writes the index from the same plan.

Why not DCP's ``HuggingFaceStorageWriter(save_distributed=True)``: it writes our parameter names and boxes
(row slices of stacked experts, split over files by rank), so the per-expert split, V4's gate_up
concatenation, the MTP copies and per-tensor quantisation would all fall to its consolidation step, which
re-reads and rewrites every byte; the owner plan writes the final files once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from trex.fsio import atomic_write_bytes

if TYPE_CHECKING:
    import torch

    from trex.trainer.model.args import ModelArgs

Box = tuple[tuple[int, ...], tuple[int, ...]]
"""(global offset, shape) of a region of a tensor."""

_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64", "float8_e4m3fn": "F8_E4M3",
              "int8": "I8", "uint8": "U8", "int32": "I32", "int64": "I64", "bool": "BOOL"}


@dataclass(frozen=True)
class Piece:
    """A region of one of our tensors that lands in an output tensor."""

    src: str
    box: Box
    """The region, in the source tensor's coordinates."""
    dst: tuple[int, ...]
    """Where its first element lands, in the output's coordinates."""
    squeeze: bool = False
    """The region's dim 0 (size 1: one expert of a stack) is not an output dim."""


@dataclass
class Output:
    """One stored tensor (before quantisation) and who writes it."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    pieces: list[Piece]
    owner: int = 0
    sends: list[tuple[int, Piece, Box]] = field(default_factory=list)
    """(sending rank, piece, region of the source it sends), in the order the owner receives them."""
    file: str = ""


def _whole(src: str, shape: tuple[int, ...]) -> Piece:
    return Piece(src, ((0,) * len(shape), shape), (0,) * len(shape))


def _expert(src: str, shape: tuple[int, ...], e: int) -> Piece:
    return Piece(src, ((e,) + (0,) * (len(shape) - 1), (1, *shape[1:])), (0,) * (len(shape) - 1), squeeze=True)


def output_pieces(shapes: Mapping[str, tuple[int, ...]], args: ModelArgs,
                  layout: str = "hf") -> dict[str, tuple[tuple[int, ...], list[Piece]]]:
    """Output name -> (shape, pieces): the same tensors as hf.to_hf_state_dict, as regions of our tensors."""
    from trex.trainer.hf import check_hf_compatible

    check_hf_compatible(args)
    if args.attention == "csa":
        return _v4_pieces(shapes, args, layout == "original")
    if layout != "hf":
        raise ValueError(f"layout={layout!r}: DeepSeek-V3 checkpoints are written with the HF names only")
    from trex.trainer.hf import v3_mtp_copies, v3_stored_name

    out: dict[str, tuple[tuple[int, ...], list[Piece]]] = {}
    for name, shape in shapes.items():
        stored = v3_stored_name(name, args.num_layers)
        if "{e}" in stored:
            for e in range(shape[0]):
                out[stored.format(e=e)] = (shape[1:], [_expert(name, shape, e)])
        else:
            out[stored] = (shape, [_whole(name, shape)])
    for hf_name, ours in v3_mtp_copies(args.num_layers, args.mtp_depth).items():
        out[hf_name] = (shapes[ours], [_whole(ours, shapes[ours])])
    return out


def _v4_pieces(shapes: Mapping[str, tuple[int, ...]], args: ModelArgs,
               original: bool) -> dict[str, tuple[tuple[int, ...], list[Piece]]]:
    """hf_v4.to_v4_state_dict's tensors as pieces (gate_up_proj: gate rows then up rows of each expert)."""
    from trex.trainer.hf_v4 import _SHARED, _stored_name

    out: dict[str, tuple[tuple[int, ...], list[Piece]]] = {}
    hash_gates = {f"layers.{i}.mlp.gate" for i in range(args.n_hash_layers)}
    stacks: set[str] = set()
    for name, shape in shapes.items():
        em = re.match(r"(.*\.mlp\.experts)\.(gate_proj|up_proj|down_proj)$", name)
        if em:
            stacks.add(em.group(1))
        elif not (name.endswith("e_score_correction_bias") and name.rsplit(".", 1)[0] in hash_gates):
            out[_stored_name(name, original)] = (shape, [_whole(name, shape)])
    for prefix in sorted(stacks):
        stored = _stored_name(prefix + ".x", original)[: -len(".x")]
        gate, up, down = (f"{prefix}.{k}" for k in ("gate_proj", "up_proj", "down_proj"))
        if original:
            for src in (gate, down, up):
                kind = _SHARED[src.rsplit(".", 1)[1]]
                for e in range(shapes[src][0]):
                    out[f"{stored}.{e}.{kind}.weight"] = (shapes[src][1:], [_expert(src, shapes[src], e)])
            continue
        n_exp, inter, dim = shapes[gate]
        out[f"{stored}.gate_up_proj"] = ((n_exp, 2 * inter, dim), [
            _whole(gate, shapes[gate]), Piece(up, ((0, 0, 0), shapes[up]), (0, inter, 0))])
        out[f"{stored}.down_proj"] = (shapes[down], [_whole(down, shapes[down])])
    return out


# --- who holds what ------------------------------------------------------------------------------------
def local_boxes(state: Mapping[str, torch.Tensor]) -> list[Box | None]:
    """This rank's box of every tensor of ``state`` (in order; None where its shard is empty): a DTensor's
    from its placements and this rank's mesh coordinate, a plain tensor whole."""
    out: list[Box | None] = []
    for t in state.values():
        local, offset = _local(t)
        shape = tuple(local.shape)
        out.append((offset, shape) if all(n > 0 for n in shape) else None)
    return out


def gather_holders(state: Mapping[str, torch.Tensor], distributed: bool) -> dict[str, list[tuple[int, Box]]]:
    """(rank, box) of every non-empty shard of every tensor, over all ranks: each rank's boxes all-gathered
    (small metadata: a DTensor's mesh only names the ranks of this rank's own sub-mesh, so replicas elsewhere
    are only known this way; planned as trex.trainer.plan.GATHERED_BOX_BYTES per tensor x the ranks)."""
    import torch.distributed as dist

    mine = local_boxes(state)
    every: list[Any] = [mine]
    if distributed:
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
    held: dict[str, list[tuple[int, Box]]] = {name: [] for name in state}
    for rank, boxes in enumerate(every):
        for name, box in zip(state, boxes, strict=True):
            if box is not None:
                held[name].append((rank, box))
    return held


def _intersect(a: Box, b: Box) -> Box | None:
    lo = tuple(max(x, y) for x, y in zip(a[0], b[0], strict=True))
    hi = tuple(min(x + n, y + m) for x, n, y, m in zip(a[0], a[1], b[0], b[1], strict=True))
    if any(h <= low for low, h in zip(lo, hi, strict=True)):
        return None
    return lo, tuple(h - low for low, h in zip(lo, hi, strict=True))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def plan_outputs(shapes: Mapping[str, tuple[int, ...]], held: Mapping[str, list[tuple[int, Box]]], args: ModelArgs,
                 dtypes: Mapping[str, torch.dtype], world: int, layout: str = "hf") -> list[Output]:
    """Every output tensor with its owner and transfers, sorted by name (the same on every rank, given the
    same holders)."""
    pieces = output_pieces(shapes, args, layout)
    outputs = [Output(name, shape, dtypes[ps[0].src], ps) for name, (shape, ps) in sorted(pieces.items())]
    load = [0] * world
    for i, o in sorted(enumerate(outputs), key=lambda io: (-_numel(io[1].shape), io[1].name)):
        have = [0] * world
        for p in o.pieces:
            for rank, box in held[p.src]:
                part = _intersect(p.box, box)
                have[rank] += _numel(part[1]) if part else 0
        o.owner = min(range(world), key=lambda r: (-have[r], load[r], r))
        load[o.owner] += _numel(o.shape) * o.dtype.itemsize
        add_sends(o, held, o.owner, i)
    return outputs


def add_sends(o: Output, held: Mapping[str, Sequence[tuple[int, Box]]], owner: int, i: int) -> None:
    """Which rank sends each part of ``o``'s pieces to ``owner``: the owner itself where it holds the part, else one
    of the part's holders (spread over them by the output's index ``i``)."""
    for p in o.pieces:
        boxes: dict[Box, list[int]] = {}
        for rank, box in held[p.src]:
            boxes.setdefault(box, []).append(rank)
        for box, ranks in boxes.items():
            part = _intersect(p.box, box)
            if part is not None:
                o.sends.append((owner if owner in ranks else ranks[i % len(ranks)], p, part))


# --- writing -------------------------------------------------------------------------------------------
def _kind(o: Output, quant: str) -> str | None:
    """How ``o`` is stored under ``quant``: 'fp8', 'fp4' or None (the export dtype)."""
    from trex.trainer.quant_io import quant_kind

    if quant == "none":
        return None
    return quant_kind(o.name, len(o.shape), o.dtype.is_floating_point, quant == "fp8-fp4")


def _entries(o: Output, quant: str) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    from trex.trainer.quant_io import quantized_entries

    return quantized_entries(o.name, o.shape, _kind(o, quant), o.dtype)


def assign_files(outputs: list[Output], quant: str, world: int, max_shard_bytes: int) -> list[str]:
    """Set every output's file (each rank's outputs in name order, a new file past max_shard_bytes); the names."""
    per_rank: list[list[list[Output]]] = [[] for _ in range(world)]
    sizes = [0] * world
    for o in outputs:
        nbytes = sum(_numel(s) * d.itemsize for _, s, d in _entries(o, quant))
        files = per_rank[o.owner]
        if not files or (files[-1] and sizes[o.owner] + nbytes > max_shard_bytes):
            files.append([])
            sizes[o.owner] = 0
        files[-1].append(o)
        sizes[o.owner] += nbytes
    groups = [g for files in per_rank for g in files]
    if len(groups) == 1:
        names = [SINGLE_FILE]
    else:
        names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    for fname, group in zip(names, groups, strict=True):
        for o in group:
            o.file = fname
    return names


SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def _header(entries: list[tuple[str, tuple[int, ...], torch.dtype]]) -> tuple[bytes, dict[str, int]]:
    """The safetensors header (length prefix included) for ``entries`` stored in order; name -> data offset."""
    meta: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offsets: dict[str, int] = {}
    pos = 0
    for name, shape, dtype in entries:
        nbytes = _numel(shape) * dtype.itemsize
        meta[name] = {"dtype": _ST_DTYPES[str(dtype).removeprefix("torch.")], "shape": list(shape),
                      "data_offsets": [pos, pos + nbytes]}
        offsets[name] = pos
        pos += nbytes
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, offsets


def _region(t: torch.Tensor, lo: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
    return t[tuple(slice(a, a + n) for a, n in zip(lo, shape, strict=True))]


def _local(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """This rank's shard of ``t`` and its global offset."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t, (0,) * t.dim()
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(list(t.shape), t.device_mesh, list(t.placements))
    return t.to_local(), tuple(offset)


def _dst_box(p: Piece, part: Box) -> Box:
    """A region of p's source (inside p.box) in the output's coordinates."""
    rel = tuple(a - b for a, b in zip(part[0], p.box[0], strict=True))
    shape = part[1]
    if p.squeeze:
        rel, shape = rel[1:], shape[1:]
    return tuple(d + r for d, r in zip(p.dst, rel, strict=True)), shape


def _src_box(p: Piece, dst: Box) -> Box:
    """A region of the output (inside p's image) in p's source coordinates."""
    rel = tuple(a - d for a, d in zip(dst[0], p.dst, strict=True))
    if p.squeeze:
        return (p.box[0][0], *(b + r for b, r in zip(p.box[0][1:], rel, strict=True))), (1, *dst[1])
    return tuple(b + r for b, r in zip(p.box[0], rel, strict=True)), dst[1]


def _chunks(o: Output, quant: str, chunk_bytes: int) -> list[Box]:
    """The row ranges (dim 0) of ``o`` its owner assembles, quantises and writes one at a time, about
    ``chunk_bytes`` each: whole experts of a stack, whole 128-row FP8 block rows of a matrix, so every chunk
    quantises exactly as the whole tensor does."""
    if not o.shape:
        return [((), ())]
    unit = 128 if _kind(o, quant) == "fp8" and len(o.shape) == 2 else 1
    row = max(1, _numel(o.shape[1:]) * o.dtype.itemsize)
    rows = max(unit, chunk_bytes // row // unit * unit)
    rest = tuple(0 for _ in o.shape[1:])
    return [((r, *rest), (min(rows, o.shape[0] - r), *o.shape[1:])) for r in range(0, o.shape[0], rows)]


def _chunk_sends(o: Output, chunk: Box) -> list[tuple[int, Piece, Box, Box]]:
    """(sender, piece, source region, output region) of every part of ``chunk``, in the order received."""
    out = []
    for sender, p, part in o.sends:
        region = _intersect(_dst_box(p, part), chunk)
        if region is not None:
            out.append((sender, p, _src_box(p, region), region))
    return out


def _send_part(state: Mapping[str, torch.Tensor], p: Piece, part: Box, dtype: torch.dtype) -> torch.Tensor:
    local, offset = _local(state[p.src])
    lo = tuple(a - o for a, o in zip(part[0], offset, strict=True))
    data = _region(local.detach(), lo, part[1]).to(dtype)
    return data.reshape(part[1][1:]) if p.squeeze else data


def write_outputs(state: Mapping[str, torch.Tensor], outputs: list[Output], directory: Path, quant: str,
                  rank: int, distributed: bool, chunk_bytes: int = 64 * 1024**2) -> None:
    """Assemble and write this rank's outputs, one chunk at a time (collective: every rank must call it with
    the same plan)."""
    import torch
    import torch.distributed as dist

    from trex.trainer.quant_io import quantize_tensors

    mine: dict[str, list[Output]] = {}
    for o in outputs:
        if o.owner == rank:
            mine.setdefault(o.file, []).append(o)
    cursor: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        handles: dict[str, BinaryIO] = {}
        for fname, group in mine.items():
            head, offs = _header([e for o in group for e in _entries(o, quant)])
            handles[fname] = stack.enter_context(open(directory / fname, "wb"))
            handles[fname].write(head)
            cursor.update({name: len(head) + off for name, off in offs.items()})
        for o in outputs:
            for chunk in _chunks(o, quant, chunk_bytes):
                parts = _chunk_sends(o, chunk)
                if o.owner != rank:
                    for sender, p, src, _ in parts:
                        if sender == rank:
                            dist.send(_send_part(state, p, src, o.dtype).contiguous(), dst=o.owner)
                    continue
                device = _local(state[o.pieces[0].src])[0].device
                buf = torch.empty(chunk[1], dtype=o.dtype, device=device)
                for sender, p, src, region in parts:
                    if sender == rank:
                        data = _send_part(state, p, src, o.dtype)
                    elif distributed:
                        data = torch.empty(region[1], dtype=o.dtype, device=device)
                        dist.recv(data, src=sender)
                    else:
                        raise RuntimeError(f"{o.name}: rank {sender} holds a part, but this is one process")
                    lo = tuple(a - c for a, c in zip(region[0], chunk[0], strict=True))
                    _region(buf, lo, region[1]).copy_(data)
                stored = quantize_tensors({o.name: buf}, quant == "fp8-fp4") if quant != "none" else {o.name: buf}
                out = handles[o.file]
                for name, t in stored.items():
                    data_bytes = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
                    out.seek(cursor[name])
                    out.write(data_bytes.data)
                    cursor[name] += data_bytes.nbytes
                del buf, stored
        for handle in handles.values():
            handle.flush()
            os.fsync(handle.fileno())


def write_index(outputs: list[Output], quant: str, directory: Path) -> None:
    """model.safetensors.index.json (weight map and total size) from the plan."""
    weight_map: dict[str, str] = {}
    total = 0
    for o in outputs:
        for name, shape, dtype in _entries(o, quant):
            weight_map[name] = o.file
            total += _numel(shape) * dtype.itemsize
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    atomic_write_bytes(directory / INDEX_FILE, json.dumps(index, indent=2).encode())


def save_hf_distributed(state: Mapping[str, torch.Tensor], args: ModelArgs, directory: Path,
                        dtypes: Mapping[str, torch.dtype], quant: str = "none", layout: str = "hf",
                        max_shard_bytes: int = 5 * 1024**3, chunk_bytes: int = 64 * 1024**2) -> list[str]:
    """Every rank writes the output tensors it owns into ``directory`` (which must exist); rank 0 also the
    index (when more than one file) and config.json. Collective when torch.distributed is initialised; the
    files written (all ranks')."""
    import torch.distributed as dist

    from trex.trainer.hf import CONFIG_NAME, QUANT_MODES, hf_config_from_args
    from trex.trainer.quant_io import quantization_config

    if quant not in QUANT_MODES:
        raise ValueError(f"checkpoint.exportQuant={quant!r}: allowed {', '.join(QUANT_MODES)}")
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    world, rank = (dist.get_world_size(), dist.get_rank()) if distributed else (1, 0)
    held = gather_holders(state, distributed)
    outputs = plan_outputs({k: tuple(v.shape) for k, v in state.items()}, held, args, dtypes, world, layout)
    names = assign_files(outputs, quant, world, max_shard_bytes)
    write_outputs(state, outputs, directory, quant, rank, distributed, chunk_bytes)
    if rank == 0:
        if len(names) > 1:
            write_index(outputs, quant, directory)
        first = next(iter(dtypes.values()))
        cfg = hf_config_from_args(args, dtype=str(first).removeprefix("torch."))
        if quant != "none":
            cfg["quantization_config"] = quantization_config(fp4_experts=quant == "fp8-fp4")
        atomic_write_bytes(directory / CONFIG_NAME, json.dumps(cfg, indent=2).encode())
    return names
