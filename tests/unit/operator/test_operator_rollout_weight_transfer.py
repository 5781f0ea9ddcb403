"""spec.trainer.rollout.weightPush transfer under the operator: the servers it renders start vLLM's nccl
weight-transfer engine; a job whose devices have no NCCL is refused in one line naming the field."""

from __future__ import annotations

from typing import Any

from test_operator_rollout_server import _refused, body, run


def _server_args(doc: dict[str, Any]) -> list[list[str]]:
    deps = sorted((m for m in run(doc).ensure if m["kind"] == "Deployment"), key=lambda d: d["metadata"]["name"])
    return [d["spec"]["template"]["spec"]["containers"][0]["args"] for d in deps]


def test_transfer_servers_start_the_nccl_weight_transfer_engine() -> None:
    doc = body()
    doc["spec"]["trainer"]["rollout"] = {"weightPush": "transfer"}
    assert _refused(doc) == []
    for args in _server_args(doc):
        i = args.index("--weight-transfer-config")
        assert args[i + 1] == '{"backend": "nccl"}'
        assert args[-2:] == ["--max-model-len", "512"]  # the spec's own args still come last
    assert all("--weight-transfer-config" not in a for a in _server_args(body()))


def test_transfer_on_npu_is_refused_naming_the_field() -> None:
    doc = body()
    doc["spec"]["deviceType"] = "npu"
    doc["spec"]["trainer"]["rollout"] = {"weightPush": "transfer"}
    lines = [x for x in _refused(doc) if "weightPush" in x]
    assert len(lines) == 1 and lines[0].startswith("spec.trainer.rollout.weightPush: 'transfer' sends over NCCL")
