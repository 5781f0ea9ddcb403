"""Adversarial programs: the known bypasses of the audit-hook guard, ground-truth theft and forged results.

Each bypass is tried twice where it matters: by the program itself (the guard must refuse it in every
mode) and by an *unguarded* interpreter the program starts (``allow_subprocess``), which only the kernel
can stop. The unguarded attempts must fail in ``kernel-fs`` mode (bubblewrap, warm and cold) and in
``namespaces`` mode (the same minimal root, set up by the bootstrap itself), each reporting its own
mode; in ``audit`` mode the run reports its mode honestly and the unguarded attempt is not asserted to
fail (it succeeds there; that is why ``sandbox.minIsolation`` exists).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from isolation import need
from trex.sandbox import ISOLATION_LEVELS, Limits, SandboxResult, require_isolation, run_python
from trex.sandbox.runner import MODE_VAR, WARM_VAR, ZYGOTE_VAR, kernel_fs_available, namespaces_available

# Every mode is collected; one this machine lacks skips visibly (or fails under TREX_REQUIRE_KERNEL_FS=1).
MODES = ["kernel-fs", "namespaces", "audit"]
KERNEL_FS = kernel_fs_available(sys.executable)
REPO = Path(__file__).resolve().parents[3]
_PREFIX = Path(sys.prefix).resolve().parts
INTERPRETER_TOP = _PREFIX[2] if len(_PREFIX) > 2 and _PREFIX[1] == "tmp" else ""
"""The folder under /tmp holding the interpreter when it lives there (it is bound into the sandbox)."""


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    need(str(request.param))
    monkeypatch.setenv(MODE_VAR, str(request.param))
    monkeypatch.setenv(ZYGOTE_VAR, "auto")
    return str(request.param)


@pytest.fixture(params=["kernel-fs/warm", "kernel-fs/cold", "namespaces/zygote", "namespaces/exec"])
def kernel_fs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A mode with a kernel file-system boundary: kernel-fs through the warm fork server inside bwrap and
    cold (bwrap per run); namespaces through its fork server and from a fresh interpreter per run."""
    isolation, launcher = str(request.param).split("/")
    need(isolation)
    monkeypatch.setenv(MODE_VAR, isolation)
    monkeypatch.setenv(ZYGOTE_VAR, "off" if launcher == "exec" else "auto")
    monkeypatch.setenv(WARM_VAR, "off" if launcher == "cold" else "auto")
    return isolation


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip()


