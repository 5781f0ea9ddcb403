"""trex.fsio writes files with the mode a plain open() gives (0666 less the umask), not mkstemp's 0600,
so a reader under another uid (a model server, a later pod) can read a job's outputs."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from trex.fsio import atomic_write_bytes


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_default_umask_gives_world_readable_files(tmp_path: Path, umask: None) -> None:
    out = tmp_path / "report" / "summary.json"
    atomic_write_bytes(out, b"{}")
    reference = tmp_path / "plain.json"
    reference.write_bytes(b"{}")                      # what open() gives under the same umask
    assert _mode(out) == _mode(reference) == 0o644
    assert out.read_bytes() == b"{}"
    assert [p.name for p in out.parent.iterdir()] == ["summary.json"]   # no temp file left behind


def test_replacing_keeps_following_the_umask(tmp_path: Path) -> None:
    out = tmp_path / "model.safetensors"
    old = os.umask(0o077)
    try:
        atomic_write_bytes(out, b"a")
        assert _mode(out) == 0o600                    # a stricter umask is honoured too
        os.umask(0o002)
        atomic_write_bytes(out, b"b")
        assert _mode(out) == 0o664 and out.read_bytes() == b"b"
    finally:
        os.umask(old)
