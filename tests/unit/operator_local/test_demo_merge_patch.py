"""JSON merge patches (RFC 7386): the diff the cluster path's replace (and the local API server's
server-side apply) generates, applied with RFC 7386's own algorithm, turns the stored object into the
manifest; the local API server's merge_patch agrees with that algorithm."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from trex_operator.local.apimachinery import merge_diff, merge_patch

scalars = st.one_of(st.integers(-5, 5), st.text("ab", max_size=2), st.booleans())
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text("abc", min_size=1, max_size=2), inner, max_size=3)),
    max_leaves=12)
objects = st.dictionaries(st.text("abc", min_size=1, max_size=2), json_values, max_size=4)


def rfc7386_apply(target: Any, patch: Any) -> Any:
    """MergePatch(Target, Patch) exactly as written in RFC 7386 section 2."""
    if isinstance(patch, dict):
        if not isinstance(target, dict):
            target = {}
        target = dict(target)
        for name, value in patch.items():
            if value is None:
                target.pop(name, None)
            else:
                target[name] = rfc7386_apply(target.get(name), value)
        return target
    return patch


@settings(max_examples=300, deadline=None)
@given(objects, objects)
def test_patch_turns_old_into_new(old: dict[str, Any], new: dict[str, Any]) -> None:
    patch = merge_diff(old, new)
    assert rfc7386_apply(old, patch) == new
    assert merge_patch(old, patch) == new


@settings(max_examples=300, deadline=None)
@given(objects, objects)
def test_merge_patch_is_rfc7386(target: dict[str, Any], patch: dict[str, Any]) -> None:
    assert merge_patch(target, patch) == rfc7386_apply(target, patch)


def test_patch_is_minimal_for_a_changed_leaf() -> None:
    old = {"spec": {"trainer": {"maxSteps": 60, "mode": "sft"}, "replicas": 1}}
    new = {"spec": {"trainer": {"maxSteps": 20, "mode": "sft"}}}
    assert merge_diff(old, new) == {"spec": {"trainer": {"maxSteps": 20}, "replicas": None}}
    assert merge_diff(new, new) == {}
