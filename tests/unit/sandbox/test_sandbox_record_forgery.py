"""Solve records a program cannot forge: every forgery (raw records on the inherited descriptor, a record of a
trivial model, an honest wrong solve followed by a forged record, a record before the solve, two records, a
record from a forked child, the ``random._os`` descriptor trick, a key of the program's own, the recorder's
frame, its closure, its LP file) is refused by eval scoring, the GRPO verifier and the ORData gates, while the
honest program scores correct. The reference optimum (17) comes from enumerating the integer points."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from trex.ordata import gates
from trex.ordata.ir import Constraint, Instance, Objective, Variable
from trex.sandbox import Limits, run_python
from trex.trainer.rl.reward import ORVerifier, RewardWeights
from trex.verify.items import Item, parse_truth
from trex.verify.program import run_program
from trex.verify.protocols import get_protocol
from trex.verify.scoring import classify

pytestmark = pytest.mark.skipif(run_python("print(1)").mode != "kernel-fs", reason="needs bubblewrap")


def reference_optimum() -> float:
    """max x + 2y, x + y <= 12, x <= 10, y <= 5 over integers, by enumeration."""
    return float(max(x + 2 * y for x, y in itertools.product(range(11), range(6)) if x + y <= 12))


def instance() -> Instance:
    xs = (Variable("x", "integer", 0.0, 10.0), Variable("y", "integer", 0.0, 5.0))
    return Instance("toy", "test", "toy", 0, {}, {}, xs, (Constraint("c", {"x": 1.0, "y": 1.0}, "<=", 12.0),),
                    Objective("max", {"x": 1.0, "y": 2.0}))


REPORT = "print('TREX_RESULT ' + json.dumps({'status': 'optimal', 'objective': 17.0}))\n"
HONEST = ("import json\nimport gurobipy as gp\nfrom gurobipy import GRB\nm = gp.Model()\nm.Params.OutputFlag = 0\n"
          "x = m.addVar(ub=10, vtype=GRB.INTEGER, name='x')\ny = m.addVar(ub=5, vtype=GRB.INTEGER, name='y')\n"
          "m.addConstr(x + y <= 12, name='c')\nm.setObjective(x + 2 * y, GRB.MAXIMIZE)\nm.optimize()\n") + REPORT
WRONG = HONEST.replace("x + y <= 12", "x + y <= 3")
TRIVIAL_LP = "Minimize\n obj: x\nSubject To\n c: x = 17\nEnd\n"
OLD = json.dumps({"api": "gurobipy", "status": "optimal", "objective": 17.0, "num_vars": 1, "num_constrs": 1,
                  "lp": TRIVIAL_LP, "lp_truncated": False})
# writes the trivial record to every descriptor 3..63 (the records pipe among them)
SPRAY = (f"import os\nREC = {OLD!r} + '\\n'\n"
         "def spray(rec=REC):\n    for fd in range(3, 64):\n        try:\n            os.write(fd, rec.encode())\n"
         "        except OSError:\n            pass\n")
# a record in the recorder's own format under a key of the program's own (header first, then seq 1)
OWN_KEY = ("import hmac, hashlib, json\nkey = bytes(32)\n"
           f"body = json.dumps({{'seq': 1, **json.loads({OLD!r})}}).encode()\n"
           "line = b'trex-records-v2 ' + key.hex().encode() + b'\\n' + hmac.new(key, body, hashlib.sha256).hexdigest()"
           ".encode() + b' ' + body + b'\\n'\nspray(line.decode())\n")
# with a key taken from the recorder (if any route works), a record of the trivial model signed with it
SIGNED = ("def signed(mac):\n    import json\n    body = json.dumps({'seq': 1, **json.loads(REC)}).encode()\n"
          "    d = mac.copy(); d.update(body)\n    spray(d.hexdigest() + ' ' + body.decode() + '\\n')\n")
RECORDER = "import gurobipy, sys\nsend = sys.meta_path[0].send\n"

FORGERIES = {
    "trivial_record": SPRAY + "spray()\nimport json\n" + REPORT,
    "wrong_solve_then_record": WRONG + SPRAY + "spray()\n",
    "record_before_solve": SPRAY + "spray()\n" + HONEST,
    "two_records": SPRAY + "spray()\nspray()\nimport json\n" + REPORT,
    "forked_child": SPRAY + "pid = os.fork()\nif pid == 0:\n    spray()\n    os._exit(0)\nos.waitpid(pid, 0)\n"
                    + "import json\n" + REPORT,
    "random_os_fd4": ("from random import _os\nimport json\nf = _os.fdopen(4, 'w')\n"
                      f"f.write({OLD!r} + '\\n')\nf.flush()\n" + REPORT),
    "own_key_header": SPRAY + OWN_KEY + "import json\n" + REPORT,
    "read_key_from_proc_fd": SPRAY + SIGNED + (
        "import hmac, hashlib, json\ntry:\n    head = open('/proc/self/fd/4', 'rb').readline().split()\n"
        "    signed(hmac.new(bytes.fromhex(head[1].decode()), digestmod=hashlib.sha256))\n"
        "except OSError as e:\n    print('refused:', e)\n    spray()\n") + REPORT,
    "recorder_frame": SPRAY + SIGNED + RECORDER + (
        "import json\ntry:\n    signed(send.__self__.gi_frame.f_locals['mac'])\nexcept PermissionError as e:\n"
        "    print('refused:', e)\n    spray()\n") + REPORT,
    "recorder_gc": SPRAY + SIGNED + RECORDER + (
        "import gc, json\ntry:\n    for o in gc.get_referents(send.__self__):\n        pass\n"
        "except PermissionError as e:\n    print('refused:', e)\n    spray()\n") + REPORT,
    "recorder_throw": SPRAY + SIGNED + RECORDER + (
        "import json\ntry:\n    send.__self__.throw(ValueError('x'))\n    print('refused: the recorder kept its frame')\n"
        "    spray()\nexcept ValueError as e:\n    tb = e.__traceback__\n"
        "    while tb.tb_next:\n        tb = tb.tb_next\n    signed(tb.tb_frame.f_locals['mac'])\n") + REPORT,
    "recorder_finaliser": SPRAY + SIGNED + RECORDER + (
        "import json\nfound = []\nclass Bait:\n    def __del__(self):\n        f = sys._getframe(1)\n"
        "        while f is not None:\n            if 'mac' in f.f_locals:\n                found.append(f.f_locals['mac'])\n"
        "            f = f.f_back\nsend(('gurobipy', Bait()))\nsend(('gurobipy', Bait()))\n"
        "if found:\n    signed(found[0])\nelse:\n    print('refused: no frame')\n    spray()\n") + REPORT,
    "recorder_fake_object": RECORDER + (
        "import json\nclass Fake:\n    pass\nsend(('gurobipy', Fake()))\n"
        "send(('register', ('gurobipy', type(sys)('gurobipy'))))\n") + REPORT,
    "subclass_overrides_readers": (
        "import json\nimport gurobipy as gp\nclass M(gp.Model):\n    def write(self, path):\n"
        f"        open(path, 'w').write({TRIVIAL_LP!r})\n    def getAttr(self, name, objs=None):\n        return 17.0\n"
        "m = M()\nm.Params.OutputFlag = 0\nx = m.addVar(ub=1, name='x')\nm.setObjective(x, gp.GRB.MAXIMIZE)\n"
        "m.optimize()\n") + REPORT,
    "lp_file_swap": (
        "import json, os, threading\nimport gurobipy as gp\nstop = False\n"
        "def swap():\n    while not stop:\n        for n in os.listdir('.'):\n            if n.endswith('.lp'):\n"
        f"                try:\n                    open(n, 'w').write({TRIVIAL_LP!r})\n"
        "                except OSError:\n                    pass\nt = threading.Thread(target=swap)\nt.start()\n"
        "m = gp.Model()\nm.Params.OutputFlag = 0\nx = m.addVar(ub=1, name='x')\nm.setObjective(x, gp.GRB.MAXIMIZE)\n"
        "for _ in range(20):\n    m.optimize()\nstop = True\nt.join()\n") + REPORT,
}
PINNED = ("import json\nimport gurobipy as gp\nm = gp.Model()\nm.Params.OutputFlag = 0\n"
          "x = m.addVar(lb=17, ub=17, name='x')\nm.setObjective(x, gp.GRB.MAXIMIZE)\nm.optimize()\n") + REPORT

ITEM = Item("toy", "Maximise x + 2y.", parse_truth("17"))
LIMITS = dict(timeout_s=30.0, memory_mb=2048, max_output_kb=256)


def eval_verdict(code: str) -> str:
    execution, _, _ = asyncio.run(run_program(code, ITEM, **LIMITS))  # type: ignore[arg-type]
    return classify(code, None, execution, get_protocol("sirl"), ITEM)[0].category


def ordata_outcome(code: str) -> str:
    """The ORData chain on the sandbox run, past the import gate (to show the later gates hold on their own)."""
    run = run_python(code, limits=Limits(timeout_s=30))
    g = gates.execution_gate(run)
    if g.accepted:
        g = gates.structural_gate(run.solve, gates.instance_model(instance()))
    if g.accepted:
        g = gates.objective_gate(run.objective, reference_optimum(), 1e-6)
    return g.outcome


def test_reference_optimum() -> None:
    assert reference_optimum() == 17.0


def test_the_honest_program_is_accepted_everywhere() -> None:
    run = run_python(HONEST, limits=Limits(timeout_s=30))
    assert run.records_refused is None and run.objective == 17.0 and run.solve and "x" in run.solve["lp"]
    assert eval_verdict(HONEST) == "correct"
    assert ordata_outcome(HONEST) == "accepted"
    assert gates.ast_gate(HONEST, "gurobipy").accepted
    reward = asyncio.run(ORVerifier(RewardWeights(0.5, 1.0, 1.0), workers=1).score(
        [f"```python\n{HONEST}```"], [ITEM]))[0]
    assert (reward.format, reward.execution, reward.objective) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forgery_is_refused_by_every_consumer(name: str) -> None:
    code = FORGERIES[name]
    verdict = eval_verdict(code)
    assert verdict != "correct", (name, verdict)
    reward = asyncio.run(ORVerifier(RewardWeights(0.5, 1.0, 1.0), workers=1).score(
        [f"```python\n{code}```"], [ITEM]))[0]
    assert reward.objective == 0.0, (name, reward)
    assert ordata_outcome(code) != "accepted", name


def test_a_forged_record_refuses_the_runs_records() -> None:
    run = run_python(FORGERIES["record_before_solve"], limits=Limits(timeout_s=30))
    assert run.ok and run.solves == [] and run.solve is None
    assert run.records_refused == "record 1 was not written by the solver recorder"
    assert gates.execution_gate(run).reason == "exec.forged_record"


def test_recorder_routes_are_closed_in_the_program() -> None:
    """The routes to the recorder's key are refused inside the sandbox (not merely unused)."""
    for name in ("read_key_from_proc_fd", "recorder_frame", "recorder_gc", "recorder_throw", "recorder_finaliser"):
        run = run_python(FORGERIES[name], limits=Limits(timeout_s=30))
        assert "refused:" in run.stdout, (name, run.stdout, run.stderr[-500:])


