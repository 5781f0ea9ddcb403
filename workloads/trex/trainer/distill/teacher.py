"""Teachers for on-policy distillation: lazily loaded trunks, cached pre-head hidden states, heads streamed
one teacher at a time.

Each teacher's weights are read from its folder the first time a batch needs it. Per batch, the teacher
pass runs each teacher's trunk once over its samples (the model's ``logits=False`` forward: the hidden
state after the final norm, and for mHC models after the head's hyper-connection mixing) and stores the
response positions' hidden states in a :class:`HiddenStateCache`; the trunk then leaves the accelerator.
The loss visits the teachers in order (the samples are sorted by teacher), with the next teacher's head
and hidden states copied to the device through the copy engine while the current teacher's KL computes.

Under a parallel layout (:class:`TeacherLayout`) each teacher is distributed as the student is (tensor and expert
parallelism, then FSDP2 shards: no rank holds a whole teacher) and every rank runs every teacher's trunk once per
batch, in configuration order (a rank none of whose samples a teacher scores runs it on one dummy token: the
trunk's forward holds collectives). The head each rank keeps on the host is its share of the vocabulary over the
data-parallel x tp ranks, cut from the FSDP2 shard it holds, for the vocabulary-parallel KL.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trex.runtime.copy_engine import CopyEngine, CopyHandle
from trex.trainer.distill.cache import HiddenStateCache
from trex.trainer.distill.folders import resolve_teacher_dir

if TYPE_CHECKING:
    from trex.trainer.model.model import DeepSeekModel
    from trex.trainer.model_args import ModelArgs
    from trex.trainer.parallel.mesh import Meshes, ParallelDims

def vocab_rows(vocab: int, dims: ParallelDims, rep: int, shard: int, tp_rank: int) -> tuple[int, int]:
    """The vocabulary rows [start, end) the rank at (dp_replicate, dp_shard, tp) coordinates scores in the
    vocabulary-parallel KL: its FSDP2 shard's rows of a head (torch.chunk over dp_shard, as FSDP2 splits dim 0)
    split evenly over that shard's dp_replicate x tp ranks, so each rank's rows lie inside the shard it holds."""
    size = -(-vocab // dims.dp_shard)
    first, last = min(shard * size, vocab), min((shard + 1) * size, vocab)
    parts, part = dims.dp_replicate * dims.tp, rep * dims.tp + tp_rank
    n = last - first
    return first + part * n // parts, first + (part + 1) * n // parts


def teacher_layout_problem(args: ModelArgs, dims: ParallelDims) -> str | None:
    """Why a teacher of shape ``args`` cannot be distributed by the student's degrees (None: it can)."""
    checks = [(dims.tp, args.num_heads, "tp", "attention head count"),
              (dims.ep, args.n_routed_experts, "ep", "routed expert count"),
              (dims.etp, args.moe_intermediate_size, "etp", "expert hidden size")]
    if args.attention == "csa":
        checks.append((dims.tp, args.o_groups, "tp", "output group count oGroups"))
    for degree, size, name, what in checks:
        if size % degree:
            return f"{name}={degree} does not divide the teacher's {what} {size}"
    fewest = min(b - a for a, b in (vocab_rows(args.vocab_size, dims, r, s, t) for s in range(dims.dp_shard)
                                    for r in range(dims.dp_replicate) for t in range(dims.tp)))
    if fewest == 0:
        return (f"the teacher's vocabulary {args.vocab_size} leaves a data-parallel x tp rank ({dims.dp} x "
                f"{dims.tp}) no rows of the vocabulary-parallel KL")
    return None


