"""Child-side bootstrap of :mod:`trex.sandbox`: ``python -I -c <this source> <config fields>``.

It is self-contained (stdlib only, no trex import) because the sandbox may run another
interpreter. Three stages, chosen by the configuration:

* ``kernel-fs`` outside: join the run's pids cgroup, move the run's pipes to fixed descriptors,
  write the seccomp filter (:func:`seccomp_filter`) to a pipe and exec bubblewrap, which starts
  this source again inside the new namespaces;
* ``kernel-fs`` inside (the supervisor, never runs user code): copy the inputs into the tmpfs work
  folder, set the resource limits, fork the user program, wait for it, then send the collected
  files and the program's status to the parent on descriptors the program never holds;
* ``namespaces``: join the cgroup, enter fresh user (unless root drops to a uid of its own), mount,
  PID, IPC, UTS and network namespaces and fork an init (PID 1) which builds the kernel-fs root
  itself and pivots into it (:func:`_enter_root`), then supervises like kernel-fs; the user program
  drops every capability (and to the run's uid) and installs the seccomp filter;
* ``audit``: join the cgroup, set the limits and run the user program.

The user program always runs behind the solver recorder (:class:`_SolverHook` and :func:`_recorder`: every
gurobipy ``Model.optimize`` and highspy ``Highs.run``/``solve`` writes one record of status, objective,
sizes and the model's LP text to the records descriptor, tagged with an HMAC under a per-run key announced
before the program runs) and the audit-hook guard
(file access confined to the work folder plus read-only interpreter folders, no program
execution, no UNIX sockets outside the folder; in ``audit`` mode also no network sockets and no
signals to foreign processes). With ``--zygote FD`` the same code serves as a fork server.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of start-up; the child never needs it at run time
    from typing import Any, NoReturn

# argv layout after the source: dir, script, mode, counter, count_forks, network, allow_subprocess,
# max_processes, cgroup ("" for none), rlimits ("cpu_s,memory_mb,file_mb,nofile,nproc", nproc 0 = unset),
# uid to drop to ("" to keep the caller's), records fd, "status_fd,collect_fd" of the kernel-fs outer stage
# started as a fresh interpreter ("-1,collect_fd" for namespaces started so, "" otherwise), collect names
# ("\n"-joined), inputs folder ("" when the inputs are in place), model cap (bytes), and for namespaces mode
# the host folder its root is built on, the root plan (kernelfs.plan_text) and the work folder's size (MiB);
# then extra read paths, then optionally "--exec" and the command the kernel-fs outer stage execs (flags are
# "0"/"1").
CONFIG_KEYS = ("dir", "script", "mode", "counter", "count_forks", "network", "allow_subprocess", "max_processes",
               "cgroup", "rlimits", "uid", "records_fd", "pipes", "collect", "inputs", "model_cap", "stage", "root",
               "disk_mb")
EXEC_MARK = "--exec"
# Descriptors inside a kernel-fs sandbox: the supervisor's status and collect pipes, the records pipe.
STATUS_FD, RECORDS_FD, COLLECT_FD, SECCOMP_FD = 3, 4, 5, 6
MAX_RECORDS = 64
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_EXEC_EVENTS = frozenset(
    {"os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen", "os.forkpty", "pty.spawn"}
)
# (argument index of a path, argument index of its dir_fd or -1) for events that modify the file system.
_MODIFY_EVENTS: dict[str, tuple[tuple[int, int], ...]] = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),), "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)),
    "os.symlink": ((1, 2),), "os.truncate": ((0, -1),), "os.utime": ((0, 3),),
    "os.setxattr": ((0, -1),), "os.removexattr": ((0, -1),), "os.chflags": ((0, -1),),
    "os.lchflags": ((0, -1),), "shutil.rmtree": ((0, -1),), "shutil.copyfile": ((1, -1),),
    "shutil.copytree": ((1, -1),), "shutil.move": ((0, -1), (1, -1)), "shutil.chown": ((0, -1),),
}
_LIST_EVENTS = frozenset({"os.listdir", "os.scandir", "glob.glob", "os.listxattr", "os.getxattr"})
# libc symbols that would let ctypes code step around the guard.
_DENIED_SYMBOLS = frozenset(
    {
        "open", "open64", "openat", "openat64", "fopen", "fopen64", "freopen", "creat", "creat64",
        "unlink", "unlinkat", "rename", "renameat", "renameat2", "truncate", "truncate64", "chmod",
        "chown", "lchown", "mkdir", "mkdirat", "rmdir", "symlink", "symlinkat", "link", "linkat",
        "kill", "killpg", "tgkill", "tkill", "pidfd_open", "pidfd_send_signal", "socket", "connect",
        "bind", "sendto", "execve", "execv", "execvp", "execvpe", "execl", "execlp", "fexecve",
        "system", "popen", "posix_spawn", "posix_spawnp", "fork", "vfork", "clone", "clone3",
        "syscall", "ptrace", "setns", "unshare", "mount", "chroot", "chdir", "fchdir",
    }
)
_SPECIAL_READ = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/proc/cpuinfo", "/proc/meminfo",
                 "/proc/stat", "/etc/localtime", "/etc/os-release", "/usr/lib/os-release", "/etc/timezone")
_READ_ROOTS = ("/sys/devices/system/cpu/", "/sys/fs/cgroup/", "/usr/share/zoneinfo/")
# fd: reopening the records pipe's write end for reading would show the recorder's key line.
_PROC_SELF_DENIED = frozenset({"root", "cwd", "exe", "map_files", "fd"})
# Introspection that reaches other code's frames or objects (and with them the recorder's key):
# refused always; in the thread that is recording a solve also frame and restricted-attribute access.
_INTROSPECTION_EVENTS = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
                                   "sys.settrace", "sys.setprofile", "sys.monitoring.register_callback"})
_RECORDING_EVENTS = frozenset({"object.__getattr__", "sys._getframe", "sys._getframemodulename"})


class _HookRefused(RuntimeError):
    """Raised for ``sys.addaudithook``: a later hook would run inside the recorder's calls."""