def _unguarded(body: str, **limits: object) -> SandboxResult:
    """Run ``body`` in an interpreter the sandboxed program starts: no audit hook, only the kernel."""
    code = _src(f"""
        import subprocess, sys
        out = subprocess.run([sys.executable, "-I", "-c", {body!r}], capture_output=True, text=True)
        print(out.stdout, end="")
        print(out.stderr, end="", file=sys.stderr)
    """)
    return run_python(code, limits=Limits(timeout_s=30.0, allow_subprocess=True, **limits))  # type: ignore[arg-type]


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A ground-truth file the caller can read (a benchmark's answers)."""
    path = tmp_path / "heldout_answers.json"
    path.write_text(json.dumps({"item-1": "GROUND-TRUTH-4711"}))
    return path


# --- bypass 1: /proc/self/task/<tid>/root -----------------------------------------------------------------
def test_proc_task_root_does_not_lead_to_host_files(mode: str, secret: Path) -> None:
    code = _src(f"""
        import os
        tid = os.listdir("/proc/self/task")[0]  # the thread id as this /proc names it
        for path in (f"/proc/self/task/{{tid}}/root{secret}", f"/proc/thread-self/root{secret}",
                     f"/proc/{{os.getpid()}}/root{secret}", f"/proc/self/task/{{tid}}/cwd/../../{secret}"):
            try:
                print("LEAK", open(path).read())
            except OSError as exc:
                print("DENIED", type(exc).__name__)
    """)
    res = run_python(code)
    assert res.mode == mode
    assert "GROUND-TRUTH" not in res.stdout and res.stdout.count("DENIED") == 4, res.stdout + res.stderr


def test_proc_task_root_unguarded_is_stopped_by_the_kernel(kernel_fs: str, secret: Path) -> None:
    res = _unguarded(f"import os\nt = os.listdir('/proc/self/task')[0]\n"
                     f"print(open(f'/proc/self/task/{{t}}/root{secret}').read())")
    assert res.mode == kernel_fs
    assert "GROUND-TRUTH" not in res.stdout and "FileNotFoundError" in res.stderr, res.stdout + res.stderr


# --- bypass 2: ctypes.dlsym/handle -------------------------------------------------------------------------
def test_ctypes_dlsym_handle_is_refused(mode: str, secret: Path) -> None:
    code = _src(f"""
        import _ctypes, ctypes
        for name in ("open", b"open", "openat"):
            try:
                addr = _ctypes.dlsym(_ctypes.dlopen(None), name)
                fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_int)(addr)
                print("OPENED", fn({str(secret).encode()!r}, 0))
            except Exception as exc:
                print("DENIED", type(exc).__name__)
    """)
    res = run_python(code)
    assert res.mode == mode
    assert "OPENED" not in res.stdout and res.stdout.count("DENIED") == 3, res.stdout + res.stderr


def test_libc_open_unguarded_finds_no_host_file(kernel_fs: str, secret: Path) -> None:
    res = _unguarded(f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                     f"print('FD', libc.open({str(secret).encode()!r}, 0), ctypes.get_errno())")
    assert res.mode == kernel_fs
    assert res.stdout.split() == ["FD", "-1", "2"], res.stdout + res.stderr  # ENOENT: not in this file system


# --- bypass 3: UNIX sockets ----------------------------------------------------------------------------------
@pytest.fixture
def host_unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "caller.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen()
    yield path
    srv.close()


def test_unix_sockets_outside_the_folder_are_refused(mode: str, tmp_path: Path, host_unix_socket: Path) -> None:
    code = _src(f"""
        import socket
        for action, target in (("bind", {str(tmp_path / "planted.sock")!r}), ("connect", {str(host_unix_socket)!r})):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                getattr(s, action)(target)
                print("REACHED", action)
            except OSError as exc:
                print("DENIED", action, type(exc).__name__)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind("inside.sock")
        print("INSIDE ok")
    """)
    res = run_python(code)
    assert res.mode == mode
    assert "REACHED" not in res.stdout and res.stdout.count("DENIED") == 2, res.stdout + res.stderr
    assert "INSIDE ok" in res.stdout
    assert not (tmp_path / "planted.sock").exists()


def test_unix_socket_unguarded_cannot_reach_the_caller(kernel_fs: str, tmp_path: Path,
                                                        host_unix_socket: Path) -> None:
    res = _unguarded(f"import socket\ns = socket.socket(socket.AF_UNIX)\n"
                     f"try:\n    s.connect({str(host_unix_socket)!r})\n    print('REACHED')\n"
                     f"except OSError as e:\n    print('DENIED', e.errno)\n"
                     f"s2 = socket.socket(socket.AF_UNIX)\ns2.bind({str(tmp_path / 'planted.sock')!r})\n")
    assert res.mode == kernel_fs
    assert "DENIED 2" in res.stdout, res.stdout + res.stderr  # ENOENT: the caller's socket is not there
    assert not (tmp_path / "planted.sock").exists()


# --- the ground truth: benchmark files, the parent's cmdline/environ, the project tree ----------------------
@pytest.fixture
def truth_holder(secret: Path) -> Iterator[str]:
    """A process that names the benchmark file in its argv and the answer in its environment."""
    marker = f"TRUTH-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(secret), marker],
                            env={**os.environ, "ANSWER": marker})
    yield marker
    proc.kill()
    proc.wait()


THEFT = _src("""
    import os
    found = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        for name in ("cmdline", "environ"):
            try:
                data = open(f"/proc/{pid}/{name}", "rb").read()
            except OSError:
                continue
            if b"TRU" + b"TH-" in data:  # spelled apart: the program's own cmdline holds its source
                found.append(pid)
    print("FOUND" if found else "NOTHING", len(os.listdir("/proc")))
""")


