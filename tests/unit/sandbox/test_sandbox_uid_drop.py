"""Privilege drop: as root, runs of an interpreter readable by others get a uid of their own.

These checks use programs the audit-hook guard cannot see (``cat`` and ``touch`` started with
``allow_subprocess``), so what they assert is the kernel's boundary, not the guard's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from trex.sandbox import Limits, run_python
from trex.sandbox.runner import CGROUP_VAR, MODE_VAR, ZYGOTE_VAR, namespaces_available, uid_drop_available


def _candidate() -> str | None:
    if os.geteuid() != 0 or not namespaces_available():
        return None
    for py in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if py and Path(py).exists() and uid_drop_available(py):
            return py
    return None


PYTHON = _candidate()
pytestmark = pytest.mark.skipif(PYTHON is None, reason="needs root, namespaces and an interpreter others may read")


@pytest.fixture(params=["zygote", "exec"])
def launcher(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(MODE_VAR, "namespaces")  # the uid drop belongs to namespaces mode
    monkeypatch.setenv(ZYGOTE_VAR, "auto" if request.param == "zygote" else "off")
    return str(request.param)


def test_runs_as_a_uid_of_its_own(launcher: str) -> None:
    res = run_python("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\nopen('out.txt', 'w').write('ok')",
                     python=PYTHON, collect=["out.txt"])
    assert res.ok, res.stderr
    assert res.uid is not None and res.uid != 0
    assert res.stdout.split()[:2] == [str(res.uid), str(res.uid)]
    assert res.files == {"out.txt": b"ok"}
    other = run_python("import os\nprint(os.getuid())", python=PYTHON)
    assert other.uid != res.uid  # every run gets its own


def test_kernel_denies_private_files_and_writes_outside(launcher: str, tmp_path: Path) -> None:
    """A private file in a folder bound into the root (``read_paths``) stays unreadable to the run's uid; the
    folder is read-only; a host file outside the bound paths is not in the run's root at all."""
    shared = tmp_path / "shared"
    shared.mkdir()
    secret = shared / "secret.txt"
    secret.write_text("TOP-SECRET-7")
    secret.chmod(0o600)
    victim = shared / "created-by-sandbox"
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("TOP-SECRET-8")
    elsewhere.chmod(0o644)
    code = textwrap.dedent(f"""
        import subprocess
        for argv in (["cat", {str(secret)!r}], ["touch", {str(victim)!r}], ["id", "-u"],
                     ["head", {str(elsewhere)!r}]):
            p = subprocess.run(argv, capture_output=True, text=True)
            print(argv[0], p.returncode, p.stdout.strip(), p.stderr.strip())
    """)
    res = run_python(code, python=PYTHON, limits=Limits(timeout_s=30.0, allow_subprocess=True,
                                                        read_paths=(str(shared),)))
    assert res.ok, res.stderr
    lines = {ln.split()[0]: ln for ln in res.stdout.splitlines()}
    assert "TOP-SECRET" not in res.stdout
    assert "Permission denied" in lines["cat"], lines
    assert lines["touch"].split()[1] != "0" and not victim.exists(), lines
    assert "No such file or directory" in lines["head"], lines
    assert lines["id"].split()[2] == str(res.uid)


def test_process_budget_without_cgroup_is_the_runs_rlimit(launcher: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CGROUP_VAR, "off")
    tag = uuid.uuid4().hex
    code = textwrap.dedent("""
        import os, time
        n = 0
        for _ in range(200):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            n += 1
        print(n)
    """)
    res = run_python(code, python=PYTHON, limits=Limits(timeout_s=30.0, max_processes=10), env={"TEST_TAG": tag})
    assert res.ok, res.stderr
    assert res.process_limit == "rlimit"
    assert 1 <= int(res.stdout) < 10
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _has_tag(p, tag)]
    assert leftovers == []


def _has_tag(proc: Path, tag: str) -> bool:
    try:
        return f"TEST_TAG={tag}".encode() in (proc / "environ").read_bytes()
    except OSError:
        return False


def test_cannot_signal_root_processes(launcher: str) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        code = textwrap.dedent(f"""
            import subprocess
            p = subprocess.run(["kill", "-9", "{bystander.pid}"], capture_output=True, text=True)
            print(p.returncode)
        """)
        res = run_python(code, python=PYTHON, limits=Limits(timeout_s=30.0, allow_subprocess=True))
        assert res.ok, res.stderr
        assert res.stdout.strip() != "0"
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
