"""Tree search on a deterministic synthetic cost model: rollback, resume after kill, skills."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from trex.kernels.search import Budget, SearchConfig, checkpoint_path, rollback, run_search, trials_to_reach
from trex.kernels.skills import Context, Skill, SkillLibrary

SYNTH = textwrap.dedent('''
    import time
    from trex.kernels.search import TrialResult

    SPACE = {"BLOCK": (64, 128, 256, 512, 1024), "VEC": (0, 8, 16), "UNROLL": (1, 2, 4, 8), "THREADS": (1, 2)}
    ROOT = {"BLOCK": 64, "VEC": 0, "UNROLL": 1, "THREADS": 2}

    class Synthetic:
        """Exact multiplicative cost; a candidate is accepted when >= 3 % faster than its parent."""

        def __init__(self, opt, scale=1.0, sleep=0.0, log=None, park_after=0):
            self.opt, self.scale, self.sleep, self.log, self.calls = opt, scale, sleep, log, []
            self.park_after = park_after  # > 0: the evaluation after that many never returns (to be killed)

        def cost(self, p):
            c = self.scale
            for k, v in p.items():
                vals = SPACE[k]
                c *= 1.0 + 0.35 * abs(vals.index(v) - vals.index(self.opt[k]))
            return c

        def measure_root(self, p):
            return TrialResult("root", "", self.cost(p), self.cost(p), 1.0, (1.0, 1.0), "h")

        def predict(self, p):
            return 1.0  # an uninformative model: move order then falls back to the plan order

        def evaluate(self, p, parent):
            self.calls.append(dict(p))
            if self.log:
                with open(self.log, "a") as fh:
                    fh.write(repr(sorted(p.items())) + "\\n")
            if self.sleep:
                time.sleep(self.sleep)
            if self.park_after and len(self.calls) > self.park_after:
                time.sleep(600)
            g = self.cost(parent) / self.cost(p)
            st = "accepted" if g >= 1.03 else "rejected"
            return TrialResult(st, "", self.cost(p), self.cost(parent), g, (g, g), "h")
''')


def _synth() -> dict[str, Any]:
    ns: dict[str, Any] = {}
    exec(SYNTH, ns)
    return ns


OPT_A = {"BLOCK": 1024, "VEC": 16, "UNROLL": 1, "THREADS": 1}


def _cfg(ns: dict[str, Any], trials: int, skills: Any = (), target: float | None = None) -> SearchConfig:
    return SearchConfig(space=ns["SPACE"], root=dict(ns["ROOT"]), budget=Budget(trials, 600.0),
                        plan_order=("UNROLL", "THREADS", "BLOCK", "VEC"), skills=skills, target_speedup=target)


def test_search_improves_and_never_repeats_a_trial(tmp_path: Path) -> None:
    ns = _synth()
    ev = ns["Synthetic"](OPT_A)
    st = run_search(tmp_path / "s.json", ev, _cfg(ns, 40))
    keys = [t["key"] for t in st["trials"]]
    assert len(keys) == len(set(keys))
    best = max(st["nodes"], key=lambda n: n["speedup"])
    # the verified speedup equals the true cost ratio of the synthetic model
    assert abs(best["speedup"] - ev.cost(ns["ROOT"]) / ev.cost(best["params"])) < 1e-9
    assert best["speedup"] > 3.0


def test_rollback_restores_exact_state_and_branches(tmp_path: Path) -> None:
    ns = _synth()
    path = tmp_path / "s.json"
    seen: dict[int, dict[str, Any]] = {}

    def on_trial(t: dict[str, Any]) -> None:
        state = json.loads(path.read_text())
        if t["status"] == "accepted":
            seen[state["next_id"] - 1] = state

    run_search(path, ns["Synthetic"](OPT_A), _cfg(ns, 25), on_trial=on_trial)
    target = sorted(seen)[1]
    snap = seen[target]
    before = json.loads(path.read_text())
    st = rollback(path, target)
    for key in ("nodes", "best", "exhausted", "meta", "version"):
        assert st[key] == snap[key], key
    assert st["current"] == target and st["trials"] == before["trials"]
    assert json.loads(path.read_text()) == st
    # branch again from the restored node: new nodes descend from it, no trial repeats
    st2 = run_search(path, ns["Synthetic"](OPT_A), _cfg(ns, 35))
    new = [n for n in st2["nodes"] if n["id"] >= before["next_id"]]
    assert new and new[0]["parent"] == target
    keys = [t["key"] for t in st2["trials"]]
    assert len(keys) == len(set(keys))
    assert checkpoint_path(path, target).exists()


def test_resume_after_kill_continues_without_repeating(tmp_path: Path) -> None:
    path, log = tmp_path / "state.json", tmp_path / "evals.log"
    script = tmp_path / "run.py"
    script.write_text(SYNTH + textwrap.dedent(f'''
        from trex.kernels.search import Budget, SearchConfig, run_search
        import os
        ev = Synthetic({OPT_A!r}, log={str(log)!r}, park_after=int(os.environ.get("PARK_AFTER", "0")))
        cfg = SearchConfig(space=SPACE, root=dict(ROOT), budget=Budget(14, 600.0),
                           plan_order=("UNROLL", "THREADS", "BLOCK", "VEC"))
        run_search({str(path)!r}, ev, cfg)
    '''))
    # The first run parks in its 5th evaluation: it is killed with exactly 4 trials saved, however slow the host.
    proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "PARK_AFTER": "4"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.exists():
            try:
                if len(json.loads(path.read_text())["trials"]) >= 4:
                    break
            except json.JSONDecodeError:
                pass
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    first = json.loads(path.read_text())
    assert len(first["trials"]) == 4 and not first["done"]
    n_before = len(log.read_text().splitlines())
    subprocess.run([sys.executable, str(script)], check=True, timeout=120)
    final = json.loads(path.read_text())
    assert final["done"] and len(final["trials"]) == 14
    assert final["trials"][: len(first["trials"])] == first["trials"]
    keys = [t["key"] for t in final["trials"]]
    assert len(keys) == len(set(keys))
    second_run = log.read_text().splitlines()[n_before:]
    done_before = {repr(sorted(t["params"].items())) for t in first["trials"]}
    assert not done_before & set(second_run)


def _skills_from(ns: dict[str, Any], tmp: Path, lib: SkillLibrary) -> float:
    def on_accept(new: dict[str, Any], parent: dict[str, Any]) -> None:
        p, v = new["move"]
        lib.add([Skill("rmsnorm_fwd", "norm", "memory", "cols2048-rows512", "cpu:test", "cpu-c", new["direction"], p,
                       int(parent["params"][p]), int(v), float(new["gain"]))])

    st = run_search(tmp / "first.json", ns["Synthetic"](OPT_A), _cfg(ns, 60), on_accept=on_accept)
    return float(max(n["speedup"] for n in st["nodes"]))


def test_skills_order_moves_and_cut_trials_on_a_related_kernel(tmp_path: Path) -> None:
    ns = _synth()
    lib = SkillLibrary(tmp_path / "skills.jsonl")
    first = _skills_from(ns, tmp_path, lib)
    ctx = Context("rmsnorm_bwd", "norm", "memory", "cols4096-rows256", "cpu:test", "cpu-c")
    matches = lib.retrieve(ctx)
    assert matches and all(w >= 2.0 for _, w in matches)
    assert not lib.retrieve(Context("grouped_gemm", "gemm", "compute", "x", "cpu:test", "cpu-c"))
    # retrieval orders moves: the first move proposed from the root is a skill's move
    from trex.kernels.search import candidate_moves

    first_move = candidate_moves(ns["ROOT"], _cfg(ns, 1, matches), lambda p: 1.0, set())[0]
    assert (first_move.param, first_move.value) in {(s.param, s.new) for s, _ in matches}
    # a related problem (same optimum, different scale): reach the first search's speedup in fewer trials
    related = {**OPT_A}
    plain = run_search(tmp_path / "plain.json", ns["Synthetic"](related, scale=3.0), _cfg(ns, 60, (), first))
    skilled = run_search(tmp_path / "skilled.json", ns["Synthetic"](related, scale=3.0), _cfg(ns, 60, matches, first))
    n_plain, n_skilled = trials_to_reach(plain, first), trials_to_reach(skilled, first)
    assert n_skilled is not None and n_plain is not None
    assert n_skilled < n_plain