def _fspath(p: Any) -> str | None:
    if isinstance(p, int):
        return None
    try:
        return os.fsdecode(os.fspath(p))
    except TypeError:
        return None


class _Guard:
    """The audit hook: decides every watched event from the configuration alone."""

    def __init__(self, cfg: dict[str, Any], counter_fd: int) -> None:
        self.dir = os.path.realpath(cfg["dir"]) + os.sep
        roots = {self.dir}
        for p in [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path, *cfg["read"]]:
            if p and os.path.exists(p):
                for q in {os.path.abspath(p), os.path.realpath(p)}:
                    roots.add(q if not os.path.isdir(q) else q.rstrip(os.sep) + os.sep)
        self.read_roots = tuple(sorted(roots)) + _READ_ROOTS
        self.audit_mode = cfg["mode"] == "audit"
        self.allow_exec = bool(cfg["allow_subprocess"])
        self.block_net = self.audit_mode and not cfg["network"]
        self.max_procs = int(cfg["max_processes"]) - 1  # the program itself is one
        self.count_forks = bool(cfg["count_forks"])
        self.counter_fd = counter_fd
        self.token: str | None = None  # paths holding it belong to the recorder
        self.shielded: Any = None  # the recorder generator, whose frame the program must not reach
        self.recording: int | None = None  # the thread recording a solve right now
        import _thread

        self._ident = _thread.get_ident

    def protect(self, token: str) -> None:
        """Refuse every path that holds ``token`` to all but the recording thread."""
        self.token = token

    def shield(self, gen: Any) -> None:
        """Refuse restricted attributes (``gi_frame``, ``gi_code``) of ``gen``."""
        self.shielded = gen

    def _recorder_event(self, event: str, args: tuple[Any, ...]) -> None:
        """The recorder's part of the hook: its frame, its thread and its LP file."""
        here = self.recording is not None and self.recording == self._ident()
        if event in _INTROSPECTION_EVENTS or (here and event in _RECORDING_EVENTS):
            raise PermissionError(f"trex.sandbox: {event} is not allowed")
        if event == "sys.addaudithook":
            raise _HookRefused("trex.sandbox: adding audit hooks is not allowed")
        if event == "object.__getattr__" and args and args[0] is self.shielded:
            raise PermissionError("trex.sandbox: the solve recorder is not accessible")
        token = self.token
        if token and not here:
            for a in args:
                text = a if isinstance(a, str) else os.fsdecode(a) if isinstance(a, bytes) else _fspath(a)
                if text is not None and token in text:
                    raise PermissionError("trex.sandbox: the solve recorder's files are not accessible")

    # -- path helpers -----------------------------------------------------------------------
    def _resolve(self, path: str, dir_fd: Any = None) -> str:
        if not os.path.isabs(path):
            base = os.getcwd() if not (isinstance(dir_fd, int) and dir_fd >= 0) else os.readlink(f"/proc/self/fd/{dir_fd}")
            path = os.path.join(base, path)
        return os.path.realpath(path)

    def _proc_self_ok(self, path: str) -> bool:
        """Own /proc entries, but none that lead back into the file system (root, cwd, exe, ...),
        also not through a thread's folder (``/proc/self/task/<tid>/root``)."""
        norm = os.path.normpath(path)
        for prefix in ("/proc/self/", "/proc/thread-self/", f"/proc/{os.getpid()}/"):
            if norm.startswith(prefix):
                parts = norm[len(prefix):].split(os.sep)
                if parts[0] == "task":
                    parts = parts[2:]
                return not parts or parts[0] not in _PROC_SELF_DENIED
        return False

    def _can_read(self, path: str, dir_fd: Any = None) -> bool:
        if os.path.isabs(path) and self._proc_self_ok(path):
            return True
        real = self._resolve(path, dir_fd)
        if real in _SPECIAL_READ or (real + os.sep) == self.dir:
            return True
        return any(real == r or real.startswith(r) for r in self.read_roots)

    def _can_write(self, path: str, dir_fd: Any = None) -> bool:
        real = self._resolve(path, dir_fd)
        return real.startswith(self.dir) or real == "/dev/null"

    # -- the hook ------------------------------------------------------------------------------
    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        self._recorder_event(event, args)
        if event == "open":
            self._on_open(args)
        elif event in _MODIFY_EVENTS:
            for idx, fd_idx in _MODIFY_EVENTS[event]:
                path = _fspath(args[idx]) if idx < len(args) else None
                dir_fd = args[fd_idx] if 0 <= fd_idx < len(args) else None
                if path is not None and not self._guarded(self._can_write, path, dir_fd):
                    raise PermissionError(f"trex.sandbox: {event} outside the sandbox directory: {path!r}")
        elif event in _LIST_EVENTS:
            path = _fspath(args[0]) if args else None
            if path is not None and not self._guarded(self._can_read, path, None):
                raise PermissionError(f"trex.sandbox: {event} outside the sandbox directory: {path!r}")
        elif event in _EXEC_EVENTS:
            if not self.allow_exec:
                raise PermissionError(f"trex.sandbox: running programs is not allowed ({event})")
        elif event in ("os.fork", "os.forkpty"):
            if self.count_forks:
                self._count_process()
        elif event in ("ctypes.dlsym", "ctypes.dlsym/handle"):
            name = args[1] if len(args) > 1 else None
            if isinstance(name, bytes):
                name = name.decode("latin-1")
            if not isinstance(name, str) or name in _DENIED_SYMBOLS:
                raise PermissionError(f"trex.sandbox: ctypes access to {name!r} is not allowed")
        elif event in ("socket.bind", "socket.connect", "socket.sendto"):
            self._on_socket(event, args)
        elif self.audit_mode:
            self._audit_only(event, args)

    @staticmethod
    def _guarded(check: Any, path: str, dir_fd: Any) -> bool:
        """Path resolution (stat, readlink) raises no audit events, so the hook cannot re-enter."""
        return bool(check(path, dir_fd))

    def _on_open(self, args: tuple[Any, ...]) -> None:
        path = _fspath(args[0])
        if path is None:
            return
        mode = args[1] if len(args) > 1 else None
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(flags & _WRITE_FLAGS)
        check = self._can_write if writing else self._can_read
        if not self._guarded(check, path, None):
            what = "writing" if writing else "reading"
            raise PermissionError(f"trex.sandbox: {what} outside the sandbox directory is not allowed: {path!r}")

    def _on_socket(self, event: str, args: tuple[Any, ...]) -> None:
        """UNIX sockets only on paths inside the folder; abstract names only in a network namespace."""
        import socket

        sock, addr = args[0], args[-1]
        if getattr(sock, "family", None) != socket.AF_UNIX:
            if self.block_net:
                raise PermissionError("trex.sandbox: network access is not allowed")
            return
        path = os.fsdecode(addr) if isinstance(addr, str | bytes) else ""
        if path.startswith("\0") or not path:
            if self.audit_mode:
                raise PermissionError(f"trex.sandbox: abstract UNIX sockets are not allowed ({event})")
        elif not self._guarded(self._can_write, path, None):
            raise PermissionError(f"trex.sandbox: UNIX socket outside the sandbox directory: {path!r}")

    def _audit_only(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "os.kill":
            pid = args[0]
            own = os.getpgrp()
            if pid == -1 or (pid < -1 and -pid != own):
                raise PermissionError("trex.sandbox: signalling processes outside the sandbox is not allowed")
            if pid > 0 and pid != os.getpid():
                try:
                    same = os.getpgid(pid) == own
                except OSError:
                    same = False
                if not same:
                    raise PermissionError("trex.sandbox: signalling processes outside the sandbox is not allowed")
        elif event == "os.killpg":
            if args[0] != os.getpgrp():
                raise PermissionError("trex.sandbox: signalling processes outside the sandbox is not allowed")
        elif self.block_net and event == "socket.__new__":
            import socket

            fam = args[1] if len(args) > 1 else -1
            if fam not in (socket.AF_UNIX, -1):
                raise PermissionError("trex.sandbox: network access is not allowed")
        elif self.block_net and event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr"):
            raise PermissionError("trex.sandbox: network access is not allowed")

    def _count_process(self) -> None:
        """A fork budget shared by all processes of this sandbox (fd inherited, POSIX record lock)."""
        import fcntl

        fd = self.counter_fd
        fcntl.lockf(fd, fcntl.LOCK_EX)
        try:
            raw = os.pread(fd, 32, 0)
            n = int(raw or b"0") + 1
            if n > self.max_procs:
                raise BlockingIOError(11, "trex.sandbox: process limit reached (Resource temporarily unavailable)")
            os.pwrite(fd, str(n).encode().ljust(32), 0)
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)


