"""Atomic, verified checkpoints with torch.distributed.checkpoint (DCP).

Layout under the checkpoint root::

    step-00000100/            DCP shards (__<rank>_0.distcp) + .metadata, then manifest.json
    step-00000100.tmp-<pid>/  being written; never read, removed on the next start

A save writes into the temp dir, fsyncs every file, renames it to ``step-N`` and only then writes
``manifest.json`` (step, every file's size and sha256, config hash) atomically. A checkpoint without a
manifest is incomplete. Loading verifies every hash first; a corrupt or truncated checkpoint raises
:class:`CheckpointCorruptError` naming the file, and :meth:`CheckpointManager.load_latest` falls back
to the previous one. Works in a single process without ``init_process_group``.
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


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fsync_tree(path: Path) -> None:
    for f in sorted(path.rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(path)


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


class CheckpointManager:
    """Saves and restores model, optimizers and an ``extra`` mapping (pickled) under one root directory."""

    def __init__(self, root: str | Path, keep_last: int = 3, cfg_hash: str = "", group: Any = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.root = Path(root)
        self.keep_last = keep_last
        self.cfg_hash = cfg_hash
        self.group = group
        self.log = log or (lambda _msg: None)

    # --- discovery --------------------------------------------------------------------------
    def step_dirs(self) -> list[tuple[int, Path]]:
        """Renamed (complete or not) step dirs, newest first."""
        if not self.root.is_dir():
            return []
        out = [(int(m.group(1)), p) for p in self.root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
        return sorted(out, reverse=True)

    def verify(self, path: Path) -> dict[str, Any]:
        """The manifest of ``path`` after checking every listed file's size and sha256."""
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
            if sha256_file(f) != meta["sha256"]:
                raise CheckpointCorruptError(f"checkpoint {path.name}: file {name} fails its sha256 check")
        return dict(manifest)

    def latest_step(self) -> int | None:
        """Step of the newest checkpoint that passes verification, without loading it."""
        for step, path in self.step_dirs():
            try:
                self.verify(path)
                return step
            except CheckpointCorruptError:
                continue
        return None

    # --- save -------------------------------------------------------------------------------
    def save(self, step: int, model: nn.Module, optimizers: list[torch.optim.Optimizer],
             extra: dict[str, Any], before_commit: Callable[[Path], None] | None = None) -> Path:
        """Write checkpoint ``step`` atomically and prune to keep_last; returns its directory.
        ``before_commit(dir)`` runs on rank 0 after the shards are written and before the rename and the
        manifest, so whatever it adds (a Hugging Face export) is hashed and appears atomically with them."""
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
        blob = io.BytesIO()
        torch.save(extra, blob)
        state = {"model": model_sd, "optim": optim_sd, "extra": blob.getvalue()}
        with warnings.catch_warnings():  # single-process use is intended; DCP warns about it
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp_save(state, checkpoint_id=str(tmp), process_group=self.group)
        _barrier(self.group, active)
        if rank == 0:
            if before_commit is not None:
                before_commit(tmp)
            _fsync_tree(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_dir(self.root)
            files = {
                str(f.relative_to(final)): {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
                for f in sorted(final.rglob("*")) if f.is_file() and f.name != MANIFEST
            }
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
        """Verify ``path`` and restore model and optimizers in place; returns the ``extra`` mapping."""
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        manifest = self.verify(path)
        if self.cfg_hash and manifest.get("config_hash") not in ("", self.cfg_hash):
            self.log(f"checkpoint {path.name} was written with a different config (hash "
                     f"{manifest.get('config_hash')} vs {self.cfg_hash}); resuming anyway")
        model_sd, optim_sd = get_state_dict(model, optimizers)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "extra": b""}
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
                dcp_load(state, checkpoint_id=str(path), process_group=self.group)
        except Exception as e:  # DCP wraps reader errors per rank; name the checkpoint
            raise CheckpointCorruptError(f"checkpoint {path.name} could not be read: {e}") from e
        set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"])
        extra: dict[str, Any] = torch.load(io.BytesIO(state["extra"]), weights_only=False)
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
                self.verify(path)
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