def test_other_processes_cmdline_and_environ_are_out_of_reach(mode: str, truth_holder: str) -> None:
    res = run_python(THEFT)
    assert res.mode == mode
    assert truth_holder not in res.stdout + res.stderr and "FOUND" not in res.stdout


def test_ground_truth_unguarded_is_out_of_reach(kernel_fs: str, truth_holder: str, secret: Path) -> None:
    res = _unguarded(THEFT + _src(f"""
        for path in ({str(secret)!r}, {str(REPO / "pyproject.toml")!r}, "/sys/kernel"):
            print(path, os.path.exists(path))
        # /tmp may exist as the parent of a bound interpreter folder; the host's own /tmp must not show
        host_tmp = {sorted(p.name for p in secret.parents[-2].iterdir())[:20]!r}
        print("host /tmp", os.path.isdir("/tmp") and bool(set(os.listdir("/tmp")) & set(host_tmp) - {INTERPRETER_TOP!r}))
        print("other runs' inputs", os.path.isdir("/.trex-runs") and bool(os.listdir("/.trex-runs")))
    """))
    assert res.ok and res.mode == kernel_fs, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("NOTHING"), res.stdout
    assert all(line.endswith("False") for line in lines[1:]), res.stdout  # no benchmark, tree, /sys, host /tmp
    assert truth_holder not in res.stdout


# --- seccomp and the tmpfs quota --------------------------------------------------------------------------
SYSCALLS = _src("""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    def call(name, *args):
        r = getattr(libc, name)(*args)
        print(name, r, ctypes.get_errno() if r < 0 else 0)
    call("ptrace", 16, os.getppid(), 0, 0)  # PTRACE_ATTACH to the supervisor
    call("ptrace", 16, 1, 0, 0)
    call("unshare", 0x10000000)  # CLONE_NEWUSER
    call("mount", b"none", b"/sandbox", b"tmpfs", 0, None)
    call("socket", 2, 1, 0)  # AF_INET
    call("socket", 16, 3, 0)  # AF_NETLINK
    call("syscall", 321, 0, 0, 0)  # bpf on x86_64
    caps = [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith(("CapEff", "CapPrm", "CapBnd"))]
    print("caps", *caps)
    print("unix", libc.socket(1, 1, 0) >= 0)
""")


def test_seccomp_denies_ptrace_mount_unshare_and_network_sockets(kernel_fs: str) -> None:
    res = _unguarded(SYSCALLS)
    assert res.ok and res.mode == kernel_fs, res.stderr
    assert res.stdout.splitlines()[-2] == "caps " + " ".join(["0000000000000000"] * 3), res.stdout
    errnos = [line.split()[-1] for line in res.stdout.splitlines()[:-2]]
    assert errnos[:4] == ["1", "1", "1", "1"], res.stdout  # EPERM: ptrace x2, unshare, mount
    assert errnos[4:6] == ["97", "97"], res.stdout  # EAFNOSUPPORT
    if os.uname().machine == "x86_64":
        assert errnos[6] == "1", res.stdout
    assert res.stdout.splitlines()[-1] == "unix True"


def test_bound_folders_are_read_only(kernel_fs: str, tmp_path: Path) -> None:
    """Every host folder in the root (the interpreter's, ``read_paths``) is a read-only bind: no write reaches
    the host even from a program whose uid owns the files there."""
    shared = tmp_path / "shared"
    shared.mkdir()
    targets = [shared / "planted.txt", Path(sys.prefix) / "planted.txt", Path("/usr/planted.txt")]
    res = _unguarded(f"for t in {[str(t) for t in targets]!r}:\n    try:\n        open(t, 'w').write('x')\n"
                     f"        print('WROTE', t)\n    except OSError as exc:\n        print('DENIED', exc.errno)\n",
                     read_paths=(str(shared),))
    assert res.ok and res.mode == kernel_fs, res.stderr
    assert res.stdout.split() == ["DENIED", "30"] * 3, res.stdout  # EROFS
    assert not any(t.exists() for t in targets)