@dataclass
class TeacherLayout:
    """The student's parallel layout, which every teacher is distributed by (None in one process), and this rank's
    part of the vocabulary-parallel KL."""

    dims: ParallelDims
    meshes: Meshes
    rows: tuple[int, int] | None = None
    """This rank's vocabulary rows [start, end) of the teachers' heads (:func:`vocab_rows`); None: all."""

    def load(self, directory: Path, dtype: torch.dtype, device: torch.device) -> DeepSeekModel:
        """The teacher in ``directory`` built on the meta device, distributed like the student and stored in ``dtype``
        (frozen: no fp32 masters), filled with its weights (each rank reads only its own shards)."""
        from trex.trainer.build import distributed_model
        from trex.trainer.hf import args_from_hf_dir, load_hf_sharded

        model, _ = distributed_model(args_from_hf_dir(directory), self.dims, self.meshes, dtype, device, seed=0,
                                     frozen=True)
        load_hf_sharded(model, directory)
        return model

    def head(self, model: DeepSeekModel, dtype: torch.dtype) -> torch.Tensor:
        """This rank's vocabulary rows of the teacher's head, in ``dtype``: taken from the FSDP2 shard it already
        holds (:func:`vocab_rows` splits each FSDP2 shard's rows among its ranks), no collective and no whole head."""
        from trex.trainer.parallel.init import local_indices

        local, shape, index = local_indices(model.lm_head.weight.detach())
        start, end = self.rows if self.rows is not None else (0, shape[0])
        held = index[0]
        first = 0 if held is None else int(held[0]) if held.numel() else shape[0]
        if held is not None and not torch.equal(held, torch.arange(first, first + held.numel())):
            raise ValueError("the teacher's head is not sharded in contiguous rows")
        if start < first or end > first + local.shape[0]:
            raise ValueError(f"vocabulary rows {start}..{end} are not inside this rank's head shard "
                             f"{first}..{first + local.shape[0]}")
        return local[start - first:end - first].to(dtype).clone()


@dataclass
class TeacherStats:
    """Loads and switches since the last reset."""

    trunk_loads: int = 0
    """Teacher weights read from their folders."""
    head_loads: int = 0
    """Teacher heads copied to the device."""
    switches: int = 0
    """Changes of the head in use."""
    max_heads_on_device: int = 0
    """Most heads on the device at once (the one in use plus the one prefetching)."""


@dataclass
class Teacher:
    """One teacher: where it is, its weight, and (once loaded) its model and a host copy of its head."""

    label: str
    weight: float
    path: Path
    model: DeepSeekModel | None = None
    head: torch.Tensor | None = None


@dataclass
class Group:
    """The tokens one teacher scores: their flat indices into the batch's [B * L] positions."""

    label: str
    weight: float
    positions: torch.Tensor
    samples: list[int] = field(default_factory=list)