def _status_text(status: int) -> bytes:
    if os.WIFSIGNALED(status):
        return f"s {os.WTERMSIG(status)}".encode()
    return f"e {os.WEXITSTATUS(status)}".encode()


def _relay(status: bytes) -> None:
    """Exit like the user program did (exit code or the same signal)."""
    import signal

    kind, _, num = status.decode(errors="replace").partition(" ")
    if kind == "s" and num.isdigit():
        sig = int(num)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(int(num) if kind == "e" and num.isdigit() else 125)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 64):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _spawn_init(cfg: dict[str, Any], status_fd: int, collect_fd: int) -> None:
    """namespaces mode: fork the run's init (PID 1), which builds the run's root (:func:`_enter_root`) and
    supervises the user program (:func:`_supervise`); returns only in the latter.

    The calling process waits for init and then either exits like the program did (``status_fd < 0``) or
    passes init's ``status ...`` line on to ``status_fd`` and exits 0.
    """
    r, w = os.pipe()
    init = os.fork()
    if init:
        for fd in (w, collect_fd, cfg["records_fd"]):
            os.close(fd)
        report = _read_all(r) or b"status s 9\n"
        os.waitpid(init, 0)
        if status_fd < 0:
            _relay(report.removeprefix(b"status ").strip())
        os.write(status_fd, report)
        os._exit(0)
    os.close(r)
    if status_fd >= 0:
        os.close(status_fd)
    try:
        _set_parent_death_signal()
        _enter_root(cfg)
        _place_fds({STATUS_FD: w, RECORDS_FD: cfg["records_fd"], COLLECT_FD: collect_fd})
    except BaseException as exc:
        _setup_failed(exc, w)
    cfg["records_fd"] = RECORDS_FD
    _supervise(cfg)


def _setup_failed(exc: BaseException, status_fd: int) -> NoReturn:
    """Report a set-up failure like a crashed program (exit status 126), on ``status_fd`` too when open."""
    os.write(2, f"trex.sandbox: set-up failed: {exc!r}\n".encode())
    if status_fd >= 0:
        os.write(status_fd, b"status e 126\n")
    os._exit(126)


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _set_parent_death_signal() -> None:
    """SIGKILL this process when its parent dies (PR_SET_PDEATHSIG)."""
    import signal

    _libc().prctl(1, int(signal.SIGKILL), 0, 0, 0)


def _write_file(path: str, data: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def _unshare(flags: int) -> None:
    if _libc().unshare(flags) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"trex.sandbox: unshare failed: {os.strerror(err)}")


def _set_rlimits(cfg: dict[str, Any]) -> None:
    import resource

    cpu_s, memory_mb, file_mb, nofile, nproc = (int(x) for x in cfg["rlimits"].split(","))
    mb = 1 << 20
    for res, value in (
        (resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)),
        (resource.RLIMIT_AS, (memory_mb * mb, memory_mb * mb)),
        (resource.RLIMIT_FSIZE, (file_mb * mb, file_mb * mb)),
        (resource.RLIMIT_NOFILE, (nofile, nofile)),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(res, value)
    if nproc > 0:
        # Counted per (user namespace, uid): a per-run budget for a run's own uid or a non-root
        # caller's namespace (the kernel exempts uid 0 from RLIMIT_NPROC in every namespace).
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _setup(cfg: dict[str, Any]) -> None:
    """Join the run's pids cgroup; namespaces: enter fresh user (unless dropping to a uid of its own as
    root), mount, PID, IPC, UTS and network namespaces (the run's init does the rest); audit: set limits."""
    if cfg["cgroup"]:
        _write_file(os.path.join(cfg["cgroup"], "cgroup.procs"), str(os.getpid()))
    if cfg["mode"] == "kernel-fs":
        return  # limits are set inside, by the supervisor
    if cfg["mode"] == "audit":
        _set_rlimits(cfg)
        return
    flags = _CLONE_NEWNS | CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS | (0 if cfg["network"] else CLONE_NEWNET)
    if cfg["uid"]:
        _unshare(flags)  # root in the initial user namespace: no user namespace needed
        return
    uid, gid = os.geteuid(), os.getegid()
    _unshare(CLONE_NEWUSER | flags)
    _write_file("/proc/self/setgroups", "deny")
    _write_file("/proc/self/uid_map", f"{uid} {uid} 1")
    _write_file("/proc/self/gid_map", f"{gid} {gid} 1")


