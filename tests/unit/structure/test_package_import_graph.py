"""The import graph of workloads/trex, read statically (ast): no module imports itself back through others.

Module-level imports (``if TYPE_CHECKING:`` blocks left out: they never run) must form no cycle at all, and
neither may they once the imports inside functions are counted too: an import moved into a function does not
make a cycle go away. Any cycle fails with its path printed.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3] / "workloads"

def modules() -> dict[str, Path]:
    """Dotted name -> file of every module under workloads/trex."""
    out = {}
    for p in sorted((ROOT / "trex").rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _statements(body: list[ast.stmt], nested: bool) -> Iterator[ast.stmt]:
    """The statements of ``body`` that run when the module (``nested``: or any function in it) runs."""
    for s in body:
        if isinstance(s, ast.If) and "TYPE_CHECKING" in ast.unparse(s.test):
            yield from _statements(s.orelse, nested)
            continue
        yield s
        children: list[list[ast.stmt]] = []
        if isinstance(s, (ast.If, ast.For, ast.While, ast.With)):
            children = [s.body, s.orelse] if not isinstance(s, ast.With) else [s.body]
        elif isinstance(s, ast.Try):
            children = [s.body, s.orelse, s.finalbody, *(h.body for h in s.handlers)]
        elif nested and isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            children = [s.body]
        elif isinstance(s, ast.ClassDef):
            children = [s.body]
        for c in children:
            yield from _statements(c, nested)


def graph(nested: bool) -> dict[str, set[str]]:
    """Module -> the trex modules it imports (with the packages a dotted import runs)."""
    mods = modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for s in _statements(ast.parse(path.read_text(encoding="utf-8")).body, nested):
            targets: list[str] = []
            if isinstance(s, ast.Import):
                targets = [a.name for a in s.names]
            elif isinstance(s, ast.ImportFrom):
                base = s.module or ""
                if s.level:
                    pkg = m.split(".") if is_pkg else m.split(".")[:-1]
                    base = ".".join(pkg[:len(pkg) - s.level + 1] + ([s.module] if s.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in s.names]
            for t in targets:
                o = owner(t)
                if o is None or o == m:
                    continue
                edges[m].add(o)
                parts = o.split(".")
                for i in range(1, len(parts)):  # importing a.b.c runs a and a.b
                    parent = ".".join(parts[:i])
                    if parent in mods and parent != m and not m.startswith(parent + "."):
                        edges[m].add(parent)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def cycle_path(edges: dict[str, set[str]], comp: list[str]) -> str:
    """One shortest import cycle through the first module of ``comp``, as a -> b -> ... -> a."""
    start, inside = comp[0], set(comp)
    prev: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(edges[v] & inside):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return " -> ".join([*reversed(path), start])
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return " -> ".join(comp)


def test_module_level_imports_form_no_cycle() -> None:
    edges = graph(nested=False)
    assert len(edges) > 100  # the whole package was read
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(cycle_path(edges, c) for c in found)


def test_imports_inside_functions_form_no_cycle() -> None:
    edges = graph(nested=True)
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(cycle_path(edges, c) for c in found)


def test_the_check_sees_a_cycle() -> None:
    """The detector itself: a two-module cycle and a three-module one are found, a chain is not."""
    edges = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"g"}, "g": set()}
    found = cycles(edges)
    assert sorted(found) == [["a", "b"], ["c", "d", "e"]]
    assert cycle_path(edges, ["c", "d", "e"]) == "c -> d -> e -> c"