def test_subclass_cannot_change_what_is_recorded() -> None:
    run = run_python(FORGERIES["subclass_overrides_readers"], limits=Limits(timeout_s=30))
    assert run.records_refused is None and run.solve is not None
    assert run.solve["objective"] == 1.0 and "x = 17" not in (run.solve["lp"] or "")


def test_pinned_model_is_correct_in_eval_and_refused_by_the_structural_gate() -> None:
    assert eval_verdict(PINNED) == "correct"  # the published protocols accept a pinned model
    assert ordata_outcome(PINNED) == "structure.mismatch"


CONSTANT = HONEST.replace("m.setObjective(x + 2 * y, GRB.MAXIMIZE)", "m.setObjective(gp.LinExpr(17.0), GRB.MAXIMIZE)")


def grpo(code: str, item: Item, **kw: bool) -> tuple[float, float, float, str]:
    r = asyncio.run(ORVerifier(RewardWeights(0.5, 1.0, 1.0), workers=1, **kw).score([f"```python\n{code}```"],
                                                                                     [item]))[0]
    return r.format, r.execution, r.objective, r.outcome


@pytest.mark.parametrize("reference", ["answer", "lp"])
def test_grpo_rewards_only_the_reference_model(reference: str) -> None:
    """With a reference model (an ORData prompt's reference answer, or a reference LP), a pinned model and a
    constant objective earn the format term only; the honest model earns everything; without the check (or
    without a reference) the pinned model is correct, as under the published protocols."""
    if reference == "answer":
        item = Item("toy-ref", "Maximise x + 2y.", parse_truth("17"),
                    meta={"reference": f"The model.\n```python\n{HONEST}```\nObjective 17."})
    else:
        lp = run_python(HONEST, limits=Limits(timeout_s=30)).solve
        assert lp is not None and lp["lp"]
        item = Item("toy-lp", "Maximise x + 2y.", parse_truth("17"), reference_lp=lp["lp"])
    assert eval_verdict(CONSTANT) == "correct"
    assert grpo(HONEST, item, import_gate=True) == (1.0, 1.0, 1.0, "correct")
    assert grpo(PINNED, item, import_gate=True) == (1.0, 0.0, 0.0, "structure_mismatch")
    assert grpo(CONSTANT, item, import_gate=True) == (1.0, 0.0, 0.0, "structure_mismatch")
    assert grpo(PINNED, item, structure=False) == (1.0, 1.0, 1.0, "correct")
    assert grpo(PINNED, ITEM) == (1.0, 1.0, 1.0, "correct")


