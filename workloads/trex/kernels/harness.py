"""Glue between a backend and the search: the real evaluator (compile -> gate -> interleaved profile ->
ceiling check), baseline timings (eager PyTorch, torch.compile) and one complete tuning of a kernel."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trex.kernels.backends.base import Backend, Compiled, DeviceFacts, alloc_outputs
from trex.kernels.profile import REWARM_CALLS, accept, ceiling_violation, interleaved
from trex.kernels.roofline import predict
from trex.kernels.search import TrialResult, params_key
from trex.kernels.suite.base import KernelSpec, Tensors
from trex.kernels.verify import verify


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with torch using ``n`` intra-op threads (0 = leave as is)."""
    import torch

    old = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class KernelEvaluator:
    """Evaluates cpu-c/Triton candidates for one (kernel, shape, dtype) on the backend's device."""

    def __init__(self, spec: KernelSpec, shape: Mapping[str, int], dtype: str, backend: Backend,
                 facts: DeviceFacts, samples: int = 30, seed: int = 0, gate_seeds: int = 5,
                 predictor: Callable[..., float] = predict) -> None:
        self.spec, self.shape, self.dtype, self.backend, self.facts = spec, dict(shape), dtype, backend, facts
        self.samples, self.seed, self.gate_seeds = samples, seed, gate_seeds
        self._predict = predictor
        dev = backend.device()
        self.inputs: Tensors = {k: v.to(dev) for k, v in spec.make_inputs(shape, dtype, seed).items()}
        self._compiled: dict[str, Compiled] = {}
        self._verified: dict[str, str] = {}
        self._refs: dict[str, Tensors] = {}

    def predict(self, params: Mapping[str, int]) -> float:
        """Cost-model time of a configuration."""
        return float(self._predict(self.spec, self.shape, self.dtype, params, self.facts))

    def compiled(self, params: Mapping[str, int]) -> Compiled:
        """Compile once per parameter set."""
        key = params_key(params)
        if key not in self._compiled:
            self._compiled[key] = self.backend.compile(self.spec, params, self.dtype)
        return self._compiled[key]

    def launcher(self, params: Mapping[str, int]) -> Callable[[], None]:
        """Zero-argument launcher on the fixed timing inputs."""
        outs = alloc_outputs(self.spec, self.shape, self.dtype, device=self.backend.device())
        return self.compiled(params).bind(self.inputs, outs, self.shape)

    def gate(self, params: Mapping[str, int]) -> str:
        """'' when the variant passes the correctness gate, else the reason (memoised)."""
        key = params_key(params)
        if key not in self._verified:
            comp = self.compiled(params)
            v = verify(self.spec, lambda inp, sh: comp(inp, sh), self.dtype, seeds=self.gate_seeds,
                       shapes=[*self.spec.tail_shapes, self.shape], device=self.backend.device(),
                       ref_cache=self._refs)
            self._verified[key] = "" if v.ok else v.reason
        return self._verified[key]

    def measure_root(self, params: Mapping[str, int]) -> TrialResult:
        """Verify and time the starting configuration."""
        try:
            comp = self.compiled(params)
        except Exception as e:
            return TrialResult("failed", f"{type(e).__name__}: {e}")
        why = self.gate(params)
        if why:
            return TrialResult("incorrect", why)
        f = self.launcher(params)
        t = interleaved(f, f, samples=self.samples, sync=self.backend.synchronize, seed=self.seed)
        return TrialResult("root", "", t.median_cand, t.median_cand, 1.0, (1.0, 1.0), comp.source_hash)

    def evaluate(self, params: Mapping[str, int], parent: Mapping[str, int]) -> TrialResult:
        """Compile, gate, profile against the parent (interleaved), check the ceiling, apply the rule."""
        try:
            self.backend.validate(self.spec, params, self.shape)
            comp = self.compiled(params)
        except Exception as e:
            return TrialResult("failed", f"{type(e).__name__}: {str(e)[:500]}")
        why = self.gate(params)
        if why:
            return TrialResult("incorrect", why, source_hash=comp.source_hash)
        t = interleaved(self.launcher(params), self.launcher(parent), samples=self.samples,
                        sync=self.backend.synchronize, seed=self.seed, max_samples=4 * self.samples)
        ci = (t.ci_low, t.ci_high)
        over = ceiling_violation(self.spec, self.shape, self.dtype, t.median_cand, self.facts)
        if over:
            return TrialResult("ceiling", over, t.median_cand, t.median_base, t.gain, ci, comp.source_hash)
        ok, why = accept(t)
        return TrialResult("accepted" if ok else "rejected", why, t.median_cand, t.median_base, t.gain, ci,
                           comp.source_hash)


@dataclass(frozen=True)
class BaselineTimes:
    """Per-call medians (s) of the tuned kernel, eager PyTorch and torch.compile, same inputs and threads."""

    tuned_s: float
    eager_s: float
    compiled_s: float | None
    compile_time_s: float | None
    eager_speedup: float
    compiled_speedup: float | None
    eager_ci: tuple[float, float]
    compiled_ci: tuple[float, float] | None


def baselines(ev: KernelEvaluator, params: Mapping[str, int], samples: int = 30, threads: int = 0,
              with_compile: bool = True) -> BaselineTimes:
    """Time the tuned variant against eager PyTorch and torch.compile (compile time measured apart).

    Each timed sample follows an untimed call of the same side (``interleaved(..., rewarm=REWARM_CALLS)``): the
    tuned kernel is not timed on inputs evicted by eager's temporaries, nor eager on a cache the kernel
    left, and ``tuned_s`` is measured the way the machine facts' bandwidth references are.
    """
    import torch

    spec, shape, inputs = ev.spec, ev.shape, ev.inputs
    tuned = ev.launcher(params)
    sync = ev.backend.synchronize
    with torch_threads(threads):
        def run_eager() -> None:
            spec.eager(inputs, shape, spec.scalars)

        t_e = interleaved(tuned, run_eager, samples=samples, sync=sync, rewarm=REWARM_CALLS)
        comp_s = comp_t = None
        cci = None
        cg = None
        if with_compile:
            try:
                torch.compiler.reset()  # one code object serves every kernel: start without stale guards
                fn = torch.compile(lambda t: spec.eager(t, shape, spec.scalars))
                t0 = time.perf_counter()
                fn(inputs)
                sync()
                comp_t = time.perf_counter() - t0
                def run_compiled() -> None:
                    fn(inputs)

                t_c = interleaved(tuned, run_compiled, samples=samples, sync=sync, rewarm=REWARM_CALLS)
                comp_s, cg, cci = t_c.median_base, t_c.gain, (t_c.ci_low, t_c.ci_high)
            except Exception:  # torch.compile unavailable (no C++ toolchain for inductor): report eager only
                comp_s = comp_t = None
    return BaselineTimes(t_e.median_cand, t_e.median_base, comp_s, comp_t, t_e.gain, cg, (t_e.ci_low, t_e.ci_high), cci)


def output_dir(path: str | Path) -> Path:
    """Create and return the output directory."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    return p


def jsonable(x: Any) -> Any:
    """Recursively convert tuples to lists (for JSON)."""
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    return x
