"""Load a Hugging Face checkpoint folder into a (possibly distributed) model, each rank reading only the boxes its
local shards hold.

For every parameter and buffer the DTensor's placements give the global indices this rank holds
(trex.trainer.parallel.init.local_indices: the whole tensor in one process); the stored tensor(s) behind the
name give where those indices lie on disk:

* one stored tensor (most names);
* one half of a stored tensor's dim 1 (transformers' fused ``gate_up_proj`` [E, 2I, D]);
* one stored tensor per routed expert (``experts.E.gate_proj.weight`` / ``E.w1.weight``), stacked along dim 0:
  only the experts this rank holds are read.

Quantized tensors are dequantized per box (trex.trainer.quant_io.read_dequantized). Which stored tensor feeds which
name is asked of the layouts' own mapping (trex.trainer.hf / hf_v4 ``from_*_state_dict``), run on tiny probe
tensors that carry the stored tensors' positions, so both layouts (transformers' and DeepSeek's original names)
load exactly as the whole-folder mapping would. The value is copied into the local shard in place: no rank
holds a whole tensor it does not own, and no full state dict is built.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trex.trainer.hfio.reader import SafetensorsFolder
from trex.trainer.quant_io import dequantized_shape, read_dequantized, scale_siblings

if TYPE_CHECKING:
    from trex.trainer.model.model import DeepSeekModel

ToModel = Callable[["DeepSeekModel", dict[str, torch.Tensor]], dict[str, torch.Tensor]]
"""A layout's mapping from stored tensors to the model's names (trex.trainer.hf.model_state_from_stored); passed
in so this reader depends on no layout module."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    """Where one of the model's tensors lies in the checkpoint."""

    keys: tuple[str, ...]
    """One stored tensor, or (``stacked``) one per index of dim 0."""
    half: int | None = None
    """0 or 1: the first or second half of the stored tensor's dim 1 (fused gate and up projections)."""
    stacked: bool = False


@dataclass(frozen=True)
class LoadStats:
    """What one rank's load read."""

    bytes_read: int
    tensors: int


def sources_for(model: DeepSeekModel, keys: list[str], to_model: ToModel) -> dict[str, Source]:
    """Each model name the stored tensors ``keys`` (scale siblings excluded) map to, with its source.

    The layout's mapping runs on probes: stored tensor i becomes [[i+1, -(i+1)]], so a name that receives [1, 2]
    comes from one tensor, [1, 1] from one half of one (the sign says which), [E, 1, 2] from one per expert."""
    probes = {k: torch.tensor([[i + 1, -(i + 1)]]) for i, k in enumerate(keys)}
    ours = to_model(model, probes)
    out: dict[str, Source] = {}
    for name, p in ours.items():
        if tuple(p.shape) == (1, 2):
            out[name] = Source((keys[int(p[0, 0]) - 1],))
        elif tuple(p.shape) == (1, 1):
            v = int(p[0, 0])
            out[name] = Source((keys[abs(v) - 1],), half=0 if v > 0 else 1)
        elif p.dim() == 3 and tuple(p.shape[1:]) == (1, 2):
            out[name] = Source(tuple(keys[int(i) - 1] for i in p[:, 0, 0]), stacked=True)
        else:
            raise ValueError(f"{name}: the checkpoint mapping combines stored tensors in a way the sliced load "
                             f"does not know (probe shape {tuple(p.shape)})")
    return out


def _index_box(index: torch.Tensor | None, size: int) -> tuple[tuple[int, int], torch.Tensor | None]:
    """The range [start, stop) covering a dim's held indices, and the positions to select in it when they are
    not that whole range."""
    if index is None:
        return (0, size), None
    if index.numel() == 0:
        return (0, 0), None
    start, stop = int(index.min()), int(index.max()) + 1
    if index.numel() == stop - start and bool((index == torch.arange(start, stop)).all()):
        return (start, stop), None
    return (start, stop), index - start