def parse_config(fields: list[str]) -> dict[str, Any]:
    """The run configuration from its argv form (see :data:`CONFIG_KEYS`)."""
    command: list[str] = []
    if EXEC_MARK in fields:
        at = fields.index(EXEC_MARK)
        fields, command = fields[:at], fields[at + 1:]
    cfg: dict[str, Any] = dict(zip(CONFIG_KEYS, fields[: len(CONFIG_KEYS)], strict=True))
    for key in ("count_forks", "network", "allow_subprocess"):
        cfg[key] = cfg[key] == "1"
    cfg["records_fd"] = int(cfg["records_fd"])
    cfg["model_cap"] = int(cfg["model_cap"])
    cfg["disk_mb"] = int(cfg["disk_mb"])
    cfg["collect"] = [n for n in cfg["collect"].split("\n") if n]
    cfg["read"] = fields[len(CONFIG_KEYS):]
    cfg["exec"] = command
    return cfg


# --- seccomp ------------------------------------------------------------------------------------------
# (audit arch, syscalls denied with EPERM, clone, clone3, socket, socketpair, x32 bit or 0)
_SYSCALLS: dict[str, tuple[int, tuple[int, ...], int, int, int, int, int]] = {
    "x86_64": (0xC000003E, (101, 165, 166, 155, 161, 321, 250, 248, 249, 272, 308, 298, 310, 311, 246, 175, 313,
                            176, 304, 303, 323, 425, 426, 427, 428, 429, 430, 431, 432, 433, 442, 312),
               56, 435, 41, 53, 0x40000000),
    "aarch64": (0xC00000B7, (117, 40, 39, 41, 51, 280, 219, 217, 218, 97, 268, 241, 270, 271, 104, 105, 273, 106,
                             265, 264, 282, 425, 426, 427, 428, 429, 430, 431, 432, 433, 442, 272),
                220, 435, 198, 199, 0),
}
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
_CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
_EPERM, _ENOSYS, _EAFNOSUPPORT = 1, 38, 97


def seccomp_filter(machine: str, network: bool) -> bytes:
    """A classic-BPF seccomp program: ptrace, mount, bpf, keyctl, unshare/setns (and namespace flags of
    clone), io_uring and kernel-module calls fail with EPERM; clone3 with ENOSYS (so libc falls back to
    clone, whose flags can be checked); sockets other than AF_UNIX fail unless ``network``; calls of any
    other architecture fail. KeyError for a machine without a table."""
    import struct

    arch, denied, clone, clone3, sock, sockpair, x32 = _SYSCALLS[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, errno = 0x7FFF0000, 0x00050000
    prog: list[tuple[int, object, object, int]] = [(ld, 0, 0, 4), (jeq, 0, "deny", arch), (ld, 0, 0, 0)]
    if x32:
        prog.append((jge, "deny", 0, x32))
    prog += [(jeq, "deny", 0, nr) for nr in denied]
    prog += [(jeq, "nosys", 0, clone3), (jeq, "clone", 0, clone)]
    if not network:
        prog += [(jeq, "socket", 0, sock), (jeq, "socket", 0, sockpair)]
    prog += [(ret, 0, 0, allow)]
    labels = {"clone": len(prog)}
    prog += [(ld, 0, 0, 16), (jset, "deny", 0, _CLONE_NS_FLAGS), (ret, 0, 0, allow)]
    labels["socket"] = len(prog)
    prog += [(ld, 0, 0, 16), (jeq, "allow", 0, 1), (ret, 0, 0, errno | _EAFNOSUPPORT)]
    labels["allow"] = len(prog)
    prog += [(ret, 0, 0, allow)]
    labels["deny"] = len(prog)
    prog += [(ret, 0, 0, errno | _EPERM)]
    labels["nosys"] = len(prog)
    prog += [(ret, 0, 0, errno | _ENOSYS)]
    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(prog):
        t = labels[jt] - i - 1 if isinstance(jt, str) else int(jt)  # type: ignore[call-overload]
        f = labels[jf] - i - 1 if isinstance(jf, str) else int(jf)  # type: ignore[call-overload]
        out += struct.pack("=HBBI", code, t, f, k)
    return bytes(out)


def _exec_bwrap(cfg: dict[str, Any], fds: dict[int, int]) -> None:
    """kernel-fs outside: move the run's pipes to their fixed numbers, add the seccomp filter, exec bwrap."""
    r, w = os.pipe()
    os.write(w, seccomp_filter(os.uname().machine, bool(cfg["network"])))
    os.close(w)
    _place_fds({**fds, SECCOMP_FD: r})
    os.execv(cfg["exec"][0], cfg["exec"])


def _place_fds(fds: dict[int, int]) -> None:
    """Put each source descriptor on its target number and close every descriptor above them."""
    import fcntl

    moved = {src: fcntl.fcntl(src, fcntl.F_DUPFD, 64) for src in set(fds.values())}  # above every target
    for dst, src in fds.items():
        os.dup2(moved[src], dst)
    for fd in moved.values():
        os.close(fd)
    os.closerange(max(fds) + 1, 1 << 16)


# --- kernel-fs warm path: one bwrap sandbox holds the fork server, every run gets namespaces of its own ----
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 8, 32, 4096
_MS_REC, _MS_PRIVATE, _MNT_DETACH = 16384, 1 << 18, 2
_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUTS = 0x00020000, 0x08000000, 0x04000000
RUNS = "/.trex-runs"
"""Inside the warm sandbox: read-only bind of the host folder holding every run's inputs."""


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = _libc()
    if libc.mount(source.encode(), target.encode(), None if fstype is None else fstype.encode(), flags,
                  None if data is None else data.encode()) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"trex.sandbox: mount {target} failed: {os.strerror(err)}")


