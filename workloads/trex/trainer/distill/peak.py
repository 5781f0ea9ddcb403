"""Peak bytes a CPU computation allocates, from the profiler's allocation records (no timings)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def peak_cpu_bytes(fn: Callable[[], Any]) -> int:
    """Run ``fn`` under torch.profiler with memory profiling and return the highest net bytes it had
    allocated at any moment: every tensor allocation (+) and release (-) the allocator reported, summed
    in time order, so a [T, V] buffer kept even briefly shows up whole."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()

    def walk(nodes: list[Any]) -> Iterator[Any]:
        for node in nodes:
            yield node
            yield from walk(node.children)

    assert prof.profiler is not None
    events = [e for e in walk(prof.profiler.kineto_results.experimental_event_tree())
              if e.tag == _EventType.Allocation]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_time_ns):
        live += int(e.extra_fields.alloc_size)
        peak = max(peak, live)
    return peak
