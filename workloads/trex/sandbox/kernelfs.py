"""``kernel-fs`` isolation: the bubblewrap command line of one run, and whether bubblewrap works here.

Each run gets a private mount namespace whose root holds only read-only binds of ``/usr`` (with the
merged-/usr symlinks), the interpreter's prefixes (stdlib and site-packages, not ``sys.path``
entries such as an editable project tree), the licence file and ``Limits.read_paths``; a
size-limited tmpfs work folder (:data:`WORKDIR`, the disk quota); a fresh /proc of its own PID
namespace (its global knobs, ``_boot.PROC_READ_ONLY``, read-only); a minimal /dev. No /sys, no host /tmp, no host sockets. ``--unshare-all`` (network
only with ``Limits.network``), ``--disable-userns`` (bwrap 0.8+; older ones, such as Ubuntu 22.04's
0.6, rely on the seccomp filter alone to refuse new user namespaces), ``--die-with-parent``, ``--new-session``,
``--cap-drop ALL``, ``--as-pid-1`` (the supervisor is init) and
the seccomp filter of :func:`trex.sandbox._boot.seccomp_filter` (the bootstrap's outer stage puts
it on descriptor 6). :func:`root_plan` is that root's file list; ``namespaces`` mode, where bwrap
cannot run, builds the same root from it in the bootstrap.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

from trex.sandbox._boot import PROC_READ_ONLY, RUNS, SECCOMP_FD

BWRAP_VAR = "TREX_SANDBOX_BWRAP"
WORKDIR = "/sandbox"
"""The run's tmpfs work folder inside the sandbox (its HOME, TMPDIR and cwd)."""
INPUTS = "/.trex-in"
"""Read-only bind of the host folder holding the program and its input files (copied into WORKDIR)."""
STATE = "/.trex"
"""A folder outside WORKDIR for the supervisor's own state (the fork counter)."""
_TOP_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ETC = ("/etc/ld.so.cache", "/etc/localtime")
_ETC_NET = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl/certs")
_ROOTS_PROBE = ("import json, os, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, "
                "sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]))")


def bwrap_path() -> str | None:
    """The bubblewrap binary (``TREX_SANDBOX_BWRAP`` or ``bwrap`` on PATH); ``off`` disables the mode."""
    wanted = os.environ.get(BWRAP_VAR, "")
    if wanted == "off":
        return None
    return wanted or shutil.which("bwrap")


@functools.cache
def interpreter_roots(python: str) -> tuple[str, ...]:
    """Folders ``python`` needs to start and import its site-packages: its prefixes (probed once)."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        raw = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
               os.path.dirname(os.path.realpath(sys.executable))]
    else:
        out = subprocess.run([python, "-I", "-c", _ROOTS_PROBE], capture_output=True, text=True, timeout=60,
                             check=True)
        raw = json.loads(out.stdout)
    found = {p for r in raw for p in (os.path.abspath(r), os.path.realpath(r))}
    return tuple(sorted(found))


def minimal_binds(paths: Sequence[str]) -> list[str]:
    """Existing paths outside /usr, without any that a shorter one already covers (pure but for stat)."""
    kept: list[str] = []
    for p in sorted({os.path.abspath(p) for p in paths}, key=len):
        if not os.path.exists(p) or p == "/":
            continue
        if any(p == k or p.startswith(k.rstrip("/") + "/") for k in ["/usr", *kept]):
            continue
        kept.append(p)
    return kept


def root_plan(roots: Sequence[str], network: bool) -> list[tuple[str, str, str]]:
    """The minimal root's files, outermost first: ``("ro", path, "")`` read-only binds of ``/usr``, ``roots``
    and a few /etc files, ``("link", path, target)`` the merged-/usr links (pure but for stat)."""
    plan = [("ro", "/usr", "")]
    for name in _TOP_LINKS:
        host = "/" + name
        if os.path.islink(host):
            plan.append(("link", host, os.readlink(host)))
        elif os.path.isdir(host):
            plan.append(("ro", host, ""))
    plan += [("ro", p, "") for p in minimal_binds([*roots, *_ETC, *(_ETC_NET if network else ())])]
    return plan


def plan_text(plan: Sequence[tuple[str, str, str]]) -> str:
    """:func:`root_plan` as the bootstrap reads it (``namespaces`` mode builds the root itself): one
    ``kind\tpath\ttarget`` line per entry."""
    return "\n".join("\t".join(entry) for entry in plan)


def _root(roots: Sequence[str], network: bool) -> list[str]:
    """bwrap options of the minimal root (:func:`root_plan`), a fresh /proc (its global knobs read-only) and
    /dev, and the state folder."""
    argv: list[str] = []
    for kind, path, target in root_plan(roots, network):
        argv += ["--symlink", target, path] if kind == "link" else ["--ro-bind", path, path]
    argv += ["--proc", "/proc"]
    for name in PROC_READ_ONLY:  # the host's entries: the same global knobs (net/ follows the reader's netns)
        argv += ["--ro-bind-try", f"/proc/{name}", f"/proc/{name}"]
    return [*argv, "--dev", "/dev", "--dir", STATE]


@functools.cache
def bwrap_version(bwrap: str) -> tuple[int, ...]:
    """The version ``bwrap --version`` reports (``bubblewrap 0.8.0`` -> (0, 8, 0)); () when it says none."""
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return parse_version(out)


def parse_version(text: str) -> tuple[int, ...]:
    """``bubblewrap X.Y.Z`` -> (X, Y, Z); () for any other text (pure)."""
    words = text.split()
    if len(words) != 2 or words[0] != "bubblewrap":
        return ()
    parts = words[1].split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else ()


DISABLE_USERNS_SINCE = (0, 8, 0)
"""bwrap's ``--disable-userns`` first release."""


def bwrap_command(bwrap: str, roots: Sequence[str], host_inputs: str, disk_mb: int, network: bool,
                  inner: Sequence[str]) -> list[str]:
    """The bwrap argv that runs ``inner`` in the minimal root described in the module docstring."""
    # --cap-drop: bwrap keeps a root caller's capabilities otherwise; --as-pid-1: the supervisor is the
    # namespace's init, which the program cannot signal.
    argv = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--as-pid-1"]
    if bwrap_version(bwrap) >= DISABLE_USERNS_SINCE:
        argv.append("--disable-userns")
    if network:
        argv.append("--share-net")
    return [*argv, *_root(roots, network), "--size", str(disk_mb << 20), "--tmpfs", WORKDIR,
            "--ro-bind", host_inputs, INPUTS, "--chdir", WORKDIR, "--seccomp", str(SECCOMP_FD), "--", *inner]


def warm_command(bwrap: str, roots: Sequence[str], host_runs: str) -> list[str]:
    """The bwrap prefix of the warm fork server: the same minimal root, every run's inputs read-only at
    ``RUNS``, and the capabilities of its own user namespace, which each run gives up (see ``_warm_job``).
    No ``--disable-userns``: its nested namespace would lock the mounts a run must make; the run's
    seccomp filter refuses new user namespaces instead."""
    return [bwrap, "--unshare-all", "--unshare-user", "--new-session", "--cap-add", "ALL",
            *_root(roots, False), "--dir", WORKDIR, "--ro-bind", host_runs, RUNS, "--"]