_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus")
"""Entries of a fresh /proc bound read-only over themselves: the kernel's global knobs, which a run whose uid
maps to the caller's root could write otherwise (sysctl permissions follow the global uid, not capabilities)."""
_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
_DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
              ("stderr", "/proc/self/fd/2"))


def _kept_flags(path: str) -> int:
    """The nosuid/nodev/noexec flags of the mount at ``path``: a remount must keep them (they may be locked)."""
    return os.statvfs(path).f_flag & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC)


def _mount_points_under(path: str) -> list[str]:
    """Mount points at or below ``path`` (from mountinfo, octal escapes decoded)."""
    with open("/proc/self/mountinfo", "rb") as fh:
        points = [line.split(b" ")[4].decode("unicode_escape").encode("latin-1").decode("utf-8", "surrogateescape")
                  for line in fh.read().splitlines()]
    top = path.rstrip("/") + "/"
    return [p for p in points if p == path or p.startswith(top)]


def _bind(src: str, dst: str) -> None:
    """Bind ``src`` (a folder or file, with what is mounted below it) at ``dst``, creating the mount point."""
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.close(os.open(dst, os.O_WRONLY | os.O_CREAT, 0o644))
    _mount(src, dst, None, _MS_BIND | _MS_REC)


def _mount_proc(target: str) -> None:
    """A fresh /proc of this PID namespace at ``target``, with :data:`PROC_READ_ONLY` read-only."""
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    _mount("proc", target, "proc", flags)
    for knob in (f"{target}/{name}" for name in PROC_READ_ONLY):
        if os.path.exists(knob):  # nothing is mounted below them in a fresh /proc
            _mount(knob, knob, None, _MS_BIND)
            _mount("none", knob, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)


def _enter_root(cfg: dict[str, Any]) -> None:
    """namespaces mode, in the run's init (PID 1 of its PID namespace, in its own mount namespace): build
    the minimal root of ``kernel-fs`` on a tmpfs at ``cfg["stage"]`` and pivot into it. Read-only binds of
    the plan (``/usr``, the interpreter's prefixes, read paths, a few /etc files), a minimal /dev, a fresh
    /proc of this PID namespace, tmpfs work folder (the disk quota) and state folder; the old root is
    detached, so no /sys, host /tmp, host sockets or other host files remain reachable."""
    stage, work = cfg["stage"], cfg["dir"]
    owner = f",uid={cfg['uid']},gid={cfg['uid']}" if cfg["uid"] else ""
    _mount("none", "/", None, _MS_REC | _MS_PRIVATE)
    _mount("tmpfs", stage, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
    for line in cfg["root"].split("\n"):
        kind, path, target = line.split("\t")
        if kind == "link":
            os.makedirs(os.path.dirname(stage + path), exist_ok=True)
            os.symlink(target, stage + path)
        else:
            _bind(path, stage + path)
    for point in _mount_points_under(stage):  # the binds and what is mounted below them; the rest comes after
        if point != stage:
            _mount("none", point, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _kept_flags(point))
    dev = stage + "/dev"
    os.mkdir(dev)
    _mount("tmpfs", dev, "tmpfs", _MS_NOSUID | _MS_NOEXEC, "size=64k,mode=0755")
    for name in (n for n in _DEV_NODES if os.path.exists(f"/dev/{n}")):
        os.close(os.open(f"{dev}/{name}", os.O_WRONLY | os.O_CREAT, 0o666))
        _mount(f"/dev/{name}", f"{dev}/{name}", None, _MS_BIND)
    for name, target in _DEV_LINKS:
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(dev + "/shm")
    _mount("tmpfs", dev + "/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=16m,mode=1777")
    _mount("none", dev, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _kept_flags(dev))
    os.mkdir(stage + "/proc")
    _mount_proc(stage + "/proc")
    quota = f"size={cfg['disk_mb']}m,mode=0755{owner}"
    for target, data in ((work, quota), (os.path.dirname(cfg["counter"]), f"size=1m,mode=0755{owner}")):
        os.makedirs(stage + target)
        _mount("tmpfs", stage + target, "tmpfs", _MS_NOSUID | _MS_NODEV, data)
    _copy_inputs(cfg["inputs"], stage + work)
    cfg["inputs"] = ""
    if cfg["uid"]:
        for root, dirs, files in os.walk(stage + work):
            for name in dirs + files:
                os.lchown(os.path.join(root, name), int(cfg["uid"]), int(cfg["uid"]))
    _mount("none", stage, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _kept_flags(stage))
    os.chdir(stage)
    libc = _libc()
    if libc.syscall(_PIVOT_ROOT[os.uname().machine], b".", b".") != 0:  # the old root now lies on top
        import ctypes

        raise OSError(ctypes.get_errno(), "trex.sandbox: pivot_root failed")
    if libc.umount2(b".", _MNT_DETACH) != 0:
        raise OSError("trex.sandbox: cannot detach the host's root")
    os.chdir("/")


def _drop_privileges(network: bool, uid: str = "") -> None:
    """Warm run's PID 1, namespaces mode's user program: no capabilities (bounding, ambient, effective,
    permitted), the run's own ``uid`` when given, no new privileges, then the seccomp filter, so the run
    ends up where a cold bwrap run starts."""
    import ctypes

    libc = _libc()
    for cap in range(64):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP; EINVAL past the last capability
            break
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    if uid:
        os.setgroups([])
        os.setresgid(int(uid), int(uid), int(uid))
        os.setresuid(int(uid), int(uid), int(uid))
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0 or libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "trex.sandbox: cannot drop capabilities")
    bpf = seccomp_filter(os.uname().machine, network)

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    prog = _Prog(len(bpf) // 8, bpf)
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "trex.sandbox: cannot install the seccomp filter")


