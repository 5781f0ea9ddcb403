"""A kernel timed against itself is no speedup: the profiler's interleaved pairs and acceptance rule on this host.

The rmsnorm_fwd cpu-c kernel (64 x 1024, fp32) is bound twice and timed against itself with ``interleaved``
(30 pairs, extended up to 120) for ``--runs`` seeds; each run prints the measured gain, its 95 % CI and
whether ``accept`` took it for a speedup. Goal: at most the CI's 5 % of runs accepted (host load can fake
a gain now and then; a profiler bias fakes it on most runs). A wall-clock comparison, so it lives here and
not in the tests.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def main(argv: list[str]) -> int:
    """Time the kernel against itself ``--runs`` times; exit 1 when more than ``--max-accepted`` runs accept."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--max-accepted", type=int, default=1)
    args = ap.parse_args(argv)

    from trex.kernels.backends.base import DeviceFacts, alloc_outputs
    from trex.kernels.backends.cpu_c import CpuCBackend
    from trex.kernels.profile import accept, interleaved
    from trex.kernels.suite import SUITE

    facts = DeviceFacts(name="cpu:bench", peak_flops=2e11, bandwidth=2e10,
                        caches={"L1": 32 << 10, "L2": 1 << 20, "L3": 32 << 20},
                        level_bandwidth={"L1": 2e11, "L2": 1e11, "L3": 5e10}, cores=2, source="nominal")
    with tempfile.TemporaryDirectory() as cache:
        backend = CpuCBackend(cache_dir=Path(cache), facts=facts, cores=2)
        spec = SUITE["rmsnorm_fwd"]
        shape = {"rows": 64, "cols": 1024}
        comp = backend.compile(spec, backend.default_params(spec, shape), "fp32")
        inputs = spec.make_inputs(shape, "fp32", 0)
        outs = alloc_outputs(spec, shape, "fp32")
        a, b = comp.bind(inputs, outs, shape), comp.bind(inputs, outs, shape)
        accepted = 0
        print("seed  pairs  gain    ci95              accepted")
        for seed in range(args.runs):
            timing = interleaved(a, b, samples=30, max_samples=120, seed=seed)
            ok, why = accept(timing)
            accepted += ok
            print(f"{seed:4d}  {len(timing.cand):5d}  {timing.gain:.4f}  [{timing.ci_low:.4f}, {timing.ci_high:.4f}]"
                  f"  {'YES: ' + why if ok else 'no'}")
    verdict = "OK" if accepted <= args.max_accepted else "FAILED"
    print(f"goal: at most {args.max_accepted} of {args.runs} self-timings accepted as a speedup: {accepted} -> {verdict}")
    return 0 if accepted <= args.max_accepted else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
