"""Offline manifest checks: `trex validate FILE...` and `trex get FILE...` (a `kubectl get`-style view).

Exit codes: 0 all valid; 1 at least one problem (one line each: file, object, field path, what is
wrong, what is allowed); 2 usage errors. User errors never print a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from trex.config_base import format_validation_error, load_section

from trex_operator.api import API_VERSION, KIND_INFO, KINDS, JobModel


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


def check_document(file: str, index: int, doc: Any) -> Checked:
    """Validate one YAML document against the API models."""
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
        for line in format_validation_error(err):
            path, _, msg = line.partition(": ")
            problems.append(Problem(file, obj, path, msg))
        return Checked(file, index, doc, None, problems)
    return Checked(file, index, doc, model, [])


def iter_documents(paths: list[str]) -> Iterator[Checked]:
    """Every document of every file (directories are searched for *.yaml / *.yml)."""
    for raw_path in paths:
        p = Path(raw_path)
        files = sorted([*p.rglob("*.yaml"), *p.rglob("*.yml")]) if p.is_dir() else [p]
        for f in files:
            name = str(f)
            try:
                text = f.read_text(encoding="utf-8")
            except OSError as e:
                yield Checked(name, 0, None, None, [Problem(name, "<file>", "<file>", f"cannot read: {e.strerror}")])
                continue
            try:
                docs = [d for d in yaml.safe_load_all(text) if d is not None]
            except yaml.YAMLError as e:
                where = getattr(e, "problem_mark", None)
                at = f"line {where.line + 1}, column {where.column + 1}" if where else "?"
                yield Checked(name, 0, None, None, [Problem(name, "<file>", at, f"not valid YAML: {getattr(e, 'problem', e)}")])
                continue
            if not docs:
                yield Checked(name, 0, None, None, [Problem(name, "<file>", "<root>", "no YAML documents")])
            for i, doc in enumerate(docs):
                yield check_document(name, i, doc)


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
    checked = list(iter_documents(args.files))
    from trex_operator.budgets import budget_problems

    problems = [p for c in checked for p in c.problems] + budget_problems(checked)
    for p in problems:
        print(p.line(), file=sys.stderr if is_get else sys.stdout)
    if is_get:
        print(format_tables(get_rows(checked)))
    elif not args.quiet:
        ok = sum(1 for c in checked if c.model is not None)
        print(f"{ok} valid, {len(checked) - ok} invalid ({len(problems)} problems)", file=sys.stderr)
    return 1 if problems else 0
