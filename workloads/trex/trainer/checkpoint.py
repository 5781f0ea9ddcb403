"""Atomic, verified checkpoints with torch.distributed.checkpoint (DCP).

Layout under the checkpoint root::

    step-00000100/            DCP shards (__<rank>_0.distcp) + .metadata, extra-<rank>.pt, then manifest.json
    step-00000100.tmp-<pid>/  being written; never read, removed on the next start

A save writes into the temp dir; each rank fsyncs and sha256-hashes the files it wrote itself (its DCP shard, whole
and per 16 MiB block; its ``extra-<rank>.pt``; rank 0 also ``.metadata``) right after writing them, and rank 0
gathers those small digests, renames the dir to ``step-N`` and only then writes ``manifest.json`` (step, every
file's size, sha256, block digests and writing rank, config hash) atomically. A checkpoint without a manifest is
incomplete.

``extra`` (RNG streams, counters, snapshots) is stored per rank, its tensors on the host: a resume restores
each rank's own streams (a rank the saving run did not have gets rank 0's). Loading verifies, once, only the
files the rank reads (``.metadata``, its extra file and the blocks of the DCP shards its load plan reads); a corrupt or
truncated file raises :class:`CheckpointCorruptError` naming the checkpoint, the file and the rank, and
:meth:`CheckpointManager.load_latest` falls back to the previous one on every rank. :meth:`latest_step` reads
manifests and file sizes, never hashes. Works in a single process without ``init_process_group``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.futures import Future

from trex.fsio import atomic_write_bytes, fsync_dir

MANIFEST = "manifest.json"
FORMAT = "trex-dcp-1"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointCorruptError(RuntimeError):
    """A checkpoint failed verification; the message names the checkpoint and the offending file."""


@dataclass(frozen=True)
class Loaded:
    """What :meth:`CheckpointManager.load_latest` restored."""

    step: int
    path: Path
    extra: dict[str, Any]


BLOCK = 16 << 20
"""DCP shard files are also hashed in blocks of this many bytes: DCP stores a replicated tensor once, in one rank's
file, so every rank reads a little of other ranks' files; it verifies the blocks it reads, not those files whole."""


def file_digests(path: Path, block: int = BLOCK) -> tuple[str, list[str]]:
    """Hex sha256 of a file's bytes and of each of its ``block``-byte blocks, in one pass."""
    whole = hashlib.sha256()
    blocks: list[str] = []
    with open(path, "rb") as fh:
        while data := fh.read(block):
            whole.update(data)
            blocks.append(hashlib.sha256(data).hexdigest())
    return whole.hexdigest(), blocks


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON to ``path`` via a temp file, fsync and rename."""
    atomic_write_bytes(path, json.dumps(data, indent=1, sort_keys=True).encode())


def config_hash(data: dict[str, Any]) -> str:
    """Stable hash of a JSON-able config mapping."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _dist_ready(group: Any) -> tuple[int, bool]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), True
    return 0, False


def _barrier(group: Any, active: bool) -> None:
    if active:
        import torch.distributed as dist

        dist.barrier(group=group)


def _gather(obj: Any, group: Any, active: bool) -> list[Any]:
    """Every rank's ``obj`` (small: file digests, error lines) on every rank; [obj] in one process. Planned as
    trex.trainer.plan.GATHERED_DIGEST_BYTES per digest x the ranks (the checkpoint phase's host term)."""
    if not active:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _to_host(obj: Any) -> Any:
    """``obj`` with every tensor in it detached and copied to the host (so a resume needs no device to read it)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_to_host(v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def extra_name(rank: int) -> str:
    """The file of one rank's extra state."""
    return f"extra-{rank:05d}.pt"


