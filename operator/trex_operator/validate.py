"""Offline manifest checks: `trex validate FILE...` and `trex get FILE...` (a `kubectl get`-style view).

Exit codes: 0 all valid; 1 at least one problem (one line each: file, object, field path, what is
wrong, what is allowed); 2 usage errors. User errors never print a traceback. The cluster's rules come
from the same TREX_* variables the operator reads (unset: its built-in defaults, e.g. MindCluster NPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from trex.config_base import StrictLoader, format_validation_error, load_section

from trex_operator import refgraph
from trex_operator.api import API_VERSION, KIND_INFO, KINDS, JobModel
from trex_operator.defaults import ClusterDefaults, GangError, effective_gang
from trex_operator.ranktable import LayoutError, ascend_layout


@dataclass(frozen=True)
class Problem:
    """One problem in one object of one file."""

    file: str
    obj: str
    path: str
    message: str

    def line(self) -> str:
        """The single output line for this problem."""
        return f"{self.file}: {self.obj}: {self.path}: {self.message}"


@dataclass(frozen=True)
class Checked:
    """One document: its parsed model when valid, else the problems."""

    file: str
    index: int
    raw: Any
    model: JobModel | None
    problems: list[Problem]


def _obj_name(doc: Any, index: int) -> str:
    if isinstance(doc, dict):
        kind = doc.get("kind") or "<no kind>"
        meta = doc.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        return f"{kind}/{name or f'<document {index}>'}"
    return f"<document {index}>"


def check_document(file: str, index: int, doc: Any, defaults: ClusterDefaults | None = None) -> Checked:
    """Validate one YAML document against the API models and the cluster's rules (``defaults``; None: the
    built-in ones)."""
    obj = _obj_name(doc, index)

    def fail(path: str, msg: str) -> Checked:
        return Checked(file, index, doc, None, [Problem(file, obj, path, msg)])

    if not isinstance(doc, dict):
        return fail("<root>", f"expected a mapping (a Kubernetes object), got {type(doc).__name__}")
    api = doc.get("apiVersion")
    if api != API_VERSION:
        return fail("apiVersion", f"{api!r} is not served by trex; allowed: {API_VERSION}")
    kind = doc.get("kind")
    if kind not in KINDS:
        return fail("kind", f"unknown kind {kind!r}; allowed: {', '.join(KINDS)}")
    try:
        model = load_section(KINDS[kind], doc)
    except ValidationError as err:
        problems = []
        for line in format_validation_error(err, model=KINDS[kind]):
            path, _, msg = line.partition(": ")
            problems.append(Problem(file, obj, path, msg))
        return Checked(file, index, doc, None, problems)
    problem = cluster_problem(doc, model, defaults or ClusterDefaults())
    if problem is not None:
        return fail(*problem)
    return Checked(file, index, doc, model, [])


def cluster_problem(doc: dict[str, Any], model: JobModel, defaults: ClusterDefaults) -> tuple[str, str] | None:
    """(field path, message) when the cluster's Ascend rules refuse a valid job: an npu job off Volcano where
    MindCluster's device plugin needs it, or an sp-block that describes no super-pod layout."""
    try:
        if model.spec.device_type == "npu" and defaults.npu_mindcluster:
            effective_gang(model.spec.scheduling, defaults, "npu")
        ascend_layout(doc, model.spec, defaults)
    except GangError as exc:
        path, _, msg = str(exc).partition(": ")
        return f"spec.{path}", msg
    except LayoutError as exc:
        path, _, msg = str(exc).partition(": ")
        return path, msg
    return None


MAX_OBJECT_BYTES = 1572864
"""The largest object the API server stores (etcd's default request limit, 1.5 MiB), as JSON."""


MAX_REQUEST_BYTES = 3 << 20
"""The largest request body the API server accepts (3 MiB): a larger file is refused before it is parsed."""


def cycle_problems(checked: list[Checked]) -> list[Problem]:
    """One problem per object that references itself or lies on a cycle of dataFrom / kernelsFrom / modelFrom /
    opd-teacher references among the objects given (per namespace, across files and documents)."""
    docs: dict[tuple[str, str, str], Checked] = {}
    for c in checked:
        node = refgraph.node_of(c.raw) if isinstance(c.raw, dict) else None
        if node is not None:
            docs.setdefault((_namespace(c.raw), *node), c)
    out = []
    for (ns, kind, name), c in docs.items():
        def refs_of(node: tuple[str, str], ns: str = ns) -> list[tuple[str, tuple[str, str]]]:
            other = docs.get((ns, *node))
            return refgraph.referenced_fields(other.raw, waits=True) if other is not None else []

        found = refgraph.find_cycle((kind, name), refs_of)
        if found is not None:
            field, _, msg = refgraph.cycle_message(*found).partition(": ")
            out.append(Problem(c.file, _obj_name(c.raw, c.index), field, msg))
    return out


