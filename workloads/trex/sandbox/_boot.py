"""Child-side bootstrap of :mod:`trex.sandbox`: ``python -I -c <this source> <config fields>``.

It is self-contained (stdlib only, no trex import) because the sandbox may run another
interpreter. It joins the run's pids cgroup, sets the resource limits and, in ``namespaces`` mode,
enters fresh user, PID and (unless networking is allowed) network namespaces (or, when the caller
is root and the interpreter is readable by others, PID and network namespaces and then drops to a
uid of its own); it then forks an
init process (PID 1 of the new PID namespace) which forks the user program; when init exits the
kernel kills everything left in the namespace. In both modes the user program runs behind an
audit-hook guard that confines Python file access to the sandbox directory (plus read-only
interpreter directories), blocks program execution and, in ``audit`` mode, also sockets and
signals to foreign processes. With ``--zygote FD`` the same code serves as a fork server: it
forks one process per run request received on the control socket.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds of start-up; the child never needs it at run time
    from typing import Any

# argv layout after the source: dir, script, mode, counter, count_forks, network, allow_subprocess,
# max_processes, cgroup ("" for none), rlimits ("cpu_s,memory_mb,file_mb,nofile,nproc", nproc 0 = unset),
# uid to drop to ("" to keep the caller's), then extra read paths (flags are "0"/"1").
CONFIG_KEYS = ("dir", "script", "mode", "counter", "count_forks", "network", "allow_subprocess", "max_processes",
               "cgroup", "rlimits", "uid")
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
_PROC_SELF_DENIED = frozenset({"root", "cwd", "exe", "map_files"})


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

    # -- path helpers -----------------------------------------------------------------------
    def _resolve(self, path: str, dir_fd: Any = None) -> str:
        if not os.path.isabs(path):
            base = os.getcwd() if not (isinstance(dir_fd, int) and dir_fd >= 0) else os.readlink(f"/proc/self/fd/{dir_fd}")
            path = os.path.join(base, path)
        return os.path.realpath(path)

    def _proc_self_ok(self, path: str) -> bool:
        norm = os.path.normpath(path)
        for prefix in ("/proc/self/", "/proc/thread-self/"):
            if norm.startswith(prefix):
                first = norm[len(prefix):].split(os.sep, 1)[0]
                return first not in _PROC_SELF_DENIED
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
        elif event == "ctypes.dlsym":
            name = args[1] if len(args) > 1 else None
            if isinstance(name, str) and name in _DENIED_SYMBOLS:
                raise PermissionError(f"trex.sandbox: ctypes access to {name!r} is not allowed")
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
        elif self.block_net and event in ("socket.__new__", "socket.connect", "socket.bind", "socket.sendto"):
            import socket

            fam = args[1] if event == "socket.__new__" and len(args) > 1 else getattr(args[0], "family", None)
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


def _spawn_init(status_fd: int) -> None:
    """namespaces mode: fork init (PID 1), which forks the user program; returns only in the latter.

    The calling process waits for init and then either exits like the program did
    (``status_fd < 0``) or writes the program's status to ``status_fd`` and exits 0.
    """
    r, w = os.pipe()
    init = os.fork()
    if init:
        os.close(w)
        report = _read_all(r) or b"s 9"
        os.waitpid(init, 0)
        if status_fd < 0:
            _relay(report)
        os.write(status_fd, b"status " + report + b"\n")
        os._exit(0)
    os.close(r)
    if status_fd >= 0:
        os.close(status_fd)
    _set_parent_death_signal()
    user = os.fork()
    if user:
        status = 0
        while True:  # init reaps every orphan until the user program itself has finished
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == user:
                break
        os.write(w, _status_text(status))
        os._exit(0)
    os.close(w)


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


def _setup(cfg: dict[str, Any]) -> None:
    """Join the run's pids cgroup, enter fresh namespaces, set resource limits, drop to the run's uid."""
    import resource

    if cfg["cgroup"]:
        _write_file(os.path.join(cfg["cgroup"], "cgroup.procs"), str(os.getpid()))
    net = 0 if cfg["network"] else CLONE_NEWNET
    if cfg["mode"] == "namespaces" and cfg["uid"]:
        _unshare(CLONE_NEWPID | net)  # root in the initial user namespace: no user namespace needed
    elif cfg["mode"] == "namespaces":
        uid, gid = os.geteuid(), os.getegid()
        _unshare(CLONE_NEWUSER | CLONE_NEWPID | net)
        _write_file("/proc/self/setgroups", "deny")
        _write_file("/proc/self/uid_map", f"{uid} {uid} 1")
        _write_file("/proc/self/gid_map", f"{gid} {gid} 1")
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
    if cfg["uid"]:
        run_uid = int(cfg["uid"])
        os.setgroups([])
        os.setresgid(run_uid, run_uid, run_uid)
        os.setresuid(run_uid, run_uid, run_uid)


def parse_config(fields: list[str]) -> dict[str, Any]:
    """The run configuration from its argv form (see :data:`CONFIG_KEYS`)."""
    cfg: dict[str, Any] = dict(zip(CONFIG_KEYS, fields[: len(CONFIG_KEYS)], strict=True))
    for key in ("count_forks", "network", "allow_subprocess"):
        cfg[key] = cfg[key] == "1"
    cfg["read"] = fields[len(CONFIG_KEYS):]
    return cfg


def _job(payload: bytes, fds: list[int]) -> dict[str, Any]:
    """Zygote child for one run: becomes the run's session leader; returns only in the user program."""
    import json
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    out_fd, err_fd, status_fd = fds
    msg = json.loads(payload)
    os.write(status_fd, f"pid {os.getpid()}\n".encode())
    null = os.open(os.devnull, os.O_RDONLY)
    for src, dst in ((null, 0), (out_fd, 1), (err_fd, 2)):
        os.dup2(src, dst)
        os.close(src)
    cfg = parse_config(msg["argv"])
    os.chdir(cfg["dir"])
    os.environ.clear()
    os.environ.update(msg["env"])
    try:
        _setup(cfg)
        _set_parent_death_signal()  # after _setup: changing credentials clears it
        if cfg["mode"] != "namespaces":
            raise RuntimeError("the zygote runs namespaces-mode jobs only")
        _spawn_init(status_fd)
    except BaseException as exc:  # report set-up failures like a crashed program
        os.write(2, f"trex.sandbox: set-up failed: {exc!r}\n".encode())
        os.write(status_fd, b"status e 126\n")
        os._exit(126)
    return cfg