def test_kernel_knobs_in_proc_are_read_only(kernel_fs: str) -> None:
    """/proc/sys and friends are global; a program whose uid maps to the caller's root must not write them
    (the value written is the one read, so a failure of this test changes nothing)."""
    res = _unguarded("import os\nfor knob in ('/proc/sys/kernel/pid_max', '/proc/sysrq-trigger'):\n"
                     "    old = open(knob).read() if knob.startswith('/proc/sys/') else '0'\n"
                     "    try:\n        open(knob, 'w').write(old)\n        print('WROTE', knob)\n"
                     "    except OSError as exc:\n        print('DENIED', exc.errno)\n")
    assert res.ok and res.mode == kernel_fs, res.stderr
    assert "WROTE" not in res.stdout and res.stdout.count("DENIED") == 2, res.stdout


def test_network_limit_keeps_inet_sockets_when_asked(kernel_fs: str) -> None:
    res = run_python("import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM).close()\nprint('ok')",
                     limits=Limits(network=True))
    assert res.ok and res.stdout == "ok\n" and res.mode == kernel_fs, res.stderr


def test_tmpfs_quota_stops_a_disk_filler(kernel_fs: str) -> None:
    code = _src("""
        i = 0
        while True:
            with open(f"f{i}.bin", "wb") as fh:
                fh.write(b"x" * (1 << 20))
            i += 1
    """)
    res = run_python(code, limits=Limits(timeout_s=30.0, max_disk_mb=8, max_file_mb=4))
    assert not res.ok and res.killed_reason == "disk_limit" and res.mode == kernel_fs, res.stderr[-500:]


# --- forged and solver-less results -------------------------------------------------------------------------
def test_printed_result_without_a_solve_records_nothing(mode: str) -> None:
    res = run_python('print(\'TREX_RESULT {"status": "optimal", "objective": 23.0}\')')
    assert res.ok and res.result is not None and res.result["objective"] == 23.0
    assert res.solves == [] and res.solve is None and res.objective is None


def test_a_forged_record_is_parsed_but_its_model_decides(mode: str) -> None:
    """The records pipe is writable from the program, so a record is a claim about a model: consumers
    re-solve (evaluation) or compare (ORData) the recorded LP; a fake record wins nothing a real solve of
    the same fake model would not (see the evaluation and ORData tests)."""
    fake = json.dumps({"api": "gurobipy", "status": "optimal", "objective": 23.0, "num_vars": 4, "num_constrs": 1,
                       "lp": "Maximize\n obj: x\nSubject To\n c: x <= 1\nEnd\n", "lp_truncated": False})
    code = _src(f"""
        import os
        for fd in range(3, 64):
            try:
                os.write(fd, {(fake + chr(10)).encode()!r})
            except OSError:
                pass
        os.write(1, b"done\\n")
    """)
    res = run_python(code)
    assert res.stdout.endswith("done\n")
    assert all(r["objective"] == 23.0 and "x <= 1" in r["lp"] for r in res.solves)  # only the forger's claim


def test_a_solve_is_recorded_in_every_mode(mode: str) -> None:
    res = run_python("import highspy\nh = highspy.Highs()\nh.silent()\nx = h.addVariable(lb=0, ub=3)\n"
                     "h.maximize(2 * x)\n")
    assert res.ok, res.stderr
    assert res.mode == mode and res.status == "optimal" and res.objective == pytest.approx(6.0)


# --- minIsolation -------------------------------------------------------------------------------------------
def test_min_isolation_refuses_weaker_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MODE_VAR, "audit")
    assert require_isolation("audit") == "audit"
    for level in ISOLATION_LEVELS[1:]:
        with pytest.raises(RuntimeError, match=f"minIsolation is {level} but only audit"):
            require_isolation(level)
    with pytest.raises(ValueError, match="minIsolation"):
        require_isolation("strong")
    if namespaces_available():
        monkeypatch.setenv(MODE_VAR, "namespaces")  # the same minimal root, but not bubblewrap's: said so
        assert require_isolation("namespaces") == "namespaces"
        with pytest.raises(RuntimeError, match="minIsolation is kernel-fs but only namespaces"):
            require_isolation("kernel-fs")
    if KERNEL_FS:
        monkeypatch.setenv(MODE_VAR, "auto")
        assert require_isolation("kernel-fs") == "kernel-fs"
