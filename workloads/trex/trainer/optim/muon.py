"""Muon: momentum, then orthogonalise the update with a hybrid Newton-Schulz schedule, rescale to a fixed RMS.

Stacked expert weights ``[E, n, m]`` are orthogonalised per expert in one batched call, and 2-D
parameters of the same shape are stacked into one batch too, so a step issues few batched GEMMs (on
CPU in cache-sized slices of the batch). Momentum and weight decay run as multi-tensor (foreach) ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, overload

import torch
from torch import Tensor

from trex.trainer.model.layers import local_tensor

Stage = tuple[int, tuple[float, float, float]]
"""(iterations, (a, b, c)) of X <- aX + b(XX^T)X + c(XX^T)^2 X."""

DEFAULT_STAGES: tuple[Stage, ...] = ((8, (3.4445, -4.7750, 2.0315)), (2, (2.0, -1.5, 0.5)))
"""8 quintic steps that push every singular value up fast, then 2 steps of the polynomial with a double
root at 1 (f(1) = 1, f'(1) = 0) that pulls them onto 1 (quadratic convergence)."""


CPU_CHUNK_BYTES = 1 << 19
"""On CPU, newton_schulz runs a batch in slices of about this many bytes of X (per thread), so each
slice's X, Gram and polynomial stay in the L2 cache through all iterations: ~20 % faster than one
bmm over the whole batch for the small-cpu experts; every matrix is independent, so slicing does not
change the result."""


def cpu_chunk(batch: int, n: int, m: int, element_size: int, threads: int,
              budget: int = CPU_CHUNK_BYTES) -> int:
    """Matrices per slice on CPU: as many n x m matrices as fit in ``budget`` bytes per thread, at least one per thread."""
    return max(1, min(batch, threads * max(1, budget // max(1, n * m * element_size))))


def newton_schulz(g: Tensor, stages: Sequence[Stage] = DEFAULT_STAGES, *, eps: float = 1e-7,
                  dtype: torch.dtype = torch.float32, final_dtype: torch.dtype | None = None,
                  chunk: int | None = None) -> Tensor:
    """Approximate U V^T of ``g`` ([..., n, m]; batched over leading dims), returned in g's dtype.

    Each matrix is normalised by its Frobenius norm first (so every singular value is <= 1), and tall
    matrices are transposed so the Gram matrix is the small one. Stages run in ``dtype`` except the
    last, which runs in ``final_dtype`` (default ``dtype``). With the default schedule every singular
    value ends within about 5e-4 of 1 (2e-3 at condition number 1e4) in fp64, fp32 and bf16 + fp32
    cleanup alike; bf16 leading stages keep the singular values but not the singular vectors of
    ill-conditioned matrices (spectral distance to the polar factor 0.016 at condition 10, 0.09 at 1e2,
    0.6 at 1e3, 1.5 at 1e4, against 5e-4 to 2e-3 in fp32). ``chunk``: matrices per batched
    call (default: the whole batch on accelerators, ``cpu_chunk`` on CPU); results do not depend on it.
    """
    if g.ndim < 2:
        raise ValueError(f"newton_schulz needs a matrix, got shape {tuple(g.shape)}")
    shape = g.shape
    x = g.reshape(-1, shape[-2], shape[-1])
    if chunk is None:
        chunk = (cpu_chunk(x.shape[0], shape[-2], shape[-1], torch.finfo(dtype).bits // 8, torch.get_num_threads())
                 if x.device.type == "cpu" else x.shape[0])
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if chunk < x.shape[0]:
        parts = [_newton_schulz_batch(x[i:i + chunk], stages, eps, dtype, final_dtype)
                 for i in range(0, x.shape[0], chunk)]
        return torch.cat(parts).reshape(shape).to(g.dtype)
    return _newton_schulz_batch(x, stages, eps, dtype, final_dtype).reshape(shape).to(g.dtype)


def _newton_schulz_batch(x: Tensor, stages: Sequence[Stage], eps: float, dtype: torch.dtype,
                         final_dtype: torch.dtype | None) -> Tensor:
    """newton_schulz on one [B, n, m] batch in a single chain of batched GEMMs; returns [B, n, m]."""
    x = x.to(dtype)
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for i, (steps, (a, b, c)) in enumerate(stages):
        x = x.to((final_dtype or dtype) if i == len(stages) - 1 else dtype)
        # fp32/fp64: fold the a-term onto the small matrix's diagonal, (aI + bG + cG^2) X, so the big X is
        # not copied; in bf16 that diagonal would round a away, so keep a X + (bG + cG^2) X there.
        fold = x.dtype in (torch.float32, torch.float64)
        # Work buffers allocated once per stage and written with out= (no allocator traffic per iteration).
        x = x.contiguous()
        spare = torch.empty_like(x)
        gram = x.new_empty((x.shape[0], x.shape[1], x.shape[1]))
        poly = torch.empty_like(gram)
        for _ in range(steps):
            torch.bmm(x, x.mT, out=gram)
            torch.baddbmm(gram, gram, gram, beta=b, alpha=c, out=poly)
            if fold:
                poly.diagonal(dim1=-2, dim2=-1).add_(a)
                torch.bmm(poly, x, out=spare)
            else:
                torch.baddbmm(x, poly, x, beta=a, out=spare)
            x, spare = spare, x
    return x.mT if tall else x


def update_scale(shape: Sequence[int], update_rms: float) -> float:
    """sqrt(max(n, m)) x update_rms: an orthogonal n x m matrix has RMS 1/sqrt(max(n, m)), so this gives RMS update_rms."""
    n, m = shape[-2], shape[-1]
    return update_rms * math.sqrt(max(n, m))


class Muon(torch.optim.Optimizer):
    """Muon for 2-D weights and 3-D stacked experts ([E, n, m], orthogonalised per expert).

    Per step: buf <- lerp(buf, g, 1 - momentum); u = lerp(g, buf, momentum) (Nesterov) or buf;
    O = NS(u); p <- p (1 - lr wd); p <- p - lr sqrt(max(n, m)) update_rms O.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], lr: float = 2e-2,
                 momentum: float = 0.95, nesterov: bool = True, weight_decay: float = 0.1,
                 update_rms: float = 0.18, stages: Sequence[Stage] = DEFAULT_STAGES, eps: float = 1e-7,
                 ns_dtype: torch.dtype = torch.float32, final_dtype: torch.dtype | None = None,
                 orthogonalize: Orthogonalize | None = None) -> None:
        if lr < 0 or not 0 <= momentum < 1 or weight_decay < 0 or update_rms <= 0:
            raise ValueError(f"invalid Muon hyper-parameters lr={lr} momentum={momentum} "
                             f"weight_decay={weight_decay} update_rms={update_rms}")
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                        update_rms=update_rms, stages=tuple((int(s), tuple(c)) for s, c in stages), eps=eps,
                        ns_dtype=ns_dtype, final_dtype=final_dtype)
        super().__init__(params, defaults)
        self.orthogonalize: Orthogonalize = orthogonalize or orthogonalize_local
        """How updates become orthogonal: whole local matrices here; the parallel layer installs one that
        gathers sharded matrices (trex.trainer.parallel.muon)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim not in (2, 3):
                    raise ValueError(f"Muon takes 2-D or 3-D (stacked experts) parameters, got shape {tuple(p.shape)}")

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update of every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for group in self.param_groups:
                self._step_group(group)
        return loss

    def _step_group(self, group: dict[str, Any]) -> None:
        lr, mom, wd = group["lr"], group["momentum"], group["weight_decay"]
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        for p in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
        # Arithmetic on the rank-local shards (the whole tensors in one process); the state stays a DTensor
        # where the parameter is one, so checkpoints reshard.
        local = [local_tensor(p) for p in params]
        grads = [local_tensor(p.grad) for p in params if p.grad is not None]
        bufs = [local_tensor(self.state[p]["momentum_buffer"]) for p in params]
        # Momentum and the Nesterov look-ahead as multi-tensor ops (one kernel launch per list, not per parameter).
        torch._foreach_lerp_(bufs, grads, 1 - mom)
        updates = torch._foreach_lerp(grads, bufs, mom) if group["nesterov"] else bufs
        if wd:
            torch._foreach_mul_(local, 1 - lr * wd)

        def ns(x: Tensor) -> Tensor:
            return newton_schulz(x, group["stages"], eps=group["eps"], dtype=group["ns_dtype"],
                                 final_dtype=group.get("final_dtype"))

        ortho = self.orthogonalize(params, list(updates), ns)
        for p, lp, o in zip(params, local, ortho, strict=True):
            lp.add_(o.to(lp.dtype), alpha=-lr * update_scale(p.shape, group["update_rms"]))


Orthogonalize = Callable[[Sequence[Tensor], list[Tensor], Callable[[Tensor], Tensor]], list[Tensor]]
"""(parameters, their rank-local updates, newton_schulz) -> the rank-local orthogonalised updates."""


def orthogonalize_local(_params: Sequence[Tensor], updates: list[Tensor], ns: Callable[[Tensor], Tensor]) -> list[Tensor]:
    """Every update is a whole matrix (or expert stack) here: orthogonalise them all in few batched calls."""
    return orthogonalize_batched(updates, ns)


NS_BATCH_ELEMENTS = 1 << 24
"""At most this many elements (16 Mi: 64 MiB in fp32) of same-shaped matrices share one batched
Newton-Schulz call (a larger parameter is a call of its own). Fixed, so the batches do not depend on how
the parameters are split otherwise (the swap optimizer's buckets are whole batches), and it bounds the
call's workspace; far above the size at which batching small matrices stops paying."""


def ns_key(shape: Sequence[int]) -> tuple[int, int]:
    """(short, long) side of a matrix or stack of matrices: the Newton-Schulz batch it can join (tall matrices
    are transposed to wide; the map commutes with transposition)."""
    n, m = shape[-2], shape[-1]
    return min(n, m), max(n, m)


def ns_batches(shapes: Sequence[Sequence[int]], cap: int | None = None) -> list[list[int]]:
    """Indices of the matrices (2-D) and stacks (3-D) that share one Newton-Schulz call: same ``ns_key``,
    consecutive among that key's items, greedily up to ``cap`` elements (default NS_BATCH_ELEMENTS);
    ordered by first index. Greedy from any batch boundary gives the same batches, so any run of whole
    consecutive batches of a key forms them again."""
    cap = NS_BATCH_ELEMENTS if cap is None else cap
    open_: dict[tuple[int, int], tuple[list[int], int]] = {}
    out: list[list[int]] = []
    for i, shape in enumerate(shapes):
        key, n = ns_key(shape), math.prod(shape)
        batch = open_.get(key)
        if batch is not None and batch[1] + n <= cap:
            batch[0].append(i)
            open_[key] = (batch[0], batch[1] + n)
        else:
            out.append([i])
            open_[key] = (out[-1], n)
    return out


def orthogonalize_batched(mats: Sequence[Tensor], ns: Callable[[Tensor], Tensor]) -> list[Tensor]:
    """ns of each 2-D matrix / 3-D stack of matrices, one call per ``ns_batches`` batch (tall matrices
    transposed to wide)."""
    out: list[Tensor] = [mats[0]] * len(mats)
    for batch in ns_batches([u.shape for u in mats]):
        n, m = ns_key(mats[batch[0]].shape)
        items = [(i, mats[i].shape[-2] > mats[i].shape[-1]) for i in batch]
        flat = [(mats[i].mT if tall else mats[i]).reshape(-1, n, m) for i, tall in items]
        stacked = torch.cat(flat) if len(flat) > 1 else flat[0]
        ortho = ns(stacked) if stacked.shape[0] else stacked
        offset = 0
        for (i, tall), f in zip(items, flat, strict=True):
            o = ortho[offset:offset + f.shape[0]]
            offset += f.shape[0]
            out[i] = (o.mT if tall else o).reshape(mats[i].shape)
    return out
