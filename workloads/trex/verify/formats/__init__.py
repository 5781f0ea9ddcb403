"""The published OR benchmark formats, one parser module per format (records -> :class:`~trex.verify.items.Item`),
by name: `trex eval` loads benchmarks in them and GRPO reads its prompts in them."""

from __future__ import annotations

from types import ModuleType

from trex.verify.formats import bench4opt, industryor, mamo, nl4opt, optibench, optmath, ordata

FORMATS: dict[str, ModuleType] = {
    "nl4opt": nl4opt, "mamo": mamo, "optibench": optibench, "industryor": industryor,
    "optmath": optmath, "ordata": ordata, "bench4opt": bench4opt,
}