class _Reader:
    """Values of boxes of the model's names, read from one folder."""

    def __init__(self, folder: SafetensorsFolder, scales: dict[str, str]) -> None:
        self.folder = folder
        self.scales = scales

    def shape(self, key: str) -> tuple[int, ...]:
        st = self.folder.tensors[key]
        return dequantized_shape(st.shape, st.dtype, key in self.scales)

    def value_shape(self, src: Source) -> tuple[int, ...]:
        """The global shape of the model tensor ``src`` describes."""
        shape = self.shape(src.keys[0])
        if src.half is not None:
            shape = (shape[0], shape[1] // 2, *shape[2:])
        return (len(src.keys), *shape) if src.stacked else shape

    def stored_box(self, key: str, box: list[tuple[int, int]]) -> torch.Tensor:
        st = self.folder.tensors[key]
        return read_dequantized(self.folder.read, key, self.scales.get(key), st.dtype, self.shape(key), box)

    def box(self, src: Source, box: list[tuple[int, int]]) -> torch.Tensor:
        """The value of ``box`` of the model tensor ``src`` describes."""
        if src.stacked:
            parts = [self.box(Source((k,), src.half), box[1:]) for k in src.keys[box[0][0]:box[0][1]]]
            if not parts:
                return torch.empty([b - a for a, b in box])
            return torch.stack(parts)
        if src.half is not None:
            shift = src.half * (self.shape(src.keys[0])[1] // 2)
            box = [box[0], (box[1][0] + shift, box[1][1] + shift), *box[2:]]
        return self.stored_box(src.keys[0], box)


@torch.no_grad()
def load_sliced(model: DeepSeekModel, directory: str | os.PathLike[str], to_model: ToModel) -> LoadStats:
    """Fill ``model``'s tensors (parameters and buffers; DTensors or plain) from the checkpoint folder, reading
    only the boxes each rank holds. Missing names (besides the hash routers' unused biases, and the MTP modules
    when the checkpoint has none), extra tensors and shape mismatches raise ValueError naming them."""
    from trex.trainer.parallel.init import local_indices

    state_names = list(model.state_dict())
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    with SafetensorsFolder(directory) as folder:
        scales = scale_siblings(folder.tensors)
        used = set(scales.values())
        sources = sources_for(model, sorted(k for k in folder.tensors if k not in used), to_model)
        reader = _Reader(folder, scales)
        _check_names(model, state_names, sources)
        for name, src in sources.items():
            want = tuple(tensors[name].shape)
            if reader.value_shape(src) != want:
                raise ValueError(f"{name}: checkpoint shape {reader.value_shape(src)} != model shape {want}")
        for name, src in sources.items():
            local, shape, index = local_indices(tensors[name])
            boxes = [_index_box(ix, n) for ix, n in zip(index, shape, strict=True)]
            value = reader.box(src, [b for b, _ in boxes])
            for dim, (_, pick) in enumerate(boxes):
                if pick is not None:
                    value = value.index_select(dim, pick)
            local.copy_(value)
        return LoadStats(folder.bytes_read, len(sources))


def _check_names(model: DeepSeekModel, state_names: list[str], sources: dict[str, Source]) -> None:
    """Raise ValueError unless the checkpoint covers the model (as the whole-folder load required)."""
    hash_bias = {f"{name}.e_score_correction_bias" for name, g in model.moe_gates() if g.hash_routed}
    state = set(state_names)
    missing = sorted(k for k in state_names if k not in sources and k not in hash_bias)
    unexpected = sorted(k for k in sources if k not in state)
    absent_mtp = sorted({k.split(".")[1] for k in missing if k.startswith("mtp.")})
    present_mtp = {k.split(".")[1] for k in sources if k.startswith("mtp.")}
    if absent_mtp and not present_mtp & set(absent_mtp):
        # transformers drops MTP layers when it saves; keep the freshly initialised MTP modules.
        log.warning("HF checkpoint has no MTP layers; MTP module(s) %s keep their initial weights",
                    ", ".join(absent_mtp))
        missing = [k for k in missing if not k.startswith("mtp.")]
    if missing or unexpected:
        raise ValueError(f"HF checkpoint does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
