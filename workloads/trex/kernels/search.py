"""Stage 2: hardware-grounded tree search over (variant, params) nodes.

Edges are moves: one parameter changed, labelled with its direction (tile, vectorise, unroll, multi-row,
loop-order, fusion, accumulation, threads). A move becomes a node only when its candidate passes the
correctness gate and its measured gain over the parent is significant (see profile.accept). The state
(tree, trial log, budget spent) is one JSON file rewritten atomically after every trial, so the search
resumes after a kill without repeating a completed trial; every verified node also gets its own
checkpoint (a snapshot of the state at that moment) that ``rollback`` restores exactly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trex.fsio import atomic_write_bytes
from trex.kernels.backends.base import DIRECTION_OF, ParamSpace
from trex.kernels.skills import Skill, move_scores

STATE_VERSION = 1


@dataclass(frozen=True)
class TrialResult:
    """Outcome of evaluating one candidate against its parent."""

    status: str
    """accepted | rejected (not significant) | incorrect | ceiling | failed (build error)."""
    reason: str = ""
    median_s: float = 0.0
    baseline_s: float = 0.0
    gain: float = 0.0
    ci: tuple[float, float] = (0.0, 0.0)
    source_hash: str = ""


class Evaluator(Protocol):
    """Compiles, verifies and profiles candidates (or stands in for that with a cost model in tests)."""

    def measure_root(self, params: Mapping[str, int]) -> TrialResult:
        """Verify and time the starting configuration (status 'root' when usable)."""
        ...

    def evaluate(self, params: Mapping[str, int], parent: Mapping[str, int]) -> TrialResult:
        """Compile, gate and profile ``params`` against ``parent``."""
        ...

    def predict(self, params: Mapping[str, int]) -> float:
        """Cost-model seconds (orders the moves)."""
        ...


@dataclass(frozen=True)
class Move:
    """Change one parameter to a new value."""

    param: str
    value: int

    @property
    def direction(self) -> str:
        return DIRECTION_OF.get(self.param, "tile")


@dataclass
class Budget:
    """Trials and seconds, whichever runs out first (counted across resumes)."""

    trials: int = 200
    seconds: float = 1800.0


@dataclass
class SearchConfig:
    """Static inputs of one search."""

    space: ParamSpace
    root: dict[str, int]
    budget: Budget = field(default_factory=Budget)
    plan_order: Sequence[str] = ()
    """Parameters in the order the tiling model suggests exploring them."""
    skills: Sequence[tuple[Skill, float]] = ()
    meta: dict[str, Any] = field(default_factory=dict)
    target_speedup: float | None = None
    """Stop as soon as the best node reaches this speedup over the root (used to compare searches)."""
    extra_moves: Callable[[Mapping[str, int]], list[Move]] | None = None
    """Additional proposals (e.g. from an LLM), tried after skill-backed moves."""


def params_key(p: Mapping[str, int]) -> str:
    """Canonical text of a parameter set (trial de-duplication key)."""
    return json.dumps({k: int(v) for k, v in sorted(p.items())}, separators=(",", ":"))


def _atomic_write(path: Path, data: dict[str, Any]) -> None:
    atomic_write_bytes(path, json.dumps(data, indent=1, sort_keys=True).encode())


def new_state(cfg: SearchConfig, root_result: TrialResult) -> dict[str, Any]:
    """Initial state: the root node (already verified and timed)."""
    root = {"id": 0, "parent": None, "params": dict(cfg.root), "move": None, "direction": None,
            "median_s": root_result.median_s, "gain": 1.0, "speedup": 1.0, "ci": [1.0, 1.0],
            "source_hash": root_result.source_hash, "trial": None}
    return {"version": STATE_VERSION, "meta": cfg.meta, "nodes": [root], "next_id": 1, "best": 0, "current": 0,
            "exhausted": [], "trials": [], "elapsed_s": 0.0, "done": False, "stop_reason": ""}


def load_state(path: Path) -> dict[str, Any] | None:
    """The saved state, or None when there is none."""
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if data.get("version") != STATE_VERSION:
        raise ValueError(f"{path}: state version {data.get('version')} unsupported (expected {STATE_VERSION})")
    return data


def _node(state: dict[str, Any], nid: int) -> dict[str, Any]:
    for n in state["nodes"]:
        if n["id"] == nid:
            return dict(n)
    raise KeyError(f"node {nid} not in the search tree")


def checkpoint_path(state_path: Path, nid: int) -> Path:
    """Where node ``nid``'s snapshot lives."""
    return state_path.parent / "checkpoints" / f"{state_path.stem}-node-{nid}.json"


def candidate_moves(params: Mapping[str, int], cfg: SearchConfig, predict: Callable[[Mapping[str, int]], float],
                    tried: set[str]) -> list[Move]:
    """Untried one-parameter moves from ``params``, best first.

    Every other value of every parameter is a candidate; order: skill score (exact move, then parameter), extra proposals, then predicted time,
    then the tiling model's parameter order.
    """
    exact, by_param = move_scores(cfg.skills)
    extra = cfg.extra_moves(params) if cfg.extra_moves else []
    extra_set = {(m.param, m.value) for m in extra}
    plan_rank = {p: i for i, p in enumerate(cfg.plan_order)}
    cands: dict[tuple[str, int], Move] = {}
    for p, vals in cfg.space.items():
        cur = params[p]
        for v in vals:
            if v != cur and params_key({**params, p: v}) not in tried:
                cands[(p, v)] = Move(p, v)

    def key(m: Move) -> tuple[float, float, int, float, int, str]:
        child = {**params, m.param: m.value}
        return (-exact.get((m.param, m.value), 0.0), -by_param.get(m.param, 0.0),
                0 if (m.param, m.value) in extra_set else 1, predict(child),
                plan_rank.get(m.param, len(plan_rank)), m.param)
    return sorted(cands.values(), key=key)


