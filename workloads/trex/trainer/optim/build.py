"""Split a model's parameters between Muon and AdamW by ``param_roles()`` and apply schedule and clipping."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trex.trainer.config import OptimizerConfig
from trex.trainer.optim.muon import Muon
from trex.trainer.optim.schedule import lr_factor

if TYPE_CHECKING:
    from trex.trainer.optim.swap import SwapStats


@dataclass
class Optimizers:
    """The two optimizers of one model; ``muon`` is None when the model has no Muon parameters."""

    muon: Muon | None
    adamw: torch.optim.AdamW | None

    def all(self) -> list[torch.optim.Optimizer]:
        """Both optimizers that exist, for whatever reads or replaces their states (checkpoints)."""
        return self._both()

    def _both(self) -> list[torch.optim.Optimizer]:
        return [o for o in (self.muon, self.adamw) if o is not None]

    def step(self) -> None:
        """Step both."""
        for o in self._both():
            o.step()

    def zero_grad(self) -> None:
        """Drop the gradients (set to None)."""
        for o in self._both():
            o.zero_grad(set_to_none=True)

    def set_lr_factor(self, factor: float) -> None:
        """Set every group's LR to its peak (``initial_lr``) times ``factor``."""
        for o in self._both():
            for g in o.param_groups:
                g["lr"] = g["initial_lr"] * factor

    def lr(self) -> dict[str, float]:
        """Current LR per optimizer."""
        out: dict[str, float] = {}
        if self.muon is not None:
            out["muon"] = float(self.muon.param_groups[0]["lr"])
        if self.adamw is not None:
            out["adamw"] = float(self.adamw.param_groups[0]["lr"])
        return out

    @property
    def last_stats(self) -> SwapStats | None:
        """The last step's host transfers (None: states stay on the device)."""
        return None

    def restored(self) -> None:
        """After a checkpoint or weight load: nothing to move (states and masters stay where they were built)."""

    def masters_on_device(self) -> contextlib.AbstractContextManager[None]:
        """The masters on the device for the duration: they already are."""
        return contextlib.nullcontext()

    def state_dict(self) -> dict[str, Any]:
        """Both optimizer states."""
        return {"muon": self.muon.state_dict() if self.muon else {},
                "adamw": self.adamw.state_dict() if self.adamw else {}}


def split_params(model: nn.Module, roles: dict[str, str]) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(muon, adamw) parameter lists; every trainable parameter must have exactly one known role."""
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    missing = sorted(set(named) - set(roles))
    extra = sorted(set(roles) - set(named))
    if missing or extra:
        raise ValueError(f"param_roles() does not match the trainable parameters: missing {missing[:5]}, "
                         f"unknown {extra[:5]}")
    bad = {n: r for n, r in roles.items() if r not in ("muon", "adamw")}
    if bad:
        raise ValueError(f"unknown optimizer roles {bad}; allowed: muon, adamw")
    muon = [named[n] for n in named if roles[n] == "muon"]
    adamw = [named[n] for n in named if roles[n] == "adamw"]
    return muon, adamw


def resolve_ns_dtype(setting: str, fast_bf16: bool) -> torch.dtype:
    """Newton-Schulz dtype of the leading stages: auto = bf16 where bf16 GEMMs are fast, else fp32.

    The last (cleanup) stage runs in fp32 either way, so the singular values land as close to 1 in bf16
    as in fp32 (about 5e-4 off) for about half the cost of the leading stages; the singular vectors of
    ill-conditioned updates drift from the polar factor in bf16 (see newton_schulz for the bound)."""
    if setting == "auto":
        return torch.bfloat16 if fast_bf16 else torch.float32
    return torch.bfloat16 if setting == "bf16" else torch.float32


def build_optimizers(model: nn.Module, roles: dict[str, str], cfg: OptimizerConfig,
                     ns_dtype: torch.dtype = torch.float32) -> Optimizers:
    """Muon (config.optimizer.muon) for "muon" parameters and torch.optim.AdamW for "adamw" ones (for every
    parameter with optimizer.muon.enabled false).

    Muon's leading Newton-Schulz stages run in ``ns_dtype``; the last (cleanup) stage always in fp32.
    """
    muon_params, adamw_params = split_params(model, roles)
    if not cfg.muon.enabled:
        muon_params, adamw_params = [], [p for p in model.parameters() if p.requires_grad]
    muon = Muon(muon_params) if muon_params else None
    adamw = torch.optim.AdamW(adamw_params) if adamw_params else None
    opts = Optimizers(muon, adamw)
    apply_hparams(opts, cfg, ns_dtype)
    return opts


def apply_hparams(opts: Optimizers, cfg: OptimizerConfig, ns_dtype: torch.dtype = torch.float32) -> None:
    """Set every group's hyper-parameters (peak LR as ``initial_lr``) from the config; states are untouched."""
    m, a = cfg.muon, cfg.adamw
    if opts.muon is not None:
        stages = tuple((s.steps, (s.coefficients[0], s.coefficients[1], s.coefficients[2])) for s in m.newton_schulz)
        for g in opts.muon.param_groups:
            g.update(lr=m.lr, initial_lr=m.lr, momentum=m.momentum, nesterov=m.nesterov, weight_decay=m.weight_decay,
                     update_rms=m.update_rms, stages=stages, ns_dtype=ns_dtype,
                     final_dtype=torch.float64 if ns_dtype == torch.float64 else torch.float32)
    if opts.adamw is not None:
        for g in opts.adamw.param_groups:
            g.update(lr=a.lr, initial_lr=a.lr, betas=(a.betas[0], a.betas[1]), eps=a.eps, weight_decay=a.weight_decay)


def schedule_factor(cfg: OptimizerConfig, step: int, total_steps: int) -> float:
    """The shared LR multiplier at ``step`` from config.optimizer.schedule."""
    s = cfg.schedule
    return lr_factor(step, total_steps, s.warmup_steps, s.constant_steps, s.decay, s.min_lr_ratio)


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> float:
    """Global L2 norm of all gradients (before clipping); clips in place when max_norm > 0."""
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(grads, max_norm, error_if_nonfinite=False))
    return float(torch.nn.utils.get_total_norm([p.grad for p in grads if p.grad is not None]))