class CheckpointManager:
    """Saves and restores model, optimizers and a per-rank ``extra`` mapping (pickled) under one root directory.

    ``hashed_bytes`` counts the bytes this rank has sha256-hashed (saves and loads), for the lifecycle benchmark."""

    def __init__(self, root: str | Path, keep_last: int = 3, cfg_hash: str = "", group: Any = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.root = Path(root)
        self.keep_last = keep_last
        self.cfg_hash = cfg_hash
        self.group = group
        self.log = log or (lambda _msg: None)
        self.hashed_bytes = 0

    # --- discovery --------------------------------------------------------------------------
    def step_dirs(self) -> list[tuple[int, Path]]:
        """Renamed (complete or not) step dirs, newest first."""
        if not self.root.is_dir():
            return []
        out = [(int(m.group(1)), p) for p in self.root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
        return sorted(out, reverse=True)

    def manifest(self, path: Path) -> dict[str, Any]:
        """The manifest of ``path`` after checking that every listed file exists with its size (no hashing)."""
        mpath = path / MANIFEST
        if not mpath.is_file():
            raise CheckpointCorruptError(f"checkpoint {path.name} is incomplete: {MANIFEST} is missing")
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointCorruptError(f"checkpoint {path.name}: {MANIFEST} is unreadable ({e})") from None
        if manifest.get("format") != FORMAT:
            raise CheckpointCorruptError(f"checkpoint {path.name}: unknown format {manifest.get('format')!r}")
        for name, meta in sorted(manifest["files"].items()):
            f = path / name
            if not f.is_file():
                raise CheckpointCorruptError(f"checkpoint {path.name}: file {name} is missing")
            size = f.stat().st_size
            if size != meta["bytes"]:
                raise CheckpointCorruptError(
                    f"checkpoint {path.name}: file {name} is truncated or altered ({size} bytes, expected {meta['bytes']})")
        return dict(manifest)

    def verify(self, path: Path, files: list[str] | None = None) -> dict[str, Any]:
        """The manifest of ``path`` after checking the size and sha256 of ``files`` (default: every listed file)."""
        manifest = self.manifest(path)
        listed = manifest["files"]
        for name in sorted(listed) if files is None else files:
            if name not in listed:
                raise CheckpointCorruptError(f"checkpoint {path.name}: file {name} is not in its {MANIFEST}")
            if self._sha256(path / name) != listed[name]["sha256"]:
                raise CheckpointCorruptError(f"checkpoint {path.name}: file {name} fails its sha256 check")
        return manifest

    def _sha256(self, path: Path) -> str:
        self.hashed_bytes += path.stat().st_size
        return sha256_file(path)

    def _entry(self, path: Path, rank: int) -> dict[str, Any]:
        """A written file's manifest entry: size, sha256, writing rank and (DCP shards) per-block sha256."""
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
        entry: dict[str, Any] = {"bytes": path.stat().st_size, "rank": rank}
        self.hashed_bytes += entry["bytes"]
        if path.suffix == ".distcp":
            entry["sha256"], entry["blocks"] = file_digests(path)
        else:
            entry["sha256"] = sha256_file(path)
        return entry

    def verify_range(self, path: Path, listed: dict[str, Any], name: str, start: int, stop: int,
                     checked: set[tuple[str, int]]) -> None:
        """Check the blocks of file ``name`` that bytes [start, stop) lie in against ``listed`` (the manifest's
        files) block digests (the whole file when it has none), skipping those in ``checked``, adding those checked."""
        digests = listed[name].get("blocks")
        if digests is None:
            if (name, -1) not in checked:
                self.verify(path, [name])
                checked.add((name, -1))
            return
        with open(path / name, "rb") as fh:
            for b in range(start // BLOCK, -(-stop // BLOCK)):
                if (name, b) in checked:
                    continue
                fh.seek(b * BLOCK)
                data = fh.read(BLOCK)
                self.hashed_bytes += len(data)
                if hashlib.sha256(data).hexdigest() != digests[b]:
                    raise CheckpointCorruptError(f"checkpoint {path.name}: file {name} fails its sha256 check "
                                                 f"(bytes {b * BLOCK}-{b * BLOCK + len(data)})")
                checked.add((name, b))

    def latest_step(self) -> int | None:
        """Step of the newest checkpoint whose manifest is present and whose files have their sizes (no hashing)."""
        for step, path in self.step_dirs():
            try:
                self.manifest(path)
                return step
            except CheckpointCorruptError:
                continue
        return None

    # --- save -------------------------------------------------------------------------------
    def save(self, step: int, model: nn.Module, optimizers: list[torch.optim.Optimizer],
             extra: dict[str, Any], before_commit: Callable[[Path], None] | None = None) -> Path:
        """Write checkpoint ``step`` atomically and prune to keep_last; returns its directory. ``extra`` is this
        rank's own (stored per rank, tensors on the host).

        Each rank hashes the files it wrote; the digests reach rank 0 by ``all_gather_object`` (a few hundred bytes
        per rank). ``before_commit(dir)`` runs on rank 0 after the shards are written and before the rename and the
        manifest, so whatever it adds (a Hugging Face export) is hashed (by rank 0) and appears atomically with
        them."""
        from torch.distributed.checkpoint.filesystem import FileSystemWriter
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        rank, active = _dist_ready(self.group)
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step-{step:08d}"
        tmp = self.root / f"step-{step:08d}.tmp-{os.environ.get('TREX_ATTEMPT', '0')}"
        if rank == 0 and tmp.exists():
            shutil.rmtree(tmp)
        _barrier(self.group, active)
        model_sd, optim_sd = get_state_dict(model, optimizers)
        state = {"model": model_sd, "optim": optim_sd}
        with warnings.catch_warnings():  # single-process use is intended; DCP warns about it
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp_save(state, storage_writer=FileSystemWriter(str(tmp), sync_files=False), process_group=self.group)
        blob = io.BytesIO()
        torch.save(_to_host(extra), blob)
        (tmp / extra_name(rank)).write_bytes(blob.getvalue())
        mine = [tmp / extra_name(rank), *sorted(tmp.glob(f"__{rank}_*.distcp"))]
        if rank == 0:
            mine.append(tmp / ".metadata")
        files = {f.name: self._entry(f, rank) for f in mine}
        gathered = _gather(files, self.group, active)
        if rank == 0:
            for part in gathered:
                files.update(part)
            if before_commit is not None:
                before_commit(tmp)
            for f in sorted(tmp.rglob("*")):
                name = str(f.relative_to(tmp))
                if f.is_file() and name not in files:  # what before_commit added
                    files[name] = self._entry(f, 0)
            fsync_dir(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_dir(self.root)
            write_json_atomic(final / MANIFEST, {"format": FORMAT, "step": step, "files": files,
                                                 "config_hash": self.cfg_hash, "created": time.time()})
            self._prune()
        _barrier(self.group, active)
        return final

    def _prune(self) -> None:
        complete = [(s, p) for s, p in self.step_dirs() if (p / MANIFEST).is_file()]
        for _, path in complete[self.keep_last:]:
            shutil.rmtree(path, ignore_errors=True)
        newest = complete[0][0] if complete else -1
        for s, path in self.step_dirs():
            if not (path / MANIFEST).is_file() and s < newest:
                shutil.rmtree(path, ignore_errors=True)
        for p in self.root.iterdir():
            if ".tmp-" in p.name and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)

    # --- load -------------------------------------------------------------------------------
    def load(self, path: Path, model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
        """Restore ``path`` into model and optimizers in place, verifying once each file this rank reads; returns
        this rank's ``extra`` mapping (rank 0's when the saving run had no rank of this number)."""
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        rank, active = _dist_ready(self.group)
        manifest = self.manifest(path)
        if self.cfg_hash and manifest.get("config_hash") not in ("", self.cfg_hash):
            self.log(f"checkpoint {path.name} was written with a different config (hash "
                     f"{manifest.get('config_hash')} vs {self.cfg_hash}); resuming anyway")
        legacy = extra_name(0) not in manifest["files"]  # written before extra state was per rank: one copy in DCP
        extra_file = extra_name(rank) if extra_name(rank) in manifest["files"] else extra_name(0)
        error = ""
        try:
            self.verify(path, [".metadata"] if legacy else [".metadata", extra_file])
        except CheckpointCorruptError as e:
            error = f"rank {rank}: {e}"
        errors = [e for e in _gather(error, self.group, active) if e]
        if errors:
            raise CheckpointCorruptError("; ".join(errors))
        if extra_file != extra_name(rank) and not legacy:
            self.log(f"checkpoint {path.name} has no extra state of rank {rank}; using rank 0's")
        model_sd, optim_sd = get_state_dict(model, optimizers)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd} | ({"extra": b""} if legacy else {})
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
                dcp_load(state, storage_reader=_VerifyingReader(self, path, manifest["files"], rank),
                         process_group=self.group)
        except CheckpointException as e:  # DCP gathers every rank's failure; name the corrupt files
            corrupt = [str(exc) for exc, _ in e.failures.values() if isinstance(exc, CheckpointCorruptError)]
            raise CheckpointCorruptError("; ".join(corrupt) or f"checkpoint {path.name} could not be read: {e}") from None
        except Exception as e:  # a reader error outside DCP's own wrapping (one process)
            raise CheckpointCorruptError(f"checkpoint {path.name} could not be read: {e}") from e
        set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"])
        blob = state["extra"] if legacy else (path / extra_file).read_bytes()
        extra: dict[str, Any] = torch.load(io.BytesIO(blob), weights_only=False)
        return extra

    def load_latest(self, model: nn.Module, optimizers: list[torch.optim.Optimizer],
                    rebuild: Callable[[], tuple[nn.Module, list[torch.optim.Optimizer]]] | None = None,
                    ) -> tuple[Loaded | None, nn.Module, list[torch.optim.Optimizer]]:
        """Restore the newest loadable checkpoint, falling back past corrupt ones (each logged).

        A failed attempt may have touched the objects, so ``rebuild`` (when given) supplies fresh ones
        before the next attempt. Returns (what was loaded or None, model, optimizers).
        """
        dirty = False
        for step, path in self.step_dirs():
            try:
                self.manifest(path)
            except CheckpointCorruptError as e:
                self.log(f"{e}; falling back to the previous checkpoint")
                continue
            if dirty and rebuild is not None:
                model, optimizers = rebuild()
            try:
                dirty = True
                extra = self.load(path, model, optimizers)
            except CheckpointCorruptError as e:
                self.log(f"{e}; falling back to the previous checkpoint")
                continue
            return Loaded(step, path, extra), model, optimizers
        if dirty and rebuild is not None:
            model, optimizers = rebuild()
        return None, model, optimizers


class _VerifyingReader(FileSystemReader):
    """DCP's file reader that first checks, against the manifest, the sha256 of each block of the shard files this
    rank's load plan reads (each block once)."""

    def __init__(self, manager: CheckpointManager, path: Path, listed: dict[str, Any], rank: int) -> None:
        super().__init__(str(path))
        self.manager, self.ckpt, self.listed, self.own_rank = manager, path, listed, rank
        self.checked: set[tuple[str, int]] = set()

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Verify the blocks ``plan`` reads (CheckpointCorruptError naming the rank), then read them."""
        spans = sorted((info.relative_path, info.offset, info.offset + info.length)
                       for info in (self.storage_data[item.storage_index] for item in plan.items))
        try:
            for name, start, stop in spans:
                if name not in self.listed:
                    raise CheckpointCorruptError(f"checkpoint {self.ckpt.name}: file {name} is not in its {MANIFEST}")
                self.manager.verify_range(self.ckpt, self.listed, name, start, stop, self.checked)
        except CheckpointCorruptError as e:
            raise CheckpointCorruptError(f"rank {self.own_rank}: {e}") from None
        return super().read_data(plan, planner)