def _frontier(state: dict[str, Any]) -> int | None:
    """The best-speedup node that still has untried moves (None when every node is exhausted)."""
    ex = set(state["exhausted"])
    live = [n for n in state["nodes"] if n["id"] not in ex]
    return max(live, key=lambda n: (n["speedup"], -n["id"]))["id"] if live else None


def run_search(state_path: str | Path, evaluator: Evaluator, cfg: SearchConfig,
               on_trial: Callable[[dict[str, Any]], None] | None = None,
               on_accept: Callable[[dict[str, Any], dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the search until a budget or the target is reached, or no move is left."""
    path = Path(state_path)
    state = load_state(path)
    if state is None:
        root = evaluator.measure_root(cfg.root)
        if root.status != "root":
            raise RuntimeError(f"root configuration failed: {root.status}: {root.reason}")
        state = new_state(cfg, root)
        _atomic_write(path, state)
        _atomic_write(checkpoint_path(path, 0), state)
    state["done"] = False
    start = time.monotonic() - float(state["elapsed_s"])
    tried = {t["key"] for t in state["trials"]} | {params_key(n["params"]) for n in state["nodes"]}

    def stop(reason: str) -> dict[str, Any]:
        state["done"], state["stop_reason"] = True, reason
        state["elapsed_s"] = time.monotonic() - start
        _atomic_write(path, state)
        return state

    while True:
        best = _node(state, state["best"])
        if cfg.target_speedup is not None and best["speedup"] >= cfg.target_speedup:
            return stop("target reached")
        if len(state["trials"]) >= cfg.budget.trials:
            return stop("trial budget spent")
        if time.monotonic() - start >= cfg.budget.seconds:
            return stop("time budget spent")
        node = _node(state, state["current"])
        moves = candidate_moves(node["params"], cfg, evaluator.predict, tried)
        if not moves:
            state["exhausted"].append(node["id"])
            nxt = _frontier(state)
            if nxt is None:
                return stop("search space exhausted")
            state["current"] = nxt
            continue
        m = moves[0]
        child = {**node["params"], m.param: m.value}
        pred = evaluator.predict(child)
        res = evaluator.evaluate(child, node["params"])
        key = params_key(child)
        tried.add(key)
        trial = {"n": len(state["trials"]), "node": node["id"], "key": key, "params": child, "param": m.param,
                 "value": m.value, "direction": m.direction, "predicted_s": pred, **asdict(res),
                 "at_s": time.monotonic() - start}
        state["trials"].append(trial)
        if res.status == "accepted":
            nid = int(state["next_id"])
            state["next_id"] = nid + 1
            new = {"id": nid, "parent": node["id"], "params": child, "move": [m.param, m.value],
                   "direction": m.direction, "median_s": res.median_s, "gain": res.gain,
                   "speedup": node["speedup"] * res.gain, "ci": list(res.ci), "source_hash": res.source_hash,
                   "trial": trial["n"]}
            state["nodes"].append(new)
            state["current"] = nid
            if new["speedup"] > best["speedup"]:
                state["best"] = nid
            state["elapsed_s"] = time.monotonic() - start
            _atomic_write(checkpoint_path(path, nid), state)
            if on_accept:
                on_accept(new, node)
        state["elapsed_s"] = time.monotonic() - start
        _atomic_write(path, state)
        if on_trial:
            on_trial(trial)


def rollback(state_path: str | Path, node_id: int) -> dict[str, Any]:
    """Restore the state checkpointed when ``node_id`` was accepted and make it the node to branch from.

    The trial log stays append-only (moves measured after the checkpoint are not repeated; the search
    branches elsewhere); everything else is exactly the snapshot.
    """
    path = Path(state_path)
    current = load_state(path)
    snap_path = checkpoint_path(path, node_id)
    if not snap_path.exists():
        raise KeyError(f"no checkpoint for node {node_id} (only verified nodes are checkpointed)")
    snap: dict[str, Any] = json.loads(snap_path.read_text(encoding="utf-8"))
    if current is not None:
        snap["trials"] = current["trials"]
        snap["next_id"] = max(int(current["next_id"]), int(snap["next_id"]))
        snap["elapsed_s"] = current["elapsed_s"]
    snap["current"] = node_id
    snap["exhausted"] = [e for e in snap["exhausted"] if e != node_id]
    snap["done"] = False
    _atomic_write(path, snap)
    return snap


def best_node(state: Mapping[str, Any]) -> dict[str, Any]:
    """The node with the highest verified speedup."""
    return _node(dict(state), int(state["best"]))


def trials_to_reach(state: Mapping[str, Any], speedup: float) -> int | None:
    """Number of trials after which the tree first held a node with at least ``speedup`` (None if never)."""
    for n in sorted(state["nodes"], key=lambda n: n["trial"] if n["trial"] is not None else -1):
        if n["speedup"] >= speedup - 1e-12:
            return 0 if n["trial"] is None else int(n["trial"]) + 1
    return None
