"""docs/ARCHITECTURE.md's dependency rules, read from the source with `ast` (every import, also those inside
functions and TYPE_CHECKING blocks): the operator sits above the workloads, the workloads are siblings over the
OR contract (trex.verify) and the text layer (trex.text), and the floors (sandbox, runtime, telemetry) import
nothing above them. A failure lists each violating edge as `file:line importer -> imported`."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ROOTS = (REPO / "workloads", REPO / "operator")

WORKLOADS = ("trex.trainer", "trex.ordata", "trex.evaluation", "trex.kernels")
FLOORS = ("trex.sandbox", "trex.runtime", "trex.telemetry")
SHARED = ("trex.verify", "trex.text")

# (importer prefix, imported prefix, why): the only edges between sibling workloads that are kept.
EXCEPTIONS: tuple[tuple[str, str, str], ...] = tuple(
    ("trex.trainer.kernels", f"trex.kernels.{lib}",
     "the trainer runs the kernels AuraKernel tuned: it compiles them with the kernel library (backends, op suite, "
     "tuned-kernel registry, output check), not the tuning workload (tune, search, cli)")
    for lib in ("backends", "suite", "registry", "verify"))


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def imports(roots: tuple[Path, ...]) -> Iterator[tuple[str, str, list[str]]]:
    """(file:line, importing module, imported modules) of every import statement under ``roots``; ``from a import
    b`` imports ``a.b`` when ``b`` is a module under ``roots``, else ``a``."""
    modules = {".".join(f.relative_to(r).with_suffix("").parts).removesuffix(".__init__")
               for r in roots for f in r.rglob("*.py")}
    for root in roots:
        for f in sorted(root.rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            package = parts[:-1]
            module = ".".join(package if parts[-1] == "__init__" else parts)
            shown = f.relative_to(REPO) if f.is_relative_to(REPO) else f.relative_to(root)
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
                if isinstance(node, ast.Import):
                    yield f"{shown}:{node.lineno}", module, [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = package[:len(package) - node.level + 1] if node.level else []
                    head = ".".join([*base, *([node.module] if node.module else [])])
                    yield f"{shown}:{node.lineno}", module, [
                        f"{head}.{a.name}" if f"{head}.{a.name}" in modules else head for a in node.names]


def broken_rule(src: str, dst: str) -> str | None:
    """The rule the edge ``src -> dst`` breaks, or None."""
    if _under(src, "trex") and _under(dst, "trex_operator"):
        return "nothing under workloads imports the operator"
    if any(_under(src, p) for p in FLOORS) and any(_under(dst, p) for p in (*WORKLOADS, *SHARED)):
        return "sandbox, runtime and telemetry import nothing above them"
    if any(_under(src, p) for p in SHARED) and any(_under(dst, p) for p in WORKLOADS):
        return "trex.verify and trex.text import no workload"
    own = next((w for w in WORKLOADS if _under(src, w)), None)
    other = next((w for w in WORKLOADS if _under(dst, w)), None)
    if own and other and own != other and not any(_under(src, a) and _under(dst, b) for a, b, _ in EXCEPTIONS):
        return "trainer, ordata, evaluation and kernels do not import each other"
    return None


def violations(roots: tuple[Path, ...]) -> list[str]:
    """Every import statement that breaks a rule, as 'file:line importer -> imported (rule)'."""
    out: list[str] = []
    for where, src, targets in imports(roots):
        for dst in dict.fromkeys(targets):
            if rule := broken_rule(src, dst):
                out.append(f"{where} {src} -> {dst} ({rule})")
    return out


def test_the_tree_keeps_the_dependency_rules() -> None:
    bad = violations(ROOTS)
    assert not bad, "import edges breaking docs/ARCHITECTURE.md's dependency rules:\n" + "\n".join(bad)


def test_every_exception_is_still_needed() -> None:
    used = {(a, b) for _, src, targets in imports(ROOTS) for dst in targets for a, b, _ in EXCEPTIONS
            if _under(src, a) and _under(dst, b)}
    assert used == {(a, b) for a, b, _ in EXCEPTIONS}, f"unused exceptions: {set((a, b) for a, b, _ in EXCEPTIONS) - used}"


def test_a_violation_is_reported_with_its_edge(tmp_path: Path) -> None:
    pkg = tmp_path / "trex"
    for sub in ("sandbox", "ordata", "verify", "trainer", "kernels", "kernels/suite"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels" / "tune.py").write_text("")
    (pkg / "ordata" / "budgets.py").write_text("def f():\n    from trex.trainer.data import packing\n")
    (pkg / "sandbox" / "run.py").write_text("from ..verify import items\n")
    (pkg / "verify" / "x.py").write_text("import trex_operator.api\nfrom . import items\n")
    (pkg / "trainer" / "kernels.py").write_text("from trex.kernels.suite import SUITE\nfrom trex.kernels import tune\n")
    bad = violations((tmp_path,))
    assert any("trex.ordata.budgets -> trex.trainer.data" in b and ":2 " in b for b in bad), bad
    assert any("trex.sandbox.run -> trex.verify" in b for b in bad), bad
    assert any("trex.verify.x -> trex_operator.api" in b for b in bad), bad
    assert any("trex.trainer.kernels -> trex.kernels.tune" in b for b in bad), bad
    assert not any("trex.kernels.suite" in b for b in bad), bad
    assert not any("trex.verify.x -> trex.verify.items" in b for b in bad), bad