def _zygote(ctl_fd: int) -> dict[str, Any]:
    """Serve run requests (payload + stdout/stderr/status fds) by forking; returns only in a user program."""
    import json  # noqa: F401  (imported once here, used by every job)
    import signal
    import socket

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # finished jobs are reaped by the kernel
    sock = socket.socket(fileno=ctl_fd)
    while True:
        payload, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 3)
        if not payload:
            os._exit(0)  # the parent went away
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            sock.close()
            return _job(payload, fds)
        for fd in fds:
            os.close(fd)


def _no_exec(*args: object, **kwargs: object) -> None:
    raise PermissionError("trex.sandbox: running programs is not allowed (fork_exec)")


def _run_program(cfg: dict[str, Any]) -> None:
    """Install the guard and run the user program as ``__main__`` (exceptions propagate to the top)."""
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
    if cfg["mode"] == "audit":
        import posix
        import signal
        import socket  # noqa: F401

        for mod, name in ((posix, "pidfd_open"), (os, "pidfd_open"), (signal, "pidfd_send_signal")):
            if hasattr(mod, name):
                delattr(mod, name)
    script = os.path.join(cfg["dir"], cfg["script"])
    with open(script, "rb") as fh:
        source = fh.read()
    sys.path.insert(0, cfg["dir"])
    sys.argv = [script]
    sys.addaudithook(_Guard(cfg, counter_fd))
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
        _setup(cfg)
        if cfg["mode"] == "namespaces":
            _spawn_init(-1)
    _run_program(cfg)


if __name__ == "__main__":
    main()
