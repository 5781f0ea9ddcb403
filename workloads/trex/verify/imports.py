"""The import contract of generated solver programs (ORData's gate and GRPO's reward): names, not modules.

A program may import only the allowed modules of its solver family (:data:`ALLOWED_MODULES`) and use them only
through public names that are not forbidden; a module is never a value (``m = random`` would hand ``random._os``
on), no attribute anywhere is private or a dunder, and nothing defined by an os-, sys-, io-, subprocess- or
ctypes-level module (:data:`FORBIDDEN_ORIGINS`) may be reached through any re-export. Attribute chains from an
imported module are resolved by importing the allowed modules here, in the trusted parent.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Sequence
from typing import Any

# Modules a program may import or reach, per solver family: names, not packages (``numpy.ctypeslib`` or
# ``fractions.sys`` are not in it). ``None`` (the family is not known) allows both families.
COMMON_MODULES = frozenset({
    "math", "cmath", "itertools", "json", "collections", "collections.abc", "functools", "fractions", "decimal",
    "statistics", "typing", "dataclasses", "operator", "heapq", "bisect", "random", "string", "enum", "copy",
    "__future__",
})
_NUMPY = frozenset({"numpy", "numpy.linalg", "numpy.random"})
ALLOWED_MODULES: dict[str | None, frozenset[str]] = {
    "gurobipy": COMMON_MODULES | _NUMPY | {"gurobipy", "gurobipy.nlfunc"},
    "highspy": COMMON_MODULES | _NUMPY | {"highspy"},
}
ALLOWED_MODULES[None] = ALLOWED_MODULES["gurobipy"] | ALLOWED_MODULES["highspy"]
ALLOWED_IMPORTS = frozenset(m.split(".")[0] for m in ALLOWED_MODULES[None])
FORBIDDEN_NAMES = frozenset({
    "open", "exec", "eval", "compile", "__import__", "input", "breakpoint", "globals", "locals", "vars",
    "getattr", "setattr", "delattr", "memoryview", "help", "__builtins__", "__loader__", "__spec__",
})
# Method names that read or write files, start processes or touch the network, whatever the receiver.
FORBIDDEN_METHODS = frozenset({
    "system", "popen", "Popen", "spawn", "urlopen", "connect", "load", "loads_file", "save", "savez",
    "savez_compressed", "savetxt", "loadtxt", "genfromtxt", "fromfile", "tofile", "memmap", "dump", "write",
    "read", "writeModel", "readModel", "writeSolution", "readSolution", "writeBasis", "readBasis", "writeInfo",
    "writeOptions", "readOptions", "writeParams", "readParams", "setLogFile", "import_module", "get_field",
})
# Names of allowed modules that reach attributes by string, evaluate text or open files.
FORBIDDEN_MODULE_NAMES: dict[str, frozenset[str]] = {
    "operator": frozenset({"attrgetter", "methodcaller"}),
    "string": frozenset({"Formatter"}),
    "typing": frozenset({"get_type_hints", "ForwardRef"}),
    "numpy": frozenset({"fromregex", "DataSource", "info", "show_config", "show_runtime", "get_include"}),
}
# Where an object may not come from, whatever allowed name re-exports it.
FORBIDDEN_ORIGINS = frozenset({
    "os", "posix", "nt", "posixpath", "ntpath", "sys", "subprocess", "_posixsubprocess", "ctypes", "_ctypes", "io",
    "_io", "shutil", "socket", "_socket", "importlib", "pathlib", "tempfile", "pty", "signal", "_signal", "gc",
    "inspect", "builtins",
})
ALLOWED_DUNDERS = frozenset({"__init__", "__name__", "__doc__"})
_MISSING = object()


def called_name(call: ast.Call) -> tuple[str | None, str | None]:
    """(plain function name, method name) of a call."""
    f = call.func
    if isinstance(f, ast.Name):
        return f.id, None
    if isinstance(f, ast.Attribute):
        return None, f.attr
    return None, None


def _module(name: str) -> Any:
    """The module ``name`` imported here (in the trusted parent), or None when it cannot be."""
    import importlib

    try:
        return importlib.import_module(name)
    except Exception:
        return None


def _attribute(owner: Any, owner_name: str, attr: str) -> Any:
    """``owner.attr`` as the program would see it, a submodule included; :data:`_MISSING` when absent."""
    try:
        return getattr(owner, attr)
    except Exception:
        pass
    if isinstance(owner, types.ModuleType):
        sub = _module(f"{owner_name}.{attr}")
        if sub is not None:
            return sub
    return _MISSING


def _dangerous(obj: Any) -> bool:
    """A builtin the contract forbids by name, or an object defined by a module of :data:`FORBIDDEN_ORIGINS`."""
    import builtins

    if any(obj is getattr(builtins, n, None) for n in FORBIDDEN_NAMES if not n.startswith("__") or n == "__import__"):
        return True
    origin = getattr(obj, "__module__", None) if callable(obj) else type(obj).__module__
    if not isinstance(origin, str):
        origin = type(obj).__module__
    return origin.split(".")[0] in FORBIDDEN_ORIGINS and not (origin == "builtins" and not callable(obj))


def name_check(module: str, attrs: Sequence[str], allowed: frozenset[str]) -> str | None:
    """Why ``module.attrs[0].attrs[1]...`` is refused, or None: every name public and not forbidden, every
    module passed through allowed, the end no module and nothing from a forbidden origin (resolved by
    importing the allowed modules here; a module this process cannot import is checked by name only)."""
    if not attrs:
        return f"module {module} used as a value"
    owner: Any = _module(module)
    owner_name = module
    for i, attr in enumerate(attrs):
        dotted = ".".join((module, *attrs[:i + 1]))
        if attr.startswith("_") or attr in FORBIDDEN_METHODS or attr in FORBIDDEN_MODULE_NAMES.get(owner_name, ()):
            return f"{dotted} is not an allowed name"
        if owner is None:
            return None
        obj = _attribute(owner, owner_name, attr)
        if obj is _MISSING:
            return f"{dotted} does not exist"
        if isinstance(obj, types.ModuleType):
            if obj.__name__ not in allowed:
                return f"{dotted} is module {obj.__name__}, not an allowed module"
            if i == len(attrs) - 1:
                return f"{dotted} is a module used as a value"
            owner, owner_name = obj, obj.__name__
            continue
        if _dangerous(obj):
            return f"{dotted} re-exports {getattr(obj, '__module__', type(obj).__module__)}"
        if not isinstance(obj, type):
            return None
        owner, owner_name = obj, dotted
    return None


def import_problem(code: str, solver: str | None = None) -> tuple[str, str] | None:
    """The names a program may use: allowed modules of its solver family (:data:`ALLOWED_MODULES`) used only
    through public, non-forbidden names (a module never as a value: ``m = random`` would hand ``random._os``
    on), no private or dunder attribute anywhere, no forbidden builtin, no star import. None when the code keeps
    the contract, else (what: syntax_error, forbidden_import, forbidden_call or forbidden_attribute, detail)."""
    if solver not in ALLOWED_MODULES:
        raise ValueError(f"solver must be one of gurobipy, highspy or None, got {solver!r}")
    allowed = ALLOWED_MODULES[solver]
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return ("syntax_error", f"line {exc.lineno}: {exc.msg}")
    except ValueError as exc:  # e.g. NUL bytes
        return ("syntax_error", str(exc))
    bound: dict[str, str] = {}  # names bound to modules -> module name
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name not in allowed:
                    return ("forbidden_import", f"line {node.lineno}: import {a.name}")
                if a.asname:
                    bound[a.asname] = a.name
                else:
                    root = a.name.split(".")[0]
                    if root not in allowed:
                        return ("forbidden_import", f"line {node.lineno}: import {a.name}")
                    bound[root] = root
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level or mod not in allowed:
                return ("forbidden_import", f"line {node.lineno}: from {'.' * node.level}{mod} import")
            for a in node.names:
                if a.name == "*":
                    return ("forbidden_import", f"line {node.lineno}: from {mod} import *")
                if f"{mod}.{a.name}" in allowed:  # an allowed submodule, bound like an import
                    bound[a.asname or a.name] = f"{mod}.{a.name}"
                elif why := name_check(mod, [a.name], allowed):
                    return ("forbidden_import", f"line {node.lineno}: {why}")
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id in FORBIDDEN_NAMES or (node.id.startswith("__") and node.id not in ALLOWED_DUNDERS):
                return ("forbidden_call", f"line {node.lineno}: {node.id}")
            if node.id in bound:
                attrs: list[str] = []
                cur: ast.AST = node
                while isinstance(up := parents.get(id(cur)), ast.Attribute) and up.value is cur:
                    attrs.append(up.attr)
                    cur = up
                why = name_check(bound[node.id], attrs, allowed)
                if why:
                    return ("forbidden_attribute", f"line {node.lineno}: {why}")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and node.attr not in ALLOWED_DUNDERS:
            return ("forbidden_attribute", f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call):
            _, method = called_name(node)
            if method in FORBIDDEN_METHODS:
                return ("forbidden_call", f"line {node.lineno}: .{method}()")
    return None
