"""Generate apiextensions.k8s.io/v1 CRDs from the API models (`trex crds`).

The pydantic JSON schema is turned into a Kubernetes structural schema: $refs inlined,
`X | None` -> `nullable: true`, `int | str` -> `x-kubernetes-int-or-string`, free-form maps ->
`x-kubernetes-preserve-unknown-fields`, JSON-Schema-2020 exclusive bounds -> OpenAPI v3.0 booleans,
and `additionalProperties: false` dropped (Kubernetes forbids it next to `properties`; unknown
fields are rejected by the API server's strict field validation instead).
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import yaml

from trex_operator.api import API_VERSION, GROUP, KIND_INFO, KINDS, VERSION, JobStatus

_DROP = {"title", "default", "examples", "$defs", "additionalProperties_false"}


class SchemaError(ValueError):
    """The model uses a construct with no structural-schema equivalent."""


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            name = node["$ref"].split("/")[-1]
            target = copy.deepcopy(defs[name])
            extra = {k: v for k, v in node.items() if k != "$ref"}
            target.update(extra)
            return _resolve(target, defs)
        return {k: _resolve(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    return node


def structural(node: dict[str, Any], path: str = "") -> dict[str, Any]:
    """Convert one resolved JSON-schema node into a structural OpenAPI v3 node."""
    node = dict(node)
    out: dict[str, Any] = {}
    if "anyOf" in node:
        variants = node.pop("anyOf")
        non_null = [v for v in variants if v.get("type") != "null"]
        nullable = len(non_null) != len(variants)
        types = sorted(v.get("type", "?") for v in non_null)
        if len(non_null) == 1:
            merged = {**non_null[0], **{k: v for k, v in node.items() if k not in ("anyOf",)}}
            conv = structural(merged, path)
        elif types == ["integer", "string"]:
            conv = {k: v for k, v in node.items() if k == "description"}
            conv["x-kubernetes-int-or-string"] = True
        else:
            raise SchemaError(f"{path or '<root>'}: union of {types} has no structural-schema form")
        if nullable:
            conv["nullable"] = True
        return conv
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "additionalProperties":
            if value is False:
                continue
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
                continue
            out[key] = structural(value, f"{path}.*")
        elif key == "properties":
            out[key] = {k: structural(v, f"{path}.{k}") for k, v in value.items()}
        elif key == "items":
            out[key] = structural(value, f"{path}[]")
        elif key == "exclusiveMinimum":
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum":
            out["maximum"] = value
            out["exclusiveMaximum"] = True
        else:
            out[key] = value
    if "type" not in out and not out.get("x-kubernetes-int-or-string"):
        out["type"] = "object"
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def model_schema(model: type[Any], cel: bool = False) -> dict[str, Any]:
    """Structural schema of a pydantic model (aliases, validation mode); with ``cel``, every node of a model
    that has CEL rules (trex_operator.cel) carries them as x-kubernetes-validations."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    if cel:
        _add_cel(model, raw, defs)
    return structural(_resolve(raw, defs))


def _add_cel(model: type[Any], root: dict[str, Any], defs: dict[str, Any]) -> None:
    """Attach each reachable model's CEL rules to its schema node (the root or its $defs entry)."""
    from trex_operator.cel import reachable, rules_for

    for m in reachable(model):
        found = rules_for(m)
        if not found:
            continue
        names = (m.__name__, f"{m.__module__}.{m.__qualname__}".replace(".", "__"))
        node = root if m is model else next((defs[n] for n in names if n in defs), None)
        if node is None:
            raise SchemaError(f"{m.__name__}: has CEL rules but no node in the {model.__name__} schema")
        node["x-kubernetes-validations"] = found


def _status_schema() -> dict[str, Any]:
    return model_schema(JobStatus)


def build_crd(kind: str) -> dict[str, Any]:
    """The CustomResourceDefinition of ``kind``."""
    info = KIND_INFO[kind]
    model = KINDS[kind]
    spec_model = model.model_fields["spec"].annotation
    assert isinstance(spec_model, type)
    spec_schema = model_schema(spec_model, cel=True)
    columns = []
    for col in info.printer_columns:
        c: dict[str, Any] = {"name": col["name"], "type": col["type"], "jsonPath": col["jsonPath"]}
        if "priority" in col:
            c["priority"] = int(col["priority"])
        columns.append(c)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{info.plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "trex"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind, "listKind": f"{kind}List", "plural": info.plural, "singular": info.singular,
                "shortNames": info.short_names, "categories": ["trex"],
            },
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": (model.__doc__ or kind).strip().splitlines()[0],
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string", "description": f"{API_VERSION}"},
                        "kind": {"type": "string", "description": kind},
                        "metadata": {"type": "object"},
                        "spec": spec_schema,
                        "status": _status_schema(),
                    },
                }},
            }],
        },
    }


def render_all() -> dict[str, str]:
    """File name -> YAML text for every CRD."""
    out: dict[str, str] = {}
    for kind, info in KIND_INFO.items():
        text = yaml.safe_dump(build_crd(kind), sort_keys=False, width=100, allow_unicode=True)
        out[f"{GROUP}_{info.plural}.yaml"] = "# Generated by `trex crds` from trex_operator.api; do not edit.\n" + text
    return out


def write_all(dirs: list[Path]) -> list[Path]:
    """Write every CRD into each directory (atomically); return the paths written."""
    written: list[Path] = []
    files = render_all()
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        for stale in d.glob(f"{GROUP}_*.yaml"):
            if stale.name not in files:
                stale.unlink()
        for name, text in files.items():
            p = d / name
            tmp = p.with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(p)
            written.append(p)
    return written


def main(argv: list[str]) -> int:
    """`trex crds [--out DIR] [--chart DIR] [--check]`."""
    ap = argparse.ArgumentParser(prog="trex crds", description="Generate the trex CRDs from the API models.")
    ap.add_argument("--out", default="crds", help="output directory (default: crds)")
    ap.add_argument("--chart", default=None, help="also write into this chart crds/ directory")
    ap.add_argument("--check", action="store_true", help="exit 1 if the files on disk differ from a fresh generation")
    args = ap.parse_args(argv)
    dirs = [Path(args.out)] + ([Path(args.chart)] if args.chart else [])
    if args.check:
        files = render_all()
        stale = [str(d / n) for d in dirs for n, t in files.items()
                 if not (d / n).exists() or (d / n).read_text(encoding="utf-8") != t]
        for s in stale:
            print(f"{s}: differs from the models; run `make crds`")
        return 1 if stale else 0
    for p in write_all(dirs):
        print(f"wrote {p}")
    return 0
