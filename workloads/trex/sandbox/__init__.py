"""trex.sandbox: isolated execution of generated solver code (shared by ORData, evaluation and rewards).

One entry point: :func:`run_python` runs a program and returns a :class:`SandboxResult` whose
``solves`` are what gurobipy ``Model.optimize`` and highspy ``Highs.run``/``solve`` recorded
inside the child (status, objective, sizes, the model's LP text), in call order; ``solve``,
``status`` and ``objective`` are the last one. The records pipe is opened before user code but is
writable by the program, so a record is a claim about a model: consumers compare its LP with a
reference (ORData's structural gate) or re-solve it (evaluation).

Output protocol
---------------
A program also prints its result on one line to stdout (``SandboxResult.result``, what it *says*)::

    TREX_RESULT {"status": "optimal", "objective": 42.0, "values": {"x": 1.0, "y": 3.0}}

``status`` is a string (``optimal``, ``infeasible``, ``unbounded``, ``infeasible_or_unbounded``,
``time_limit``, ``suboptimal``, ``error``, ...), ``objective`` a number or ``null`` and ``values``
an object from variable names to numbers (may be empty). The last such line wins; a last line
that is not valid JSON of that shape makes the result ``None``. There is deliberately no lenient
fallback here: harnesses that want one add it on top of :attr:`SandboxResult.stdout`.

Modes
-----
``kernel-fs`` (bubblewrap, :mod:`trex.sandbox.kernelfs`: private minimal root, tmpfs work folder
with a size quota, own /proc, seccomp filter) wherever bwrap runs, else ``namespaces`` (the same
root, built by the bootstrap itself; below), else ``audit``; ``TREX_SANDBOX_MODE`` forces one.
:func:`require_isolation` enforces a job's ``sandbox.minIsolation``. ``SandboxResult.mode`` says
which mode ran.

Details of namespaces and audit modes
-------------------------------------
:func:`run_python` writes the program to ``main.py`` in a fresh temporary directory (copied into
the tmpfs work folder ``/sandbox`` in ``kernel-fs`` and ``namespaces`` modes) and runs it
with the same interpreter (``-I``: no user site, no ``PYTHON*`` variables; site-packages stay,
because the solver libraries live there) in a new session with a scrubbed environment (PATH,
HOME=TMPDIR=the directory, LANG, a few allow-listed variables such as GRB_LICENSE_FILE and
thread counts, which default to 1, plus ``env``); a small bootstrap (``_boot.py``, stdlib only)
sets RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NOFILE and RLIMIT_CORE=0 and the isolation below
before the program's first line runs. A wall-clock timeout SIGKILLs the whole process group.

* ``namespaces`` mode (Linux, where bwrap cannot run but user namespaces may be created; probed
  once per interpreter by a run): the child enters a new user namespace that maps its own uid to
  itself, new mount, PID, IPC and UTS namespaces and, unless ``Limits.network``, a new network
  namespace with no interfaces up. The run's init (PID 1) builds the ``kernel-fs`` root on a
  tmpfs (read-only binds of :func:`trex.sandbox.kernelfs.root_plan`, a minimal /dev, a fresh
  /proc, the tmpfs work folder with the ``Limits.max_disk_mb`` quota), pivots (``pivot_root``) into it
  and detaches the host's root: no /sys, host /tmp, host sockets or other host files. The user
  program then drops every capability, sets no-new-privs and installs the same seccomp filter.
  These are kernel boundaries: no network; no host file outside the root; the program cannot
  see or signal any process outside (killing its parent does nothing to the caller); and when
  the namespace's init exits, the kernel kills every process left in it. The mode is reported
  as ``namespaces``, not ``kernel-fs``: the boundary is set up by trex, not by bubblewrap.
* Privilege drop (``namespaces`` mode, caller is root, and the interpreter with its
  site-packages is readable by others; probed once per interpreter): instead of a user
  namespace, the child enters the other namespaces as root, and the user program drops to a uid
  of its own (random, from a range outside /etc/passwd; ``SandboxResult.uid``), owning only its
  work folder. Private files in bound folders (``Limits.read_paths``) then stay unreadable even
  to programs the guard cannot see. ``TREX_SANDBOX_DROP_UID=off`` disables it. Where the
  interpreter lives in a folder only its owner may read (a pyenv under /root, say) the uid cannot
  start it, so the run keeps the caller's uid inside its own user namespace.
* ``audit`` mode (fallback, or forced with ``TREX_SANDBOX_MODE=audit``): no kernel
  boundary; the guard below also blocks non-Unix sockets and signals to processes outside the
  program's process group, and leftover processes are found by an environment marker and
  killed.
* Processes: a per-run ``pids`` cgroup (``pids.max = max_processes``) where a pids cgroup is
  writable (``TREX_SANDBOX_CGROUP=off`` disables it); otherwise RLIMIT_NPROC of the run's own uid
  or of a non-root caller's user namespace; otherwise (root keeping its uid without a writable
  cgroup: the kernel exempts uid 0 from RLIMIT_NPROC in every namespace) a fork budget kept by
  the guard and shared by all processes of the run. ``SandboxResult.process_limit`` says which.

In every mode an audit hook (``sys.addaudithook``) confines Python-level file access: reads only
inside the sandbox directory, the interpreter's prefix and ``sys.path`` folders, a few system
files and ``Limits.read_paths``; writes, renames and deletes only inside the sandbox directory;
running other programs is refused unless ``Limits.allow_subprocess``; ctypes lookups of libc
file, process and network functions are refused. The audit hook is a guard against accidents
and naive programs, not a kernel boundary (C extensions do their own I/O); in ``audit`` mode it
is the only thing between the program and files its caller's uid may read.

Start-up: in ``namespaces`` mode runs are forked by a fork server (one pristine ``python -I`` per
interpreter path, started on first use, ending when its parent closes the control socket): each
run's process is forked from a state that never ran user code and then does exactly what a fresh
bootstrap does (session, cgroup, namespaces, limits, guard), which saves the interpreter start-up
of every run. Runs forked by one server share its hash seed. ``TREX_SANDBOX_ZYGOTE=off`` starts a
fresh interpreter per run instead (always the case in ``audit`` mode).

Output is captured up to ``Limits.max_output_kb`` per stream; a program that writes more is
killed (``killed_reason="output_limit"``) and the text ends with a truncation marker. Files
named in ``collect`` are returned (symlinks are not followed; in ``kernel-fs`` and ``namespaces``
modes the supervisor sends them on a pipe of its own). Background processes are killed
when the program exits.
"""

from trex.sandbox.protocol import PREFIX, STATUSES, format_protocol, parse_protocol
from trex.sandbox.runner import (
    ISOLATION_LEVELS,
    Limits,
    SandboxResult,
    isolation_mode,
    require_isolation,
    run_python,
    run_python_async,
)

__all__ = [
    "ISOLATION_LEVELS",
    "PREFIX",
    "STATUSES",
    "Limits",
    "SandboxResult",
    "format_protocol",
    "isolation_mode",
    "parse_protocol",
    "require_isolation",
    "run_python",
    "run_python_async",
]