def _take_over(msg: dict[str, Any], status_fd: int, out_fd: int, err_fd: int) -> dict[str, Any]:
    """A fork-server child becomes the run's process: reports its pid, takes the run's stdio (stdin from
    /dev/null) and environment; returns the run's config."""
    os.write(status_fd, f"pid {os.getpid()}\n".encode())
    null = os.open(os.devnull, os.O_RDONLY)
    for src, dst in ((null, 0), (out_fd, 1), (err_fd, 2)):
        os.dup2(src, dst)
        os.close(src)
    os.environ.clear()
    os.environ.update(msg["env"])
    return parse_config(msg["argv"])


def _warm_job(msg: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    """Fork-server child in the warm sandbox: private mount/PID/IPC/UTS/network namespaces, a tmpfs work
    folder with the quota, a read-only view of everything else; its child (PID 1 of the run) mounts a
    fresh /proc, drops every privilege and supervises. This process waits on the lifeline pipe and kills
    the run when the parent closes it. Returns only in the user program."""
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    out_fd, err_fd, status_fd, records_fd, collect_fd, lifeline = fds[:6]
    if msg.get("cgroup"):
        os.write(fds[6], b"0")  # an opened cgroup.procs of the run's pids cgroup: "0" moves this process
        os.close(fds[6])
    cfg = _take_over(msg, status_fd, out_fd, err_fd)
    try:
        _unshare(_CLONE_NEWNS | CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS | CLONE_NEWNET)
        _mount("none", "/", None, _MS_REC | _MS_PRIVATE)
        quota = f"size={int(msg['disk_mb'])}m,mode=0755"
        for target, data in ((cfg["dir"], quota), (os.path.dirname(cfg["counter"]), "size=1m,mode=0755"),
                             ("/dev/shm", "size=16m,mode=1777")):
            if os.path.isdir(target):
                _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, data)
        _copy_inputs(cfg["inputs"], cfg["dir"])
        cfg["inputs"] = ""
        if _libc().umount2(RUNS.encode(), _MNT_DETACH) != 0:  # other runs' inputs leave this run's view
            raise OSError("trex.sandbox: cannot hide the other runs' inputs")
        for target in ("/", "/dev"):  # keep the flags the sandbox's own mounts are locked with
            _mount("none", target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _kept_flags(target))
        sup = os.fork()
    except BaseException as exc:
        _setup_failed(exc, status_fd)
    if sup == 0:
        try:
            _mount_proc("/proc")
            _drop_privileges(bool(cfg["network"]))
            _place_fds({STATUS_FD: status_fd, RECORDS_FD: records_fd, COLLECT_FD: collect_fd})
        except BaseException as exc:
            _setup_failed(exc, status_fd)
        cfg["records_fd"] = RECORDS_FD
        _supervise(cfg)
        return cfg
    for fd in (0, 1, 2, status_fd, records_fd, collect_fd):
        os.close(fd)
    while True:  # until the parent closes the lifeline (it read the status, or gave up on the run)
        try:
            if not os.read(lifeline, 64):
                break
        except InterruptedError:
            continue
    try:
        os.kill(sup, signal.SIGKILL)  # PID 1 of the run: the kernel ends everything left in it
    except ProcessLookupError:
        pass
    os.waitpid(sup, 0)
    os._exit(0)


# --- the solver recorder ------------------------------------------------------------------------------
_GRB_STATUS = {2: "optimal", 3: "infeasible", 4: "infeasible_or_unbounded", 5: "unbounded", 9: "time_limit",
               13: "suboptimal"}
_HIGHS_STATUS = {"kOptimal": "optimal", "kInfeasible": "infeasible", "kUnbounded": "unbounded",
                 "kUnboundedOrInfeasible": "infeasible_or_unbounded", "kTimeLimit": "time_limit",
                 "kModelEmpty": "empty"}


RECORDS_HEADER = "trex-records-v2"
# Callable kinds a solver reader may be: C-level methods that type-check ``self`` (a Python function
# registered in their place could return anything).
_C_METHODS = frozenset({"cython_function_or_method", "method_descriptor", "builtin_function_or_method"})
_READERS = {"gurobipy": ("Model", ("getAttr", "write")),
            "highspy": ("Highs", ("getModelStatus", "getInfo", "getOptionValue", "setOptionValue", "writeModel",
                                  "getNumCol", "getNumRow"))}


def _c_method(fn: Any, name: str) -> bool:
    """``fn`` is a compiled method called ``name`` (pybind wraps its functions in ``instancemethod``)."""
    if type(fn).__name__ == "instancemethod":
        fn = getattr(fn, "__func__", None)
    return type(fn).__name__ in _C_METHODS and str(getattr(fn, "__qualname__", "")).endswith("." + name)


def _write_all(fd: int, data: bytes) -> bool:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        return False
    return True


