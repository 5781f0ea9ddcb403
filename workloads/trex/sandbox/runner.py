"""Parent side of the sandbox: prepare a directory, start the guarded child, watch it, clean up."""

from __future__ import annotations

import asyncio
import atexit
import functools
import hashlib
import hmac
import json
import os
import secrets
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from trex.sandbox import kernelfs
from trex.sandbox._boot import (
    CONFIG_KEYS,
    EXEC_MARK,
    MAX_RECORDS,
    RECORDS_FD,
    RECORDS_HEADER,
    RUNS,
)
from trex.sandbox.protocol import parse_protocol

SCRIPT_NAME = "main.py"
ID_VAR = "TREX_SANDBOX_ID"
_ENV_ALLOW = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "GRB_LICENSE_FILE", "GUROBI_HOME",
              "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_BOOT_SOURCE = (Path(__file__).with_name("_boot.py")).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run (per process for CPU time and address space)."""

    timeout_s: float = 20.0
    """Wall-clock limit (s); the whole process tree is killed when it passes."""
    cpu_s: int = 20
    """CPU-time limit per process (s), RLIMIT_CPU (SIGXCPU)."""
    memory_mb: int = 2048
    """Address-space limit per process (MiB), RLIMIT_AS."""
    max_processes: int = 64
    """Processes the program may have at once (RLIMIT_NPROC in its user namespace; fork budget otherwise)."""
    max_file_mb: int = 64
    """Largest file the program may write (MiB), RLIMIT_FSIZE; also caps collected files."""
    max_open_files: int = 256
    """Open file descriptors, RLIMIT_NOFILE."""
    network: bool = False
    """Allow network access (default: none, own empty network namespace)."""
    max_output_kb: int = 1024
    """Captured stdout and stderr, each (KiB); a program that writes more is killed (output_limit)."""
    allow_subprocess: bool = False
    """Allow the program to run other programs (exec); off because exec'd programs escape the file guard."""
    read_paths: tuple[str, ...] = ()
    """Extra files or folders the program may read (the interpreter's own folders are always readable)."""
    max_disk_mb: int = 256
    """Size of the tmpfs work folder (``kernel-fs``): everything the program writes, together (MiB)."""
    max_model_kb: int = 4096
    """LP text kept per recorded solve (KiB); a larger model is recorded without it (``lp_truncated``)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
                raise ValueError(f"Limits.{f.name} must be > 0, got {value!r}")
        if not isinstance(self.read_paths, tuple):
            raise ValueError("Limits.read_paths must be a tuple of paths")


@dataclass
class SandboxResult:
    """What a sandboxed run produced and how it ended."""

    stdout: str
    stderr: str
    exit_code: int | None
    """Exit status when the program exited normally, else None."""
    signal: int | None
    """Signal that ended the program, else None."""
    timed_out: bool
    wall_s: float
    killed_reason: str | None
    """timeout, output_limit, cpu_limit, memory_limit, file_size_limit, disk_limit, process_limit or signal:NAME."""
    result: dict[str, Any] | None
    """The printed protocol record (see :func:`trex.sandbox.parse_protocol`): what the program *says*."""
    files: dict[str, bytes] = field(default_factory=dict)
    """Collected output files, by the relative name asked for (missing ones are absent)."""
    mode: str = ""
    """Isolation used: ``kernel-fs`` (bubblewrap), ``namespaces`` (kernel namespaces and the same minimal
    root, set up by the bootstrap) or ``audit`` (audit-hook guard only)."""
    solves: list[dict[str, Any]] = field(default_factory=list)
    """What the instrumented solvers recorded, one dict per ``optimize``/``run`` call, in order: ``api``,
    ``status``, ``objective``, ``num_vars``, ``num_constrs``, ``lp`` (text or None), ``lp_truncated``."""
    process_limit: str = ""
    """How ``max_processes`` was enforced: ``cgroup`` (pids.max), ``rlimit`` (RLIMIT_NPROC) or ``guard``."""
    uid: int | None = None
    """The unprivileged uid of its own the program ran as, when privileges were dropped."""
    records_refused: str | None = None
    """Why the solve records were refused (a line the recorder did not write; ``solves`` is then empty)."""

    @property
    def solve(self) -> dict[str, Any] | None:
        """The last recorded solve (the program's answer), or None when it never called a solver."""
        return self.solves[-1] if self.solves else None

    @property
    def objective(self) -> float | None:
        """Objective of the last recorded solve."""
        return None if self.solve is None else self.solve["objective"]

    @property
    def status(self) -> str | None:
        """Status of the last recorded solve."""
        return None if self.solve is None else self.solve["status"]

    @property
    def ok(self) -> bool:
        """Exit code 0, no signal, no timeout."""
        return self.exit_code == 0 and self.signal is None and not self.timed_out


# ---------------------------------------------------------------------------------------------
# isolation mode


def namespaces_available(python: str | None = None) -> bool:
    """Whether a ``namespaces`` run of ``python`` (default: this interpreter) works here: user (or, as root, a
    uid of its own), mount, PID and network namespaces, the minimal root and the seccomp filter."""
    return _namespaces_available(python or sys.executable)


@functools.cache
def _namespaces_available(python: str) -> bool:
    """Probed once per interpreter, by a run."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        probe = _run("import os\nos.listdir('.')\n", "namespaces", Limits(timeout_s=60.0, cpu_s=60), {}, (),
                     python, None)
    except (OSError, KeyError, ValueError, subprocess.SubprocessError):
        return False
    return probe.ok


DROP_VAR = "TREX_SANDBOX_DROP_UID"
# Runs that drop privileges get a uid of their own from this range (not in /etc/passwd).
RUN_UID_BASE = 0x5A000000
RUN_UID_SPAN = 1 << 24
_DROP_PROBE = "\n".join([
    "import os, sys, json, socket, signal, resource, ctypes, types, selectors, fcntl",
    "for p in sys.path:",
    "    if os.path.isdir(p):",
    "        os.listdir(p)",
])


@functools.cache
def uid_drop_available(python: str) -> bool:
    """Whether runs can drop to a uid of their own: we are root and that uid can start ``python``.

    Probed once per interpreter by starting it as an unprivileged uid (it fails where the
    interpreter or its site-packages live in a folder only their owner may read).
    """
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return False
    probe_uid = RUN_UID_BASE + RUN_UID_SPAN  # just past the run range
    try:
        probe = subprocess.run([python, "-I", "-c", _DROP_PROBE], user=probe_uid,
                               group=probe_uid, extra_groups=[], cwd="/", stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


MODE_VAR = "TREX_SANDBOX_MODE"
CGROUP_VAR = "TREX_SANDBOX_CGROUP"


ISOLATION_LEVELS = ("audit", "namespaces", "kernel-fs")
"""Isolation modes, weakest first."""


@functools.cache
def kernel_fs_available(python: str) -> bool:
    """Whether bubblewrap runs ``python`` here with every option of the mode, cold (probed once per interpreter)."""
    if kernelfs.bwrap_path() is None or not sys.platform.startswith("linux"):
        return False
    return _probe_kernel_fs(python, warm=False)


@functools.cache
def warm_kernel_fs_available(python: str) -> bool:
    """Whether the warm kernel-fs fork server works for ``python`` here (probed once per interpreter)."""
    return kernel_fs_available(python) and _probe_kernel_fs(python, warm=True)


def _probe_kernel_fs(python: str, warm: bool) -> bool:
    try:
        probe = _run("import os\nos.listdir('.')\n", "kernel-fs", Limits(timeout_s=60.0, cpu_s=60), {}, (),
                     python, None, warm=warm)
    except (OSError, KeyError, ValueError, subprocess.SubprocessError):
        return False
    return probe.ok


def isolation_mode(python: str | None = None) -> str:
    """The strongest mode that works here: ``kernel-fs`` (bubblewrap), ``namespaces``, else ``audit``;
    ``TREX_SANDBOX_MODE`` may force one (RuntimeError when the forced one cannot run)."""
    wanted = os.environ.get(MODE_VAR, "auto")
    if wanted not in ("auto", *ISOLATION_LEVELS):
        raise ValueError(f"{MODE_VAR} must be auto, {', '.join(ISOLATION_LEVELS)}, got {wanted!r}")
    if wanted == "audit":
        return "audit"
    if wanted in ("auto", "kernel-fs") and kernel_fs_available(python or sys.executable):
        return "kernel-fs"
    if wanted == "kernel-fs":
        raise RuntimeError(f"{MODE_VAR}=kernel-fs but bubblewrap cannot run here (install the bubblewrap package)")
    if namespaces_available(python):
        return "namespaces"
    if wanted == "namespaces":
        raise RuntimeError(f"{MODE_VAR}=namespaces but user namespaces with mounts and a fresh /proc are not "
                           "allowed here")
    return "audit"


def require_isolation(minimum: str, python: str | None = None) -> str:
    """The mode runs will use, or RuntimeError saying why it is weaker than ``minimum`` (a job's
    ``sandbox.minIsolation``): untrusted code is not run under a weaker boundary than asked for."""
    if minimum not in ISOLATION_LEVELS:
        raise ValueError(f"sandbox.minIsolation must be one of {', '.join(ISOLATION_LEVELS)}, got {minimum!r}")
    mode = isolation_mode(python)
    if ISOLATION_LEVELS.index(mode) < ISOLATION_LEVELS.index(minimum):
        hint = ("install bubblewrap (Debian package bubblewrap) and allow user namespaces"
                if minimum == "kernel-fs" else "allow unprivileged user namespaces with mounts and a fresh /proc")
        hint += " (docs/cluster.md, 'Sandbox isolation')"
        raise RuntimeError(f"sandbox.minIsolation is {minimum} but only {mode} isolation is available here: {hint}")
    return mode


@functools.cache
def pids_cgroup_base() -> Path | None:
    """The writable cgroup (v1 ``pids`` hierarchy, or v2 with ``pids`` delegated) we may nest runs under."""
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    v1 = next((ln.split(":", 2)[2] for ln in own if "pids" in ln.split(":", 2)[1].split(",")), None)
    v2 = next((ln.split(":", 2)[2] for ln in own if ln.startswith("0::")), None)
    for line in mounts:
        left, _, right = line.partition(" - ")
        fstype, _, opts = [*right.split(" "), "", "", ""][:3]
        mountpoint = left.split(" ")[4]
        if fstype == "cgroup" and "pids" in opts.split(",") and v1 is not None:
            base = Path(mountpoint) / v1.lstrip("/")
        elif fstype == "cgroup2" and v2 is not None:
            base = Path(mountpoint) / v2.lstrip("/")
            try:
                if "pids" not in (base / "cgroup.subtree_control").read_text().split():
                    continue
            except OSError:
                continue
        else:
            continue
        if (base / "cgroup.procs").exists() and os.access(base, os.W_OK):
            return base
    return None


CGROUP_PREFIX = "trex-sandbox-"
# rmdir only succeeds on an empty cgroup; an empty one this old is not between creation and use.
STALE_CGROUP_S = 600.0
_PENDING_CGROUPS: list[Path] = []
_PENDING_LOCK = threading.Lock()


@functools.cache
def _sweep_stale_cgroups(base: Path) -> None:
    """Once per process: remove empty run cgroups left by processes that died before cleaning up."""
    now = time.time()
    for cg in base.glob(CGROUP_PREFIX + "*"):
        try:
            if now - cg.stat().st_mtime > STALE_CGROUP_S:
                cg.rmdir()  # fails harmlessly while a process is still inside
        except OSError:
            pass


def _make_cgroup(sandbox_id: str, max_processes: int) -> Path | None:
    """A per-run pids cgroup with ``pids.max``; None where cgroups are not writable here."""
    if os.environ.get(CGROUP_VAR, "auto") == "off":
        return None
    base = pids_cgroup_base()
    if base is None:
        return None
    _sweep_stale_cgroups(base)
    with _PENDING_LOCK:
        pending = list(_PENDING_CGROUPS)
        _PENDING_CGROUPS.clear()
    for old in pending:
        _remove_cgroup(old, wait_s=0.0)
    cg = base / f"{CGROUP_PREFIX}{sandbox_id}"
    try:
        cg.mkdir()
    except OSError:
        return None
    try:
        (cg / "pids.max").write_text(str(max_processes))
        return cg
    except OSError:
        _remove_cgroup(cg)
        return None


def _remove_cgroup(cg: Path, wait_s: float = 5.0) -> None:
    """rmdir the run's cgroup, SIGKILLing what is still inside; retried later if it stays busy."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            cg.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            pass
        try:
            pids = [int(p) for p in (cg / "cgroup.procs").read_text().split()]
        except OSError:
            pids = []
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        if time.monotonic() >= deadline:
            with _PENDING_LOCK:
                _PENDING_CGROUPS.append(cg)
            return
        time.sleep(0.005)


@atexit.register
def _remove_pending_cgroups() -> None:
    with _PENDING_LOCK:
        pending = list(_PENDING_CGROUPS)
        _PENDING_CGROUPS.clear()
    for cg in pending:
        _remove_cgroup(cg, wait_s=1.0)


# ---------------------------------------------------------------------------------------------
# helpers


def _boot_args(cfg: dict[str, Any], command: Sequence[str] = ()) -> list[str]:
    """The bootstrap's argv (see ``_boot.CONFIG_KEYS``): no JSON, the child starts faster without it."""
    fixed = [cfg[k] for k in CONFIG_KEYS]  # booleans as "1"/"0"
    args = [("1" if v else "0") if isinstance(v, bool) else str(v) for v in fixed] + list(cfg["read"])
    return [*args, EXEC_MARK, *command] if command else args


def _safe_relpath(name: str, what: str) -> str:
    p = Path(name)
    if not name or p.is_absolute() or ".." in p.parts:
        raise ValueError(f"{what}: {name!r} must be a relative path inside the sandbox")
    return str(p)


def _child_env(home: str, sandbox_id: str, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "TMPDIR": home,
           "LANG": "C.UTF-8", ID_VAR: sandbox_id}
    env.update({k: os.environ[k] for k in _ENV_ALLOW if k in os.environ})
    for k in _THREAD_VARS:
        env.setdefault(k, "1")
    for k, v in (extra or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"env: {k!r} must map a string to a string")
        env[k] = v
    env[ID_VAR] = sandbox_id
    return env


@dataclass
class _Stream:
    """One pipe the parent drains: up to ``cap`` bytes kept; past it the run is killed (``fatal``) or the
    rest is read and dropped."""

    fd: int
    cap: int
    fatal: bool
    data: bytearray = field(default_factory=bytearray)
    overflow: bool = False


def _pump(streams: Sequence[_Stream], exited: Callable[[], bool], deadline: float) -> tuple[bool, bool]:
    """Drain ``streams`` until EOF, the deadline or a fatal overflow; returns (timed_out, fatal overflow)."""
    by_fd = {s.fd: s for s in streams}
    sel = selectors.DefaultSelector()
    for fd in by_fd:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    timed_out = fatal = False
    exited_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if exited_at is None and exited():
                exited_at = now
            if exited_at is not None and now - exited_at > 0.5:
                break  # pipes held open by a leftover background process
            for key, _ in sel.select(timeout=min(deadline - now, 0.1)):
                st = by_fd[int(key.fd)]
                try:
                    chunk = os.read(st.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(st.fd)
                    continue
                if len(st.data) <= st.cap:
                    st.data += chunk
                if len(st.data) > st.cap:
                    st.overflow = True
                    fatal = fatal or st.fatal
            if fatal:
                break
    finally:
        sel.close()
    return timed_out, fatal


def _decode(data: bytes, cap: int) -> str:
    if len(data) <= cap:
        return data.decode("utf-8", errors="replace")
    head = data[:cap].decode("utf-8", errors="replace")
    return head + f"\n[trex.sandbox: output truncated at {cap} bytes]\n"


def _processes_with_marker(marker: bytes) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                if marker in fh.read():
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _kill_tree(pgid: int, mode: str, sandbox_id: str) -> None:
    """SIGKILL the process group; in audit mode also every process carrying this run's marker."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if mode != "audit" or not Path("/proc/self/environ").exists():
        return  # namespaces: the kernel kills the whole PID namespace when its init dies
    marker = f"{ID_VAR}={sandbox_id}\0".encode()
    for _ in range(100):
        pids = [p for p in _processes_with_marker(marker) if p != os.getpid()]
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def classify(*, timed_out: bool, overflow: bool, exit_code: int | None, sig: int | None, stderr: str) -> str | None:
    """Why a run ended abnormally, from the evidence only (pure)."""
    if timed_out:
        return "timeout"
    if overflow:
        return "output_limit"
    if sig is not None:
        if sig == signal.SIGXCPU:
            return "cpu_limit"
        if sig == signal.SIGXFSZ:
            return "file_size_limit"
        try:
            return f"signal:{signal.Signals(sig).name}"
        except ValueError:
            return f"signal:{sig}"
    if exit_code in (0, None):
        return None
    tail = stderr[-4000:]
    last = tail.strip().splitlines()[-1] if tail.strip() else ""
    if last.startswith("MemoryError") or "Cannot allocate memory" in tail:
        return "memory_limit"
    if "File too large" in tail:
        return "file_size_limit"
    if "No space left on device" in tail:
        return "disk_limit"
    if "Resource temporarily unavailable" in tail or "process limit reached" in tail:
        return "process_limit"
    return None


_RECORD_TYPES: dict[str, tuple[type, ...]] = {
    "seq": (int,), "api": (str,), "status": (str,), "objective": (float, int, type(None)), "num_vars": (int,),
    "num_constrs": (int,), "lp": (str, type(None)), "lp_truncated": (bool,),
}


def parse_records(data: bytes) -> tuple[list[dict[str, Any]], str | None]:
    """The solve records of the records pipe, each checked against the recorder's key: (records, None), or
    ([], why) when any line is not the recorder's (a record that arrives any other way fails the run).

    The recorder writes ``trex-records-v2 <key>`` before the program runs, then ``<hmac-sha256> <json>``
    per solve with ``seq`` 1, 2, ...; a wrong tag, a gap, a repeat or a line of another shape is refused.
    """
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        return [], None
    head, _, key_hex = lines[0].partition(b" ")
    try:
        key = bytes.fromhex(key_hex.decode("ascii"))
    except ValueError:
        key = b""
    if head.decode("latin-1") != RECORDS_HEADER or len(key) != 32:
        return [], "the records channel does not start with the recorder's key"
    out: list[dict[str, Any]] = []
    for n, line in enumerate(lines[1:], 1):
        tag, _, body = line.partition(b" ")
        if n > MAX_RECORDS or not hmac.compare_digest(tag, hmac.new(key, body, hashlib.sha256).hexdigest().encode()):
            return [], f"record {n} was not written by the solver recorder"
        try:
            rec = json.loads(body)
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or set(rec) != set(_RECORD_TYPES) or not all(
                isinstance(rec[k], t) and not (isinstance(rec[k], bool) and bool not in t)
                for k, t in _RECORD_TYPES.items()) or rec["seq"] != n:
            return [], f"record {n} is malformed or out of sequence"
        del rec["seq"]
        rec["objective"] = None if rec["objective"] is None else float(rec["objective"])
        out.append(rec)
    return out, None


def parse_collected(data: bytes, names: Sequence[str]) -> dict[str, bytes]:
    """Files sent by the kernel-fs supervisor (``name\\nsize\\n`` + bytes each), only those asked for."""
    out: dict[str, bytes] = {}
    pos = 0
    while pos < len(data):
        name_end = data.find(b"\n", pos)
        size_end = data.find(b"\n", name_end + 1)
        if name_end < 0 or size_end < 0 or not data[name_end + 1:size_end].isdigit():
            break
        name = data[pos:name_end].decode("utf-8", "replace")
        size = int(data[name_end + 1:size_end])
        body = data[size_end + 1:size_end + 1 + size]
        if len(body) < size:
            break
        if name in names:
            out[name] = bytes(body)
        pos = size_end + 1 + size
    return out


def _collect(workdir: Path, names: Sequence[str], max_bytes: int) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name in names:
        path = workdir / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            real = Path(os.readlink(f"/proc/self/fd/{fd}")) if Path("/proc/self/fd").exists() else path.resolve()
            if not str(real).startswith(str(workdir.resolve()) + os.sep):
                continue
            with os.fdopen(os.dup(fd), "rb") as fh:
                out[name] = fh.read(max_bytes)
        finally:
            os.close(fd)
    return out


# ---------------------------------------------------------------------------------------------
# public API


def _status_of(line: bytes) -> tuple[int | None, int | None]:
    """(exit code, signal) from a ``status e|s N`` line; killed (SIGKILL) when there is none."""
    parts = line.split()
    if len(parts) == 3 and parts[0] == b"status" and parts[2].isdigit():
        return (int(parts[2]), None) if parts[1] == b"e" else (None, int(parts[2]))
    return None, int(signal.SIGKILL)  # killed before it could report


class _Exec:
    """A run started as a fresh interpreter (``python -I -c <bootstrap> <config>``).

    kernel-fs: the interpreter execs bubblewrap, whose supervisor reports the status on ``status_fd``.
    """

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, pass_fds: Sequence[int],
                 status_fd: int | None) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env,
            start_new_session=True, close_fds=True, pass_fds=tuple(pass_fds),
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.out_fd, self.err_fd = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        self.pgid = self.proc.pid
        self.status_fd = status_fd

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def stop(self, mode: str, sandbox_id: str) -> None:
        """Kill what is left of the run."""
        _kill_tree(self.pgid, mode, sandbox_id)

    def wait(self) -> tuple[int | None, int | None]:
        rc = self.proc.wait()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdout.close()
        self.proc.stderr.close()
        if self.status_fd is not None:
            os.set_blocking(self.status_fd, False)
            try:
                line = os.read(self.status_fd, 256)
            except BlockingIOError:
                line = b""
            os.close(self.status_fd)
            return _status_of(line.strip())
        return (rc, None) if rc >= 0 else (None, -rc)


class ZygoteUnavailable(RuntimeError):
    """The fork server could not take a run (the caller falls back to a fresh interpreter)."""


class _Zygote:
    """A fork server: one pristine ``python -I`` per interpreter path that forks a process per run.

    It saves the interpreter start-up of every namespaces run (a cold kernel-fs run's launcher is
    forked from it too, joins the cgroup and execs bubblewrap). Each run's process is forked from a
    state that never ran user code, then does exactly what a fresh bootstrap does. Runs share the
    interpreter's hash seed.
    """

    runs_dir: Path | None = None

    def __init__(self, python: str, wrap: Sequence[str] = ()) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [*wrap, python, "-I", "-c", _BOOT_SOURCE, "--zygote", str(child.fileno())], pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}, start_new_session=True,
            )
        finally:
            child.close()
        self.sock = parent
        self.owner = os.getpid()
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def send(self, payload: bytes, fds: list[int]) -> None:
        with self.lock:
            socket.send_fds(self.sock, [payload], fds)

    def close(self) -> None:
        if self.owner != os.getpid():
            return
        self.sock.close()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.runs_dir is not None:
            shutil.rmtree(self.runs_dir, ignore_errors=True)


class _WarmZygote(_Zygote):
    """The kernel-fs warm path: a fork server inside one long-lived bwrap sandbox (the minimal root, all
    capabilities of its own user namespace, no seccomp yet). Each run's process enters private mount,
    PID, IPC, UTS and network namespaces, mounts its tmpfs quota, hides every other run's inputs,
    remounts the rest read-only, and its PID 1 drops every capability and installs the seccomp
    filter before the program's first line: the boundary of a cold bwrap run without its start-up."""

    def __init__(self, python: str, read: Sequence[str]) -> None:
        bwrap = kernelfs.bwrap_path()
        if bwrap is None:
            raise ZygoteUnavailable("no bubblewrap")
        self.runs_dir = Path(tempfile.mkdtemp(prefix="trex-sandbox-runs-"))
        roots = [*kernelfs.interpreter_roots(python), *read]
        super().__init__(python, kernelfs.warm_command(bwrap, roots, str(self.runs_dir)))


_ZYGOTES: dict[tuple[str, ...], _Zygote] = {}
_ZYGOTE_LOCK = threading.Lock()
ZYGOTE_VAR = "TREX_SANDBOX_ZYGOTE"


def _zygote_for(python: str, warm_read: Sequence[str] | None = None) -> _Zygote:
    """The fork server of ``python`` (with ``warm_read``: the kernel-fs warm one binding those paths)."""
    key = (python,) if warm_read is None else ("kernel-fs", python, *warm_read)
    with _ZYGOTE_LOCK:
        z = _ZYGOTES.get(key)
        if z is None or not z.alive():
            if z is not None:
                z.close()
            z = _ZYGOTES[key] = _Zygote(python) if warm_read is None else _WarmZygote(python, warm_read)
        return z


@atexit.register
def _close_zygotes() -> None:
    with _ZYGOTE_LOCK:
        for z in _ZYGOTES.values():
            z.close()
        _ZYGOTES.clear()


class _Forked:
    """A run forked by the zygote; its status comes back on a pipe (``pid N``, then ``status e|s N``)."""

    def __init__(self, zygote: _Zygote, argv: list[str], env: dict[str, str], extra_fds: list[int],
                 extra: Mapping[str, Any] | None = None) -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        st_r, st_w = os.pipe()
        try:
            msg = {"argv": argv, "env": env, **(extra or {})}
            zygote.send(json.dumps(msg).encode(), [out_w, err_w, st_w, *extra_fds])
        except OSError as exc:
            for fd in (out_r, err_r, st_r):
                os.close(fd)
            raise ZygoteUnavailable(str(exc)) from exc
        finally:
            for fd in (out_w, err_w, st_w):
                os.close(fd)
        self.out_fd, self.err_fd, self.st_fd = out_r, err_r, st_r
        self.buf = b""
        self.eof = False
        line = self._read_line(deadline=time.monotonic() + 30.0)
        if not line.startswith(b"pid "):
            self.close()
            raise ZygoteUnavailable("the fork server did not start the run")
        self.pgid = int(line.split()[1])

    def _read_line(self, deadline: float) -> bytes:
        while b"\n" not in self.buf and not self.eof:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if not select.select([self.st_fd], [], [], remaining)[0]:
                continue
            chunk = os.read(self.st_fd, 256)
            if not chunk:
                self.eof = True
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def exited(self) -> bool:
        if b"\n" in self.buf or self.eof:
            return True
        if select.select([self.st_fd], [], [], 0)[0]:
            chunk = os.read(self.st_fd, 256)
            self.eof = not chunk
            self.buf += chunk
        return b"\n" in self.buf or self.eof

    def wait(self) -> tuple[int | None, int | None]:
        line = self._read_line(deadline=time.monotonic() + 30.0)
        self.close()
        return _status_of(line)

    def close(self) -> None:
        for fd in (self.out_fd, self.err_fd, self.st_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def stop(self, mode: str, sandbox_id: str) -> None:
        """Kill what is left of the run."""
        _kill_tree(self.pgid, mode, sandbox_id)


class _WarmRun(_Forked):
    """A run of the warm kernel-fs fork server: its pid is one of the sandbox's, so it is never signalled
    from here; closing the lifeline makes its launcher kill the run's PID 1."""

    def __init__(self, zygote: _Zygote, argv: list[str], env: dict[str, str], extra_fds: list[int],
                 extra: Mapping[str, Any], lifeline: int) -> None:
        self.lifeline = lifeline
        try:
            super().__init__(zygote, argv, env, extra_fds, extra)
        except ZygoteUnavailable:
            self.stop("kernel-fs", "")
            raise

    def stop(self, mode: str, sandbox_id: str) -> None:
        if self.lifeline >= 0:
            os.close(self.lifeline)
            self.lifeline = -1

    def wait(self) -> tuple[int | None, int | None]:
        try:
            return super().wait()
        finally:
            self.stop("kernel-fs", "")


def _use_zygote(mode: str) -> bool:
    wanted = os.environ.get(ZYGOTE_VAR, "auto")
    return mode in ("namespaces", "kernel-fs") and wanted != "off" and hasattr(socket, "send_fds")


def run_python(
    code: str,
    *,
    limits: Limits = Limits(),
    files: Mapping[str, str | bytes] | None = None,
    collect: Sequence[str] = (),
    python: str | None = None,
    env: Mapping[str, str] | None = None,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a fresh, isolated child interpreter and return what happened,
    with every solve its gurobipy/highspy calls made (:attr:`SandboxResult.solves`)."""
    if not isinstance(code, str):
        raise ValueError("code must be a string of Python source")
    names = [_safe_relpath(n, "collect") for n in collect]
    inputs = {_safe_relpath(k, "files"): v for k, v in (files or {}).items()}
    if SCRIPT_NAME in inputs:
        raise ValueError(f"files: {SCRIPT_NAME!r} is reserved for the program")
    interpreter = python or sys.executable
    return _run(code, isolation_mode(interpreter), limits, inputs, names, interpreter, env)


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


WARM_VAR = "TREX_SANDBOX_WARM"


def _warm_zygote(mode: str, limits: Limits, interpreter: str, read: Sequence[str],
                 warm: bool | None) -> _Zygote | None:
    """The kernel-fs warm fork server for this run, or None (another mode, networking, disabled, unavailable;
    ``warm`` forces the choice, for the probes)."""
    if mode != "kernel-fs" or limits.network or warm is False:
        return None
    if warm is None and (not _use_zygote(mode) or os.environ.get(WARM_VAR, "auto") == "off"
                         or not warm_kernel_fs_available(interpreter)):
        return None
    try:
        return _zygote_for(interpreter, tuple(read))
    except (OSError, ZygoteUnavailable):
        return None


def _run(code: str, mode: str, limits: Limits, inputs: Mapping[str, str | bytes], names: Sequence[str],
         interpreter: str, env: Mapping[str, str] | None, warm: bool | None = None) -> SandboxResult:
    sandbox_id = uuid.uuid4().hex
    kfs = mode == "kernel-fs"
    own_root = kfs or mode == "namespaces"  # the run sees only the minimal root; files come back on a pipe
    read = [os.path.abspath(p) for p in limits.read_paths]
    lic = os.environ.get("GRB_LICENSE_FILE")
    if lic:
        read.append(os.path.abspath(lic))
    server = _warm_zygote(mode, limits, interpreter, read, warm)
    root = Path(tempfile.mkdtemp(prefix="trex-sandbox-", dir=None if server is None else server.runs_dir))
    cgroup: Path | None = None
    try:
        work = root / "work"
        work.mkdir()
        for name, content in inputs.items():
            target = work / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content.encode() if isinstance(content, str) else bytes(content))
        (work / SCRIPT_NAME).write_text(code, encoding="utf-8")
        cgroup = _make_cgroup(sandbox_id, limits.max_processes)
        drop = mode == "namespaces" and os.environ.get(DROP_VAR, "auto") != "off" and uid_drop_available(interpreter)
        run_uid = RUN_UID_BASE + secrets.randbelow(RUN_UID_SPAN) if drop else None
        stage, plan = "", ""
        if mode == "namespaces":
            (root / "fs").mkdir()
            stage = str(root / "fs")
            roots = [*kernelfs.interpreter_roots(interpreter), *read]
            plan = kernelfs.plan_text(kernelfs.root_plan(roots, limits.network))
        # RLIMIT_NPROC counts per user namespace: one per cold run, but warm runs share the server's.
        own_ns = mode != "audit" and server is None
        nproc = limits.max_processes if (own_ns and (drop or os.geteuid() != 0)) else 0
        cfg: dict[str, Any] = {
            "dir": kernelfs.WORKDIR if own_root else str(work), "script": SCRIPT_NAME, "mode": mode,
            "counter": f"{kernelfs.STATE}/proc_count" if own_root else str(root / "proc_count"),
            "count_forks": cgroup is None and nproc == 0, "read": read, "network": limits.network,
            "allow_subprocess": limits.allow_subprocess, "max_processes": limits.max_processes,
            "cgroup": "", "rlimits": f"{limits.cpu_s},{limits.memory_mb},{limits.max_file_mb},"
                                     f"{limits.max_open_files},{nproc}",
            "uid": "" if run_uid is None else str(run_uid), "records_fd": RECORDS_FD, "pipes": "",
            "collect": "\n".join(names), "model_cap": limits.max_model_kb << 10,
            "inputs": str(work) if mode == "namespaces" else "" if not kfs else (
                kernelfs.INPUTS if server is None else f"{RUNS}/{root.name}/work"),
            "stage": stage, "root": plan, "disk_mb": limits.max_disk_mb,
        }
        child_env = _child_env(cfg["dir"], sandbox_id, env)
        cap = limits.max_output_kb * 1024
        start = time.monotonic()
        rec_r, rec_w = os.pipe()
        col_r, col_w = os.pipe() if own_root else (-1, -1)
        parent_ends = [rec_r, col_r]
        run: _Exec | _Forked
        try:
            try:
                if server is None:
                    raise ZygoteUnavailable("cold")
                run = _start_warm(server, cfg, child_env, [rec_w, col_w], cgroup, limits.max_disk_mb)
            except ZygoteUnavailable:
                run = _start_cold(cfg, mode, interpreter, child_env, work, limits, cgroup, rec_w, col_w)
        finally:
            _close_all([fd for fd in (rec_w, col_w) if fd >= 0])
        streams = [_Stream(run.out_fd, cap, True), _Stream(run.err_fd, cap, True),
                   _Stream(rec_r, MAX_RECORDS * ((limits.max_model_kb << 10) + 4096), False)]
        if own_root:
            streams.append(_Stream(col_r, len(names) * ((limits.max_file_mb << 20) + 4096), False))
        try:
            try:
                timed_out, overflow = _pump(streams, run.exited, start + limits.timeout_s)
            finally:
                # A forked run that reported its status left nothing behind (its PID namespace is gone)
                # and its process, reaped already, may have lent its number to another group.
                if isinstance(run, _Exec | _WarmRun) or not run.exited():
                    run.stop(mode, sandbox_id)
                exit_code, sig = run.wait()
        finally:
            _close_all([fd for fd in parent_ends if fd >= 0])
        wall = time.monotonic() - start
        stdout, stderr = _decode(bytes(streams[0].data), cap), _decode(bytes(streams[1].data), cap)
        reason = classify(timed_out=timed_out, overflow=overflow, exit_code=exit_code, sig=sig, stderr=stderr)
        collected = (parse_collected(bytes(streams[3].data), names) if own_root
                     else _collect(work, names, limits.max_file_mb << 20))
        solves, refused = parse_records(bytes(streams[2].data))
        return SandboxResult(
            stdout=stdout, stderr=stderr, exit_code=exit_code, signal=sig, timed_out=timed_out, wall_s=wall,
            killed_reason=reason, result=parse_protocol(stdout), files=collected, mode=mode, uid=run_uid,
            solves=solves, records_refused=refused,
            process_limit="cgroup" if cgroup is not None else ("guard" if cfg["count_forks"] else "rlimit"),
        )
    finally:
        if cgroup is not None:
            _remove_cgroup(cgroup)
        shutil.rmtree(root, ignore_errors=True)


def _start_warm(zygote: _Zygote, cfg: dict[str, Any], env: dict[str, str], pipes: list[int], cgroup: Path | None,
                disk_mb: int) -> _WarmRun:
    """Hand the run to the warm kernel-fs fork server (records and collect pipes, lifeline, cgroup.procs)."""
    life_r, life_w = os.pipe()
    cg = os.open(cgroup / "cgroup.procs", os.O_WRONLY) if cgroup is not None else -1
    try:
        fds = [*pipes, life_r] + ([cg] if cg >= 0 else [])
        extra = {"disk_mb": disk_mb, "cgroup": cg >= 0}
        return _WarmRun(zygote, _boot_args(cfg), env, fds, extra, life_w)
    finally:
        _close_all([fd for fd in (life_r, cg) if fd >= 0])


def _start_cold(cfg: dict[str, Any], mode: str, interpreter: str, env: dict[str, str], work: Path, limits: Limits,
                cgroup: Path | None, rec_w: int, col_w: int) -> _Exec | _Forked:
    """Start the run through the plain fork server (namespaces; the kernel-fs launcher) or a fresh interpreter."""
    command: list[str] = []
    if mode == "kernel-fs":
        bwrap = kernelfs.bwrap_path()
        if bwrap is None:
            raise RuntimeError("kernel-fs isolation needs bubblewrap (bwrap)")
        roots = [*kernelfs.interpreter_roots(interpreter), *cfg["read"]]
        command = kernelfs.bwrap_command(bwrap, roots, str(work), limits.max_disk_mb, limits.network,
                                         [interpreter, "-I", "-c", _BOOT_SOURCE, *_boot_args(cfg)])
    outer = {**cfg, "cgroup": str(cgroup) if cgroup is not None else ""}
    try:
        if not _use_zygote(mode):
            raise ZygoteUnavailable("disabled")
        return _Forked(_zygote_for(interpreter), _boot_args(outer, command), env, [rec_w, col_w])
    except ZygoteUnavailable:
        st_r, st_w = os.pipe() if mode == "kernel-fs" else (-1, -1)
        outer["records_fd"] = rec_w
        outer["pipes"] = {"kernel-fs": f"{st_w},{col_w}", "namespaces": f"-1,{col_w}"}.get(mode, "")
        try:
            return _Exec([interpreter, "-I", "-c", _BOOT_SOURCE, *_boot_args(outer, command)], env, work,
                         [fd for fd in (rec_w, st_w, col_w) if fd >= 0], st_r if st_r >= 0 else None)
        finally:
            _close_all([st_w] if st_w >= 0 else [])


async def run_python_async(
    code: str,
    *,
    limits: Limits = Limits(),
    files: Mapping[str, str | bytes] | None = None,
    collect: Sequence[str] = (),
    python: str | None = None,
    env: Mapping[str, str] | None = None,
) -> SandboxResult:
    """:func:`run_python` on a worker thread, so an event loop can run many sandboxes at once."""
    call: Any = functools.partial(run_python, code, limits=limits, files=files, collect=collect, python=python, env=env)
    return await asyncio.get_running_loop().run_in_executor(None, call)