def test_grpo_import_gate() -> None:
    assert grpo(FORGERIES["random_os_fd4"], ITEM, import_gate=True) == (1.0, 0.0, 0.0, "forbidden_code")
    assert grpo(FORGERIES["random_os_fd4"], ITEM)[3] == "no_solver_call"


# In an ungated program, a Python signal handler's frame argument can reach the recorder's frame (as can ctypes
# memory reads); the import contract of ORData and GRPO refuses both routes.
SIGNAL_ROUTE = ("import json, signal\nimport gurobipy as gp\nfound = []\ndef handler(signum, frame):\n"
                "    while frame is not None and not found:\n        if 'mac' in frame.f_locals:\n"
                "            found.append(frame.f_locals['mac'])\n        frame = frame.f_back\n"
                "signal.signal(signal.SIGALRM, handler)\nsignal.setitimer(signal.ITIMER_REAL, 5e-5, 5e-5)\n"
                "m = gp.Model()\nm.optimize()\n") + REPORT
CTYPES_ROUTE = "import ctypes, json\nctypes.string_at(id(json), 8)\n" + REPORT


@pytest.mark.parametrize("code", [SIGNAL_ROUTE, CTYPES_ROUTE])
def test_in_process_routes_are_refused_by_the_import_contract(code: str) -> None:
    assert not gates.ast_gate(code, "gurobipy").accepted and not gates.ast_gate(code, "highspy").accepted
    assert grpo(code, ITEM, import_gate=True) == (1.0, 0.0, 0.0, "forbidden_code")