def _recorder(fd: int, workdir: str, cap: int, guard: Any, parking: list[Any]) -> Any:
    """The solve recorder, a generator the program can only ask to record a real solver object.

    Primed before the program runs, it draws a per-run key, writes ``trex-records-v2 <key>`` as the first
    line of the records descriptor (the parent takes the key from there, so nothing written later can
    replace it) and keeps the key only inside an OpenSSL HMAC object in this frame. Each later
    ``send((solver, obj))`` reads the object through the compiled methods of the solver's own class
    (captured when the solver was imported: a subclass cannot override them) and writes
    ``<hmac> {json with seq}``. A forked child records nothing; exceptions never leave the frame (a
    traceback would lead into it); the guard keeps the frame and the LP file away from the program."""
    import gc
    import hashlib
    import hmac
    import json
    import math
    import secrets
    import threading

    key = secrets.token_bytes(32)
    mac = hmac.new(key, digestmod=hashlib.sha256)
    ok = _write_all(fd, f"{RECORDS_HEADER} {key.hex()}\n".encode())
    del key
    token = secrets.token_hex(16)
    guard.protect(token)
    pid, seq, readers = os.getpid(), 0, {}
    request: Any = None
    while True:
        try:
            request = yield
        except GeneratorExit:
            return
        except BaseException as exc:  # throw(): the exception must not leave with a traceback into this frame
            BaseException.with_traceback(exc, None)
            del exc
            continue
        # Until the next yield no Python code of the program may look at frames in this thread (user code can
        # run inside: a property, a finaliser), no collection runs finalisers here and the program's objects are
        # parked, not dropped: the caller empties ``parking`` once this frame is suspended again.
        guard.recording = threading.get_ident()
        collecting = gc.isenabled()
        gc.disable()
        try:
            parking.append(request)
            if type(request) is not tuple or len(request) != 2 or type(request[0]) is not str:
                continue
            kind, obj = request
            if kind == "register":
                if type(obj) is not tuple or len(obj) != 2 or obj[0] not in _READERS or obj[0] in readers:
                    continue
                name, module = obj
                cls_name, names = _READERS[name]
                cls = getattr(module, cls_name)
                methods: Any = {n: getattr(cls, n) for n in names}
                if isinstance(cls, type) and all(_c_method(f, n) for n, f in methods.items()):
                    readers[name] = (cls, methods)
            elif ok and kind in readers and os.getpid() == pid and seq < MAX_RECORDS and isinstance(obj, readers[kind][0]):
                fields: Any = (_read_gurobi if kind == "gurobipy" else _read_highs)(obj, readers[kind][1])
                path = os.path.join(workdir, f".trex-{token}-{seq}.lp")
                lp, truncated = _model_text(fields.pop("write"), obj, path, cap)
                seq += 1
                value = fields["objective"]
                fields["objective"] = float(value) if type(value) in (int, float) and math.isfinite(value) else None
                body = json.dumps({"seq": seq, "api": kind, **fields, "lp": lp, "lp_truncated": truncated}).encode()
                digest = mac.copy()
                digest.update(body)
                ok = _write_all(fd, digest.hexdigest().encode() + b" " + body + b"\n")
        except BaseException as exc:  # the program's exception must not carry a traceback into this frame
            BaseException.with_traceback(exc, None)
            parking.append(exc)
            del exc
        finally:
            request = kind = obj = name = module = cls = methods = fields = None
            if collecting:
                gc.enable()
            guard.recording = None


def _read_gurobi(m: Any, f: dict[str, Any]) -> dict[str, Any]:
    get = f["getAttr"]
    code = get(m, "Status")
    obj = get(m, "ObjVal") if get(m, "SolCount") > 0 else None
    return {"status": _GRB_STATUS.get(code, f"gurobi_status_{code}"), "objective": obj,
            "num_vars": int(get(m, "NumVars")), "num_constrs": int(get(m, "NumConstrs")),
            "write": lambda path: f["write"](m, path)}


def _read_highs(h: Any, f: dict[str, Any]) -> dict[str, Any]:
    status = _HIGHS_STATUS.get(str(f["getModelStatus"](h)).rsplit(".", 1)[-1], "other")
    obj = f["getInfo"](h).objective_function_value if status == "optimal" else None
    quiet = f["getOptionValue"](h, "output_flag")
    quiet = quiet[1] if isinstance(quiet, tuple) else quiet

    def write(path: str) -> None:
        f["setOptionValue"](h, "output_flag", False)  # writeModel announces itself on stdout otherwise
        try:
            f["writeModel"](h, path)
        finally:
            f["setOptionValue"](h, "output_flag", bool(quiet))

    return {"status": status, "objective": obj, "num_vars": int(f["getNumCol"](h)),
            "num_constrs": int(f["getNumRow"](h)), "write": write}


def _model_text(write: Any, obj: Any, path: str, cap: int) -> tuple[str | None, bool]:
    """The model as LP text through a file only the recording thread may touch (the guard refuses the
    token in any other thread's path); (None, True) when larger than ``cap``."""
    try:
        write(path)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            data = os.read(fd, cap + 1)
        finally:
            os.close(fd)
    except Exception:
        return None, False
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    if len(data) > cap:
        return None, True
    return data.decode("utf-8", "replace"), False


def _instrument(name: str, module: Any, send: Any, parking: list[Any]) -> None:
    """Register ``module``'s readers with the recorder and wrap gurobipy ``Model.optimize`` and highspy
    ``Highs.run``/``solve`` so that each call sends the solved object to it."""
    send(("register", (name, module)))
    parking.clear()

    def wrap(cls: Any, attr: str) -> None:
        original = getattr(cls, attr, None)
        if original is None:
            return

        def solve(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return original(self, *args, **kwargs)
            finally:
                send((name, self))
                parking.clear()  # objects the recorder held are dropped here, outside its frame

        setattr(cls, attr, solve)

    if name == "gurobipy" and hasattr(module, "Model"):
        wrap(module.Model, "optimize")
    elif name == "highspy" and hasattr(module, "Highs"):
        wrap(module.Highs, "run")
        wrap(module.Highs, "solve")


class _SolverHook:
    """A meta-path finder that instruments gurobipy and highspy as they are imported."""

    def __init__(self, send: Any, parking: list[Any]) -> None:
        self.send, self.parking = send, parking

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in ("gurobipy", "highspy"):
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        original, send, parking = loader.exec_module, self.send, self.parking

        def exec_module(module: Any) -> None:
            original(module)
            _instrument(name, module, send, parking)

        loader.exec_module = exec_module
        return spec


# --- zygote and user program ----------------------------------------------------------------------------
def _job(payload: bytes, fds: list[int]) -> dict[str, Any]:
    """Zygote child for one run: becomes the run's session leader; returns only in the user program."""
    import json
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    out_fd, err_fd, status_fd, records_fd = fds[:4]
    msg = json.loads(payload)
    os.chdir("/")
    cfg = _take_over(msg, status_fd, out_fd, err_fd)
    cfg["records_fd"] = records_fd
    try:
        _setup(cfg)
        if cfg["mode"] == "kernel-fs":
            _exec_bwrap(cfg, {STATUS_FD: status_fd, RECORDS_FD: records_fd, COLLECT_FD: fds[4]})
        _set_parent_death_signal()
        if cfg["mode"] != "namespaces" or len(fds) < 5:
            raise RuntimeError("the zygote runs namespaces and kernel-fs jobs only")
    except BaseException as exc:  # report set-up failures like a crashed program
        _setup_failed(exc, status_fd)
    _spawn_init(cfg, status_fd, fds[4])
    return cfg


def _zygote(ctl_fd: int) -> dict[str, Any]:
    """Serve run requests (payload + stdout/stderr/status/records[/collect] fds) by forking; returns only in a
    user program."""
    import json
    import signal
    import socket

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # finished jobs are reaped by the kernel
    sock = socket.socket(fileno=ctl_fd)
    while True:
        payload, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 8)
        if not payload:
            os._exit(0)  # the parent went away
        if len(fds) < 4:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            sock.close()
            msg = json.loads(payload)
            return _warm_job(msg, fds) if "disk_mb" in msg else _job(payload, fds)
        for fd in fds:
            os.close(fd)