class TeacherPool:
    """The run's teachers, their hidden-state cache and the copy engine that streams heads to the device."""

    def __init__(self, teachers: Sequence[tuple[str, float, str | Path]], device: torch.device,
                 cache: HiddenStateCache, engine: CopyEngine, *, vocab_size: int, dtype: torch.dtype = torch.float32,
                 prefetch: bool = True, layout: TeacherLayout | None = None) -> None:
        self.teachers = {label: Teacher(label, weight, Path(path)) for label, weight, path in teachers}
        self.device = device
        self.cache = cache
        self.engine = engine
        self.vocab_size = vocab_size
        self.dtype = dtype
        self.prefetch = prefetch
        self.layout = layout
        self.stats = TeacherStats()
        self._on_device = 0

    @property
    def labels(self) -> list[str]:
        """Teacher labels in configuration order (the order batches are sorted in)."""
        return list(self.teachers)

    def _load(self, t: Teacher) -> DeepSeekModel:
        """The teacher's model, read from its folder on first use (in one process kept on the host between batches;
        distributed, its shards stay on the device)."""
        if t.model is None:
            from trex.trainer.hf import load_hf

            directory = resolve_teacher_dir(t.path)
            if self.layout is None:
                model = load_hf(directory, device="cpu", dtype=self.dtype)
            else:
                model = self.layout.load(directory, self.dtype, self.device)
            if model.args.vocab_size != self.vocab_size:
                raise ValueError(f"teacher {t.label}: vocabulary {model.args.vocab_size} != the student's "
                                 f"{self.vocab_size} (distillation needs one tokenizer)")
            model.eval().requires_grad_(False)
            t.model = model
            t.head = model.lm_head.weight.detach() if self.layout is None else self.layout.head(model, self.dtype).cpu()
            if self.device.type != "cpu":
                t.head = t.head.pin_memory()
            self.stats.trunk_loads += 1
        return t.model

    @torch.no_grad()
    def teacher_pass(self, input_ids: torch.Tensor, groups: Sequence[Group]) -> None:
        """Run each teacher's trunk once over its samples' rows of ``input_ids`` [B, L] and cache the hidden
        states at its positions (one trunk on the device at a time). Distributed: every teacher runs, in
        configuration order, on every rank (on one dummy token where this rank has no group for it)."""
        length = input_ids.shape[1]
        if self.layout is not None:
            mine = {g.label: g for g in groups}
            for label in self.labels:
                if label not in mine:
                    model = self._load(self.teachers[label])
                    model(torch.zeros(self._rows(1), 1, dtype=torch.long, device=self.device), logits=False)
                    _reshard(model)
                    continue
                self._cache_hidden(mine[label], input_ids, length)
            return
        for g in groups:
            self._cache_hidden(g, input_ids, length)

    def _rows(self, n: int) -> int:
        """Rows of a teacher forward for ``n`` samples: a multiple of tp (sequence parallelism splits its tokens over tp)."""
        tp = self.layout.dims.tp if self.layout is not None else 1
        return -(-n // tp) * tp

    def _cache_hidden(self, g: Group, input_ids: torch.Tensor, length: int) -> None:
        """One teacher's trunk over its rows; the hidden states at its positions go to the cache."""
        model = self._load(self.teachers[g.label])
        moves = self.device.type != "cpu" and self.layout is None
        if moves:
            model.to(self.device)
        rows = torch.tensor(g.samples + [g.samples[0]] * (self._rows(len(g.samples)) - len(g.samples)),
                            dtype=torch.long)
        out = model(input_ids[rows].to(self.device), logits=False)
        _reshard(model)
        assert out.hidden is not None
        # Flat batch positions -> positions within the teacher's own rows.
        local = {s: i for i, s in enumerate(g.samples)}
        pos = g.positions.cpu()
        index = torch.tensor([local[int(p) // length] for p in pos], dtype=torch.long) * length + pos % length
        hidden = out.hidden.reshape(-1, out.hidden.shape[-1])[index.to(self.device)]
        self.cache.put(g.label, hidden)
        if moves:
            model.to("cpu")

    def _start(self, g: Group) -> tuple[torch.Tensor, torch.Tensor, CopyHandle]:
        head = self.teachers[g.label].head
        assert head is not None, "teacher_pass loads every teacher it is given"
        hidden = (self.cache.get(g.label) if g.samples else  # a rank without tokens for this teacher
                  torch.empty((0, head.shape[1]), dtype=self.dtype))
        dst_h = torch.empty(hidden.shape, dtype=hidden.dtype, device=self.device)
        dst_w = torch.empty(head.shape, dtype=head.dtype, device=self.device)
        handle = self.engine.copy_many([(dst_h, hidden), (dst_w, head)])
        self.stats.head_loads += 1
        self._on_device += 1
        self.stats.max_heads_on_device = max(self.stats.max_heads_on_device, self._on_device)
        return dst_h, dst_w, handle

    def stream(self, groups: Sequence[Group]) -> Iterator[tuple[Group, torch.Tensor, torch.Tensor]]:
        """(group, teacher hidden states [n, D_t], teacher head [V, D_t]) on the device, one teacher after the
        other; with prefetch the next teacher's copies start before the current one is handed out. Each head is
        released (and the cache entry dropped) when the caller asks for the next."""
        pending = self._start(groups[0]) if groups else None
        for i, g in enumerate(groups):
            assert pending is not None
            hidden, head, handle = pending
            pending = self._start(groups[i + 1]) if self.prefetch and i + 1 < len(groups) else None
            handle.wait()
            if i:
                self.stats.switches += 1
            yield g, hidden, head
            del hidden, head
            self._on_device -= 1
            if g.samples:
                self.cache.drop(g.label)
            if pending is None and i + 1 < len(groups):
                pending = self._start(groups[i + 1])

    def take_stats(self) -> TeacherStats:
        """The counters since the last call (then reset)."""
        out, self.stats = self.stats, TeacherStats()
        return out

    def close(self) -> None:
        """Drop the cache's spill files."""
        self.cache.clear()


def _reshard(model: DeepSeekModel) -> None:
    """Free a distributed teacher's gathered root (embedding, head, norms) after its forward: FSDP2 keeps the root
    gathered for a backward that a frozen teacher never runs."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.reshard()


def teacher_groups(labels: Sequence[str], assigned: Sequence[Sequence[str]], mask: torch.Tensor,
                   weights: dict[str, float]) -> list[Group]:
    """Group the batch's scored positions by teacher, teachers in ``labels`` order (so each head is used
    once per batch however the samples interleave). ``assigned[b]``: the teachers of sample b; ``mask`` [B, L]:
    the positions whose next token is a response token."""
    flat = mask.reshape(-1)
    length = mask.shape[1]
    out = []
    for label in labels:
        samples = [b for b, names in enumerate(assigned) if label in names]
        if not samples:
            continue
        rows = torch.zeros(mask.shape[0], dtype=torch.bool)
        rows[samples] = True
        keep = flat & rows.repeat_interleave(length)
        positions = keep.nonzero().squeeze(1)
        if positions.numel():
            out.append(Group(label, weights[label], positions, samples))
    return out
