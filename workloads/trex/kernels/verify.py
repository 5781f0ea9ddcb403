"""Correctness gate: a candidate must match the float64 reference on several seeds and shapes (tails
included), write every output element (outputs start as NaN), leave its inputs untouched, and never
return a tensor that shares memory with an input."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trex.kernels.suite.base import KernelSpec, Tensors, shape_key, torch_dtype

if TYPE_CHECKING:
    import torch

Runner = Callable[[Tensors, Mapping[str, int]], Tensors]


@dataclass(frozen=True)
class Verdict:
    """Outcome of the gate: ok, or the first failure with the shape and seed that exposed it."""

    ok: bool
    reason: str = ""
    checks: int = 0


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()


def gate_shapes(spec: KernelSpec, extra: Sequence[Mapping[str, int]] = ()) -> list[dict[str, int]]:
    """Tail shapes first (cheap, most revealing), then the tuning shapes."""
    seen: dict[str, dict[str, int]] = {}
    for s in (*spec.tail_shapes, *extra):
        seen.setdefault(shape_key(s), dict(s))
    return list(seen.values())


def check_outputs(spec: KernelSpec, dtype: str, inputs: Tensors, outs: Tensors, ref: Tensors,
                  shape: Mapping[str, int]) -> str | None:
    """Compare one run's outputs with the float64 reference; None when they agree."""
    import torch

    for b in spec.outputs:
        if b.name not in outs:
            return f"output {b.name} missing"
        o = outs[b.name]
        if tuple(o.shape) != b.shape(shape) or o.dtype != torch_dtype(b.role, dtype):
            return f"output {b.name}: shape/dtype {tuple(o.shape)} {o.dtype}, expected {b.shape(shape)} {torch_dtype(b.role, dtype)}"
        for name, t in inputs.items():
            if _overlaps(o, t):
                return f"output {b.name} aliases input {name}"
    cpu = {k: v.detach().cpu() for k, v in outs.items()}
    if spec.compare is not None:
        return spec.compare(inputs, cpu, ref, shape)
    rtol, atol = spec.tol[dtype]
    for b in spec.outputs:
        o, r = cpu[b.name], ref[b.name]
        if b.role == "i64":
            if not torch.equal(o, r.to(o.dtype)):
                return f"output {b.name}: integer mismatch"
            continue
        od = o.double()
        bad = ~torch.isfinite(od) & torch.isfinite(r)
        if bool(bad.any()):
            return f"output {b.name}: {int(bad.sum())} non-finite elements (unwritten or overflow)"
        err = (od - r).abs() - (atol + rtol * r.abs())
        if bool((err > 0).any()):
            i = int(err.flatten().argmax())
            return (f"output {b.name}: |diff| {float((od - r).abs().flatten()[i]):.3g} beyond tol "
                    f"(rtol={rtol}, atol={atol}) at flat index {i}")
    return None


def verify(spec: KernelSpec, run: Runner, dtype: str, seeds: int = 5,
           shapes: Sequence[Mapping[str, int]] | None = None, device: str = "cpu",
           full_shapes_seeds: int = 1, ref_cache: dict[str, Tensors] | None = None) -> Verdict:
    """Run the gate: ``seeds`` seeds on every tail shape and ``full_shapes_seeds`` on tuning shapes."""
    import torch

    shapes = list(shapes) if shapes is not None else gate_shapes(spec, spec.default_shapes)
    tails = {shape_key(s) for s in spec.tail_shapes}
    n = 0
    for shape in shapes:
        reps = seeds if shape_key(shape) in tails else full_shapes_seeds
        for seed in range(reps):
            host = spec.make_inputs(shape, dtype, 1000 + seed)
            inputs = {k: v.to(device) for k, v in host.items()}
            snapshot = {k: v.clone() for k, v in inputs.items()}
            try:
                outs = run(inputs, shape)
            except Exception as e:  # a crashing candidate is a rejected candidate
                return Verdict(False, f"{shape_key(shape)} seed {seed}: raised {type(e).__name__}: {e}", n)
            for k, v in inputs.items():
                if not torch.equal(v, snapshot[k]) and not (v.is_floating_point() and torch.allclose(
                        v, snapshot[k], equal_nan=True, rtol=0, atol=0)):
                    return Verdict(False, f"{shape_key(shape)} seed {seed}: input {k} was modified", n)
            key = f"{dtype}|{shape_key(shape)}|{seed}"
            ref = ref_cache.get(key) if ref_cache is not None else None
            if ref is None:
                ref = spec.reference({k: (v.double() if v.is_floating_point() else v) for k, v in host.items()},
                                     shape, spec.scalars)
                if ref_cache is not None:
                    ref_cache[key] = ref
            err = check_outputs(spec, dtype, inputs, outs, ref, shape)
            n += 1
            if err:
                return Verdict(False, f"{shape_key(shape)} seed {seed}: {err}", n)
    return Verdict(True, "", n)