def _namespace(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    return ns if isinstance(ns, str) and ns else "default"


def load_documents(text: str) -> list[Any]:
    """The non-empty YAML documents of ``text``; yaml.YAMLError also on a duplicate key."""
    return [d for d in yaml.load_all(text, Loader=StrictLoader) if d is not None]


def manifest_files(p: Path) -> list[Path]:
    """The manifests a path names: the file itself, or a directory's *.yaml / *.yml (recursively, except
    in folders named ``invalid``, the examples that must be rejected: name those explicitly)."""
    if not p.is_dir():
        return [p]
    found = [*p.rglob("*.yaml"), *p.rglob("*.yml")]
    return sorted(f for f in found if "invalid" not in f.relative_to(p).parts[:-1])


def iter_documents(paths: list[str], defaults: ClusterDefaults | None = None) -> Iterator[Checked]:
    """Every document of every file (directories: `manifest_files`)."""
    for raw_path in paths:
        files = manifest_files(Path(raw_path))
        for f in files:
            name = str(f)
            try:
                size = f.stat().st_size
                if size > MAX_REQUEST_BYTES:
                    yield Checked(name, 0, None, None, [Problem(name, "<file>", "<root>", (
                        f"the file is {size} bytes; the API server refuses requests over {MAX_REQUEST_BYTES} "
                        "(3 MiB): split it or move large data to a ConfigMap or a volume"))])
                    continue
                text = f.read_text(encoding="utf-8")
            except OSError as e:
                yield Checked(name, 0, None, None, [Problem(name, "<file>", "<file>", f"cannot read: {e.strerror}")])
                continue
            try:
                docs = load_documents(text)
            except yaml.YAMLError as e:
                where = getattr(e, "problem_mark", None)
                at = f"line {where.line + 1}, column {where.column + 1}" if where else "?"
                yield Checked(name, 0, None, None, [Problem(name, "<file>", at, f"not valid YAML: {getattr(e, 'problem', e)}")])
                continue
            if not docs:
                yield Checked(name, 0, None, None, [Problem(name, "<file>", "<root>", "no YAML documents")])
            for i, doc in enumerate(docs):
                size = len(json.dumps(doc, default=str))
                if size > MAX_OBJECT_BYTES:
                    yield Checked(name, i, doc, None, [Problem(name, _obj_name(doc, i), "<root>",
                                  f"the object is {size} bytes as JSON; the API server stores at most "
                                  f"{MAX_OBJECT_BYTES} (1.5 MiB): move large data to a ConfigMap or a volume")])
                    continue
                yield check_document(name, i, doc, defaults)


def jsonpath_get(obj: Any, path: str) -> Any:
    """Resolve a simple dotted JSONPath such as `.status.progress.step` (None when absent)."""
    cur = obj
    for part in path.strip(".").split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def get_rows(checked: list[Checked]) -> dict[str, list[list[str]]]:
    """Kind -> table rows (header first) as `kubectl get` would print them."""
    tables: dict[str, list[list[str]]] = {}
    for c in checked:
        if c.model is None:
            continue
        info = KIND_INFO[c.model.kind]
        cols = [col for col in info.printer_columns if "priority" not in col and col["name"] != "Age"]
        table = tables.setdefault(info.kind, [["NAME", *[col["name"].upper() for col in cols], "AGE"]])
        row = [c.model.metadata.name]
        for col in cols:
            v = jsonpath_get(c.raw, col["jsonPath"])
            row.append("<none>" if v is None else str(v))
        row.append("<new>")
        table.append(row)
    return tables


def format_tables(tables: dict[str, list[list[str]]]) -> str:
    """Render tables with aligned columns, one block per kind."""
    blocks = []
    for kind, rows in tables.items():
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"# {KIND_INFO[kind].plural}.{API_VERSION.split('/')[0]}"]
        lines += ["   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def main(argv: list[str]) -> int:
    """`trex validate FILE...` (or `trex get FILE...` when argv[0] == "get")."""
    is_get = bool(argv) and argv[0] == "get"
    prog = "trex get" if is_get else "trex validate"
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0] if __doc__ else prog)
    ap.add_argument("files", nargs="+", help="manifest files or directories")
    ap.add_argument("-q", "--quiet", action="store_true", help="print problems only")
    args = ap.parse_args(argv[1:] if is_get else argv)
    try:
        defaults = ClusterDefaults.from_env(os.environ)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    checked = list(iter_documents(args.files, defaults))
    from trex_operator.budgets import budget_problems
    from trex_operator.kernel_shapes import kernels_from_problems

    problems = [p for c in checked for p in c.problems] + cycle_problems(checked) + budget_problems(checked) \
        + kernels_from_problems(checked)
    for p in problems:
        print(p.line(), file=sys.stderr if is_get else sys.stdout)
    if is_get:
        print(format_tables(get_rows(checked)))
    elif not args.quiet:
        ok = sum(1 for c in checked if c.model is not None)
        print(f"{ok} valid, {len(checked) - ok} invalid ({len(problems)} problems)", file=sys.stderr)
    return 1 if problems else 0
