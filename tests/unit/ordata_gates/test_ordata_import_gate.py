"""The import gate allows names, not modules: every os/sys/subprocess/ctypes/posix/io re-export reachable from
an allowed module (found by walking attributes, private ones included) is refused, and so are the known
string-based and introspection routes; ordinary OR programs still pass."""

from __future__ import annotations

import importlib
import types
from collections.abc import Iterator

import pytest
from trex.ordata.gates import import_gate
from trex.verify.imports import ALLOWED_MODULES

TARGETS = ("os", "sys", "subprocess", "ctypes", "posix", "io")


def _origin(obj: object) -> str:
    mod = getattr(obj, "__module__", None) if callable(obj) else None
    return (mod if isinstance(mod, str) else "").split(".")[0]


def reexports(max_depth: int = 3) -> Iterator[tuple[str, str]]:
    """(allowed module, attribute path) of every target module, or function/class defined by one, reachable by
    attribute access through modules and classes (private names included), breadth first."""
    for root in sorted(ALLOWED_MODULES[None]):
        seen: set[int] = set()
        try:
            start = importlib.import_module(root)
        except ImportError:
            continue
        frontier: list[tuple[object, tuple[str, ...]]] = [(start, ())]
        for _ in range(max_depth):
            nxt: list[tuple[object, tuple[str, ...]]] = []
            for obj, path in frontier:
                for name in dir(obj):
                    try:
                        val = getattr(obj, name)
                    except Exception:
                        continue
                    p = (*path, name)
                    if isinstance(val, types.ModuleType) and val.__name__.split(".")[0] in TARGETS:
                        yield root, ".".join(p)
                        continue
                    if callable(val) and _origin(val) in TARGETS and id(val) not in seen:
                        seen.add(id(val))
                        yield root, ".".join(p)
                        continue
                    if isinstance(val, types.ModuleType | type) and id(val) not in seen:
                        seen.add(id(val))
                        nxt.append((val, p))
            frontier = nxt


REEXPORTS = sorted(set(reexports()))


def test_the_walk_finds_reexports() -> None:
    """The list is not empty (random._os, fractions.sys, typing.sys, dataclasses.sys ...)."""
    found = {f"{m}.{p}" for m, p in REEXPORTS}
    assert {"random._os", "fractions.sys", "typing.sys"} <= found
    assert len(REEXPORTS) > 20


@pytest.mark.parametrize(("module", "path"), REEXPORTS)
def test_every_reexport_is_refused(module: str, path: str) -> None:
    as_value = f"import {module} as m\nvalue = m.{path}\n"
    assert not import_gate(as_value).accepted, as_value
    head, _, rest = path.partition(".")
    from_import = f"from {module} import {head}\nvalue = {head}{'.' + rest if rest else ''}\n"
    assert not import_gate(from_import).accepted, from_import


@pytest.mark.parametrize("code", [
    "from random import _os\n_os.fdopen(4, 'w')\n",
    "import random\nr = random\nr.seed(1)\n",  # a module as a value hands its privates on
    "import operator\nf = operator.attrgetter('_os')\n",
    "import string\nstring.Formatter().get_field('0.x', [1], {})\n",
    "import typing\ntyping.get_type_hints(print)\n",
    "import numpy\nnumpy.ctypeslib.as_array\n",
    "import numpy as np\nnp.lib.format.open_memmap('x')\n",
    "from numpy import ctypeslib\n",
    "from gurobipy import *\n",
    "x = ().__class__.__bases__[0].__subclasses__()\n",
    "print(__builtins__)\n",
    "import dataclasses\ndataclasses.inspect.stack()\n",
    "import enum\nenum.bltns.open('x')\n",
    "import json\njson.decoder.re.compile('x')\n",
    "import os\n",
])
def test_back_doors_are_refused(code: str) -> None:
    assert not import_gate(code).accepted, code


def test_families_are_separate() -> None:
    assert not import_gate("import highspy\n", "gurobipy").accepted
    assert not import_gate("import gurobipy\n", "highspy").accepted
    with pytest.raises(ValueError, match="solver"):
        import_gate("x = 1\n", "cplex")


@pytest.mark.parametrize(("code", "solver"), [
    ("import gurobipy as gp\nfrom gurobipy import GRB, quicksum\nimport numpy as np\nimport math, json\n"
     "m = gp.Model()\nx = m.addVars(3, vtype=GRB.BINARY)\nm.setObjective(quicksum(x.values()), GRB.MAXIMIZE)\n"
     "m.optimize()\nprint(np.linalg.norm([1.0]), math.sqrt(2), json.dumps({'status': 'optimal'}))\n", "gurobipy"),
    ("import highspy\nimport numpy as np\nfrom collections import defaultdict\nfrom collections.abc import Sequence\n"
     "h = highspy.Highs()\nh.setOptionValue('output_flag', False)\ninf = highspy.kHighsInf\nh.run()\n"
     "if __name__ == '__main__':\n    print(h.getModelStatus() == highspy.HighsModelStatus.kOptimal)\n", "highspy"),
])
def test_ordinary_programs_pass(code: str, solver: str) -> None:
    g = import_gate(code, solver)
    assert g.accepted, g.detail
