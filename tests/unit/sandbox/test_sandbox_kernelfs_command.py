"""The bubblewrap command line: options the installed bwrap lacks are left out (Ubuntu 22.04 ships 0.6)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trex.sandbox import kernelfs


@pytest.mark.parametrize(("text", "version"), [
    ("bubblewrap 0.8.0\n", (0, 8, 0)), ("bubblewrap 0.6.1", (0, 6, 1)), ("bubblewrap 0.11.0\n", (0, 11, 0)),
    ("bwrap: unknown option", ()), ("", ()), ("bubblewrap 0.8.0-rc1", ()),
])
def test_parse_version(text: str, version: tuple[int, ...]) -> None:
    assert kernelfs.parse_version(text) == version


@pytest.mark.parametrize(("reported", "disables"), [("0.6.1", False), ("0.8.0", True), ("0.10.0", True)])
def test_disable_userns_only_where_bwrap_has_it(tmp_path: Path, reported: str, disables: bool) -> None:
    fake = tmp_path / f"bwrap-{reported}"
    fake.write_text(f"#!/bin/sh\necho bubblewrap {reported}\n")
    fake.chmod(0o755)
    argv = kernelfs.bwrap_command(str(fake), ["/opt/py"], str(tmp_path), 16, False, ["python3", "-c", "pass"])
    assert ("--disable-userns" in argv) is disables
    assert argv[0] == str(fake) and argv[argv.index("--") + 1:] == ["python3", "-c", "pass"]
    assert "--seccomp" in argv  # the filter that refuses new user namespaces either way
