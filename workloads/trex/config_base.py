"""Shared base for every workload config model: strict types, unknown fields rejected, camelCase keys.

The same YAML section is read by `trex <command> --config` locally and by the operator from a job's
spec, so both go through :func:`load_section` (aliases only, exactly as the CRD schema spells them).
"""

from __future__ import annotations

import copy
import difflib
import os
import re
import types
from collections import abc
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class TrexModel(BaseModel):
    """Base model: strict, extra fields forbidden, camelCase aliases, field docstrings as descriptions."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        validate_default=False,
    )


M = TypeVar("M", bound=BaseModel)


def load_section(model: type[M], data: Any) -> M:
    """Validate a mapping with the CRD spelling (camelCase aliases only) into ``model``."""
    return model.model_validate(data, by_alias=True, by_name=False)


class ConfigError(ValueError):
    """A config file or override that cannot be used: one line naming the file, flag or field."""


MAX_YAML_BYTES = 3 << 20
"""The largest YAML file read (the API server's request limit): refused before it is parsed."""
MAX_ALIAS_NODES = 100_000
"""Nodes that aliases may add to a YAML document when expanded (an anchor bomb adds billions)."""


class StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate mapping keys (plain YAML keeps the last one silently) and documents
    whose aliases expand to more than :data:`MAX_ALIAS_NODES` extra nodes (counted before any is built)."""

    def construct_document(self, node: yaml.Node) -> Any:
        """Check the alias-expansion budget, then build the document."""
        extra = _expanded_size(node, {}) - _distinct_nodes(node)
        if extra > MAX_ALIAS_NODES:
            raise yaml.constructor.ConstructorError(
                None, None, f"aliases expand the document by {extra} nodes (at most {MAX_ALIAS_NODES})",
                node.start_mark)
        return super().construct_document(node)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes of the document with every alias expanded, each distinct node's size computed once (iterative);
    a node that contains itself (a recursive alias) is refused."""
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        cur, done = stack.pop()
        kids = _children(cur)
        if done:
            active.discard(id(cur))
            memo[id(cur)] = 1 + sum(memo[id(k)] for k in kids)
            continue
        if id(cur) in memo:
            continue
        if id(cur) in active:
            raise yaml.constructor.ConstructorError(None, None, "a recursive alias (a node inside itself)",
                                                    cur.start_mark)
        active.add(id(cur))
        stack.append((cur, True))
        stack.extend((k, False) for k in kids if id(k) not in memo)
    return memo[id(node)]


def _distinct_nodes(node: yaml.Node) -> int:
    seen: set[int] = set()
    stack = [node]
    while stack:
        cur = stack.pop()
        if id(cur) not in seen:
            seen.add(id(cur))
            stack.extend(_children(cur))
    return len(seen)


def _no_duplicates(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _value in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def read_yaml(path: str | Path) -> Any:
    """One YAML document from ``path`` (duplicate keys refused); ConfigError naming the file otherwise."""
    try:
        with open(path, encoding="utf-8") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_YAML_BYTES:
                raise ConfigError(f"--config: {path} is {size} bytes; at most {MAX_YAML_BYTES} (3 MiB, the API "
                                  "server's request limit)")
            return yaml.load(fh, Loader=StrictLoader)
    except FileNotFoundError:
        raise ConfigError(f"--config: {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"--config: {path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"--config: {path} is not valid YAML ({' '.join(str(e).split())})") from None


def config_section(data: Any, kind: str, section: str, path: str | Path = "--config") -> Any:
    """The workload config in a file: a ``kind`` manifest's ``spec.<section>``, a top-level ``section:``
    mapping, or the whole file (empty: ``{}``)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    if "apiVersion" in data or "kind" in data:
        if data.get("kind") != kind:
            raise ConfigError(f"{path}: a {data.get('kind')!r} manifest; this command reads a {kind} "
                              f"(its spec.{section}) or a bare {section} config")
        spec = data.get("spec")
        if not isinstance(spec, dict) or section not in spec:
            raise ConfigError(f"{path}: spec.{section}: required field is missing")
        return spec[section]
    # a mapping under `section:` is the section (KernelTuneConfig's own `kernels` field is a list)
    return data[section] if isinstance(data.get(section), dict) else data


_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def parse_value(text: str) -> Any:
    """A --set value as a YAML scalar (or flow collection); numbers in any float spelling, e.g. 3e-4, are
    numbers (YAML 1.1 alone would keep "3e-4" a string)."""
    if _NUMBER.match(text.strip()) and not re.fullmatch(r"[-+]?\d+", text.strip()):
        return float(text)
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def _unwrap(tp: Any) -> list[Any]:
    """The alternatives of a type: Annotated stripped, Optional/Union split."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, types.UnionType):
        return [u for a in get_args(tp) for u in _unwrap(a)]
    return [tp]


def _models(tp: Any) -> list[type[BaseModel]]:
    return [t for t in _unwrap(tp) if isinstance(t, type) and issubclass(t, BaseModel)]


def _fields(models: list[type[BaseModel]]) -> dict[str, Any]:
    """Accepted key (the camelCase alias) -> annotation, over every model of a union."""
    out: dict[str, Any] = {}
    for m in models:
        for name, f in m.model_fields.items():
            out[f.alias or name] = f.annotation
    return out


def _item(tp: Any, key: str | int) -> Any:
    """The type one step inside a container type (list/tuple element, dict value); None when not one."""
    for t in _unwrap(tp):
        origin, args = get_origin(t), get_args(t)
        if origin in (list, tuple, set, frozenset, abc.Sequence) and args and isinstance(key, int):
            return args[0]
        if origin in (dict, abc.Mapping) and len(args) == 2 and isinstance(key, str):
            return args[1]
    return None


def _step(tp: Any, key: str | int) -> Any:
    """The type of ``key`` inside ``tp``: a model field, a union member named by a pydantic tag, or a
    container's element; None when the path leaves what the types describe."""
    models = _models(tp)
    if isinstance(key, str) and models:
        fields = _fields(models)
        if key in fields:
            return fields[key]
        for m in models:  # pydantic names the member of a union it tried (class name or tag)
            if key == m.__name__ or key in _tags(m):
                return m
    return _item(tp, key)


def _tags(model: type[BaseModel]) -> set[str]:
    return {str(a) for f in model.model_fields.values() for t in _unwrap(f.annotation)
            if get_origin(t) is Literal for a in get_args(t)}


def closest(word: str, choices: list[str]) -> str | None:
    """The closest valid name to a misspelt one (difflib), or None when nothing is near."""
    found = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not found:
        found = [c for c in choices if c.lower() == word.lower().replace("_", "")]
    return found[0] if found else None


def unknown_field_message(model: type[BaseModel] | None, loc: tuple[str | int, ...]) -> str:
    """What to say about an unknown field at ``loc`` below ``model``: the closest valid name when there is one."""
    base = "unknown field (check the spelling; fields are camelCase)"
    if model is None or not loc or not isinstance(loc[-1], str):
        return base
    tp: Any = model
    for key in loc[:-1]:
        tp = _step(tp, key)
        if tp is None:
            return base
    names = sorted(_fields(_models(tp)))
    near = closest(loc[-1], names)
    return f"unknown field; did you mean {near!r}?" if near else f"unknown field; allowed: {', '.join(names)}"


def apply_override(model: type[BaseModel], data: dict[str, Any], assignment: str) -> None:
    """Apply one ``--set a.b=value`` to ``data`` in place; camelCase path checked against ``model`` (list items by
    index: ``benchmarks.0.limit=5``); ConfigError naming the bad path otherwise."""
    path, sep, raw = assignment.partition("=")
    if not sep or not path.strip():
        raise ConfigError(f"--set {assignment!r}: expected PATH=VALUE, e.g. optim.lr=3e-4")
    keys = path.strip().split(".")
    tp: Any = model
    node: Any = data
    for i, key in enumerate(keys):
        at = ".".join(keys[:i]) or "the top level"
        last = i == len(keys) - 1
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise ConfigError(f"--set {path}: {at} is a list of {len(node)} items; {key!r} is not an index in it")
            idx: str | int = int(key)
        elif isinstance(node, dict):
            idx = key
        else:
            raise ConfigError(f"--set {path}: {at} is a {type(node).__name__}, not a mapping")
        nxt = _step(tp, idx)
        if nxt is None:
            names = sorted(_fields(_models(tp)))
            near = closest(key, names) if names else None
            hint = f"; did you mean {near!r}?" if near else (f"; allowed: {', '.join(names)}" if names else "")
            raise ConfigError(f"--set {path}: {key!r} is not a field of {at}{hint}")
        if last:
            node[idx] = parse_value(raw)
            return
        if isinstance(node, dict) and not isinstance(node.get(idx), (dict, list)):
            if node.get(idx) is not None:
                raise ConfigError(f"--set {path}: {'.'.join(keys[:i + 1])} is a {type(node[idx]).__name__}, "
                                  "not a mapping")
            node[idx] = {}
        node, tp = node[idx], nxt


def config_data(path: str | Path | None, kind: str, section: str) -> dict[str, Any]:
    """The raw ``section`` mapping a --config file holds (see config_section); {} without a file."""
    data = config_section(read_yaml(path), kind, section, path) if path else {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {section} must be a mapping, got {type(data).__name__}")
    return copy.deepcopy(data)


def resolve_config(model: type[M], data: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> M:
    """``data`` with the ``--set`` overrides applied, validated into ``model``; ConfigError with one line."""
    data = copy.deepcopy(data)
    for assignment in overrides:
        apply_override(model, data, assignment)
    try:
        return load_section(model, data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, model=model)[0]) from None


def load_config(model: type[M], path: str | Path | None, *, kind: str, section: str,
                overrides: list[str] | tuple[str, ...] = (), base: dict[str, Any] | None = None) -> M:
    """A workload config from a file (bare, under ``section:``, or a ``kind`` manifest's ``spec.<section>``),
    then ``base`` keys and ``--set`` overrides, validated as a whole; ConfigError with one line otherwise."""
    return resolve_config(model, {**config_data(path, kind, section), **(base or {})}, overrides)


def dump_config(cfg: BaseModel) -> str:
    """The resolved config as YAML with the camelCase keys a file or manifest uses (--print-config); unset
    optional fields are left out, so the output reads back as the same config."""
    return yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False)


def check_dns1123_label(value: str, what: str = "name") -> str:
    """Raise ValueError unless ``value`` is a valid DNS-1123 label (lowercase, digits, '-', <= 63)."""
    if len(value) > 63 or not DNS1123_LABEL.match(value):
        lead = f"{what} " if what else ""
        raise ValueError(
            f"{lead}{value!r} is not a valid DNS-1123 label "
            "(lowercase letters, digits and '-', starting and ending alphanumeric, at most 63 characters)"
        )
    return value


def format_validation_error(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> list[str]:
    """One line per problem: dotted field path, what is wrong, and what is allowed (with ``model``, the one
    validated, an unknown field names the closest valid one)."""
    lines: list[str] = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        path = ".".join(p for p in (prefix, loc) if p)
        msg = e["msg"]
        if e["type"] == "value_error":
            # Validators phrase problems as "<relative.field>: what is wrong; allowed ...", several
            # joined by newlines, each starting with its field path.
            text = msg.removeprefix("Value error, ")
            parts = _split_problems(text)
            for sub, detail in parts:
                full = ".".join(p for p in (prefix, loc, sub) if p)
                lines.append(f"{full or '<root>'}: {detail}")
            continue
        if e["type"] == "extra_forbidden":
            msg = unknown_field_message(model, tuple(e["loc"]))
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "literal_error":
            msg = f"invalid value {e.get('input')!r}; {e['msg'].replace('Input should be', 'allowed:')}"
        elif e["type"].endswith("_type"):
            msg = f"wrong type ({type(e.get('input')).__name__}): {e['msg'].replace('Input should be', 'expected')}"
        lines.append(f"{path or '<root>'}: {msg.replace('Input should be', 'must be')}")
    return lines


_FIELD_LEAD = re.compile(r"^([A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*): (.*)$", re.S)


def _split_problems(text: str) -> list[tuple[str, str]]:
    """Split "a.b: msg\\nc: msg2" into [("a.b", "msg"), ("c", "msg2")]; text without a lead path -> [("", text)]."""
    chunks = text.split("\n")
    if len(chunks) > 1 and all(_FIELD_LEAD.match(c) for c in chunks):
        out = []
        for c in chunks:
            m = _FIELD_LEAD.match(c)
            assert m is not None
            out.append((m.group(1), m.group(2)))
        return out
    m = _FIELD_LEAD.match(text)
    if m and " " not in m.group(1):
        return [(m.group(1), m.group(2))]
    return [("", text)]