def _copy_inputs(src: str, dst: str) -> None:
    """kernel-fs: copy the run's inputs (read-only bind) into the tmpfs work folder."""
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        target = dst if rel == "." else os.path.join(dst, rel)
        os.makedirs(target, exist_ok=True)
        for name in files:
            with open(os.path.join(root, name), "rb") as fi, open(os.path.join(target, name), "wb") as fo:
                while chunk := fi.read(1 << 20):
                    fo.write(chunk)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]


def _send_collected(cfg: dict[str, Any], fd: int) -> None:
    """kernel-fs supervisor: each collected regular file (no symlinks) as ``name\\nsize\\n`` + bytes."""
    cap = int(cfg["rlimits"].split(",")[2]) << 20
    for name in cfg["collect"]:
        try:
            f = os.open(os.path.join(cfg["dir"], name), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            import stat

            if not stat.S_ISREG(os.fstat(f).st_mode):
                continue
            data = os.read(f, cap) if cap else b""
        finally:
            os.close(f)
        blob = name.encode() + b"\n" + str(len(data)).encode() + b"\n" + data
        while blob:
            blob = blob[os.write(fd, blob):]


def _supervise(cfg: dict[str, Any]) -> None:
    """kernel-fs inside: prepare the work folder, fork the user program, report; returns only in the latter."""
    if cfg["inputs"]:
        _copy_inputs(cfg["inputs"], cfg["dir"])
    os.chdir(cfg["dir"])
    _set_rlimits(cfg)
    _libc().prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the program cannot open our /proc entries
    user = os.fork()
    if user == 0:
        os.closerange(STATUS_FD, STATUS_FD + 1)
        os.closerange(COLLECT_FD, SECCOMP_FD + 1)
        if cfg["mode"] == "namespaces":  # kernel-fs: bwrap or the warm launcher did this for the supervisor
            try:
                _drop_privileges(bool(cfg["network"]), cfg["uid"])
            except BaseException as exc:
                _setup_failed(exc, -1)
        return
    os.close(RECORDS_FD)
    status = 0
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == user:
            break
    try:
        _send_collected(cfg, COLLECT_FD)
    finally:
        os.close(COLLECT_FD)
        os.write(STATUS_FD, b"status " + _status_text(status) + b"\n")
    os._exit(0)


def _no_exec(*args: object, **kwargs: object) -> None:
    raise PermissionError("trex.sandbox: running programs is not allowed (fork_exec)")


def _run_program(cfg: dict[str, Any]) -> None:
    """Install the recorder and the guard and run the user program as ``__main__``."""
    import types

    counter_fd = os.open(cfg["counter"], os.O_RDWR | os.O_CREAT, 0o600) if cfg["count_forks"] else -1
    if not cfg["allow_subprocess"]:
        # subprocess.Popen raises its audit event in Python; a direct call of the C helper would not.
        import _posixsubprocess

        _posixsubprocess.fork_exec = _no_exec  # type: ignore[assignment]
        if "subprocess" in sys.modules:
            sys.modules["subprocess"]._fork_exec = _no_exec  # type: ignore[attr-defined]
    if cfg["count_forks"]:
        import fcntl  # noqa: F401  (imported before the hook: the hook uses it)
    import socket  # noqa: F401  (the hook reads socket.AF_UNIX)

    if cfg["mode"] == "audit":
        import posix
        import signal

        for mod, name in ((posix, "pidfd_open"), (os, "pidfd_open"), (signal, "pidfd_send_signal")):
            if hasattr(mod, name):
                delattr(mod, name)
    import importlib.machinery  # noqa: F401  (the solver hook needs it; imported before the guard)
    import json  # noqa: F401
    import math  # noqa: F401

    guard = _Guard(cfg, counter_fd)
    parking: list[Any] = []
    recorder = _recorder(cfg["records_fd"], guard.dir, cfg["model_cap"], guard, parking)
    next(recorder)
    guard.shield(recorder)
    sys.meta_path.insert(0, _SolverHook(recorder.send, parking))
    script = os.path.join(cfg["dir"], cfg["script"])
    with open(script, "rb") as fh:
        source = fh.read()
    sys.path.insert(0, cfg["dir"])
    sys.argv = [script]
    sys.addaudithook(guard)
    del guard, recorder, parking
    module = types.ModuleType("__main__")
    module.__file__ = script
    module.__builtins__ = __builtins__  # type: ignore[attr-defined]
    sys.modules["__main__"] = module
    code = compile(source, script, "exec")
    del cfg, source, script, types
    exec(code, module.__dict__)


def main() -> None:
    """Entry point: ``--zygote FD`` serves runs by forking; otherwise one run configured by argv."""
    if sys.argv[1:2] == ["--zygote"]:
        cfg = _zygote(int(sys.argv[2]))
    else:
        cfg = parse_config(sys.argv[1:])
        if cfg["exec"]:  # kernel-fs, outside: the parent passed status, records and collect fds
            _setup(cfg)
            status_fd, collect_fd = (int(x) for x in cfg["pipes"].split(","))
            _exec_bwrap(cfg, {STATUS_FD: status_fd, RECORDS_FD: cfg["records_fd"], COLLECT_FD: collect_fd})
        if cfg["mode"] == "kernel-fs":
            _supervise(cfg)
        else:
            _setup(cfg)
            if cfg["mode"] == "namespaces":
                _spawn_init(cfg, -1, int(cfg["pipes"].split(",")[1]))
    _run_program(cfg)


if __name__ == "__main__":
    main()
