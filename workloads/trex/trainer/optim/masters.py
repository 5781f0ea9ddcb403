"""fp32 master shards in host memory for a bf16 model sharded by FSDP2 (what optimizer.swap moves besides the
optimizer states).

A bf16 model under FSDP2 is built in fp32: its sharded parameters are the fp32 masters and FSDP2 gathers
them in bf16 for compute (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``), so gradients are
reduce-scattered into fp32 shards and every update lands in fp32. With optimizer.swap each master shard
moves to host memory (it becomes FSDP2's sharded data there) and the device keeps a bf16 copy of the padded
shard. FSDP2's all-gather extension hooks (``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``, set on the
local shard, which FSDP2 looks up at lazy initialisation) send that copy instead of casting the master: the
same bf16 values FSDP2 would send itself, so the forward, the fp32 gradients and the updates are bit for bit
those of the master on the device. The swap optimizer streams each master through its buckets with the
parameter's states and refreshes the bf16 copy from the updated master before writing it back.

One process has no masters: a bf16 model there is bf16 throughout (parameters, gradients, states), and the
swap optimizer moves its states only.

FSDP2 keeps its per-parameter records (``FSDPParam``: the padded sharded data, the mixed-precision policy,
the extension lookup) private; this module reads and sets those of the torch it runs with and says so
plainly when they are missing, rather than training on a layout it does not know.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class MasterShard:
    """One fp32 master shard in host memory and the bf16 copy of it that FSDP2 gathers from."""

    param: torch.Tensor
    """The sharded parameter (a DTensor; the optimizers key their states by it)."""
    local: torch.Tensor
    """Its local shard: stored in ``host`` between steps, in a device bucket buffer while its bucket steps."""
    host: torch.Tensor
    """The padded master shard in host memory (FSDP2's sharded data; ``local`` is its leading rows)."""
    compute: torch.Tensor
    """The padded shard in the compute dtype, on the device: what the all-gather sends."""

    @property
    def host_view(self) -> torch.Tensor:
        """The rows of ``host`` that are the local shard (the rest is FSDP2's padding)."""
        return self.host[:self.local.shape[0]]

    def refresh(self) -> None:
        """Cast the master (wherever it is stored now) into the bf16 copy: the next all-gather sends it."""
        self.compute[:self.local.shape[0]].copy_(self.local)

    def nbytes(self) -> tuple[int, int]:
        """(host bytes of the padded master, device bytes of its bf16 copy)."""
        return (self.host.numel() * self.host.element_size(), self.compute.numel() * self.compute.element_size())


def master_params(model: nn.Module) -> list[Any]:
    """FSDP2's records (``FSDPParam``) of the parameters whose shards are fp32 masters: fp32 sharded
    parameters gathered in a narrower dtype. Empty for a model FSDP2 does not shard (one process)."""
    from torch.distributed.fsdp import FSDPModule

    out: list[Any] = []
    for mod in model.modules():
        if not isinstance(mod, FSDPModule):
            continue
        group = getattr(mod._get_fsdp_state(), "_fsdp_param_group", None)
        if group is None:
            continue
        for fp in group.fsdp_params:
            missing = [a for a in _FSDP_PARAM_ATTRS if not hasattr(fp, a)]
            if missing:
                raise RuntimeError(f"optimizer.swap: torch {torch.__version__}'s FSDP2 parameter records lack "
                                   f"{missing}; the fp32 masters cannot move to host memory with this torch")
            compute = fp.mp_policy.param_dtype
            if fp.sharded_param.dtype == torch.float32 and compute is not None and compute != torch.float32:
                out.append(fp)
    return out


_FSDP_PARAM_ATTRS = ("sharded_param", "mp_policy", "offload_to_cpu", "fsdp_placement", "padded_sharded_param_size",
                     "_sharded_param_data", "_init_extensions")
"""What :func:`hold_masters` reads and sets on FSDP2's ``FSDPParam``."""


def hold_masters(model: nn.Module, pin: bool) -> list[MasterShard]:
    """Move every fp32 master shard of ``model`` to host memory (``pin``: page-locked, for accelerators) and
    let FSDP2 gather its bf16 copy on the device instead; returns the shards in parameter order. Call before
    the first forward or between steps (never while FSDP2 holds the model gathered)."""
    out: list[MasterShard] = []
    with torch.no_grad():
        for fp in master_params(model):
            if fp.offload_to_cpu or fp.fsdp_placement.dim != 0:
                raise ValueError(f"optimizer.swap: FSDP2 parameter {fp._param_fqn or fp._module_info.param_name} "
                                 "is CPU-offloaded or sharded on a dimension other than 0; masters cannot move")
            padded: torch.Tensor = fp._sharded_param_data.view(fp.padded_sharded_param_size)
            local: torch.Tensor = fp.sharded_param._local_tensor
            host = torch.empty(padded.shape, dtype=padded.dtype, pin_memory=pin)
            host.copy_(padded)
            compute = padded.to(fp.mp_policy.param_dtype)
            shard = MasterShard(fp.sharded_param, local, host, compute)
            local.data = shard.host_view
            fp._sharded_param_data = host.view(-1)  # the device master is freed with its last reference
            _gather_from(local, compute)
            local.trex_master = shard  # type: ignore[attr-defined]  # found again by held_masters
            fp._init_extensions()  # FSDP2 looks the hooks up here (and again at its lazy initialisation)
            out.append(shard)
    return out


def _gather_from(local: torch.Tensor, compute: torch.Tensor) -> None:
    """Set FSDP2's all-gather extension hooks on the local shard: the all-gather input is ``compute`` (the
    padded bf16 copy); the gathered output is the unsharded parameter itself, in the compute dtype."""

    def pre_all_gather(mesh: Any, outer_size: torch.Size, outer_stride: tuple[int, ...], module: nn.Module,
                       mp_policy: Any) -> tuple[tuple[torch.Tensor, ...], None]:
        return (compute,), None

    def post_all_gather(outputs: tuple[torch.Tensor, ...], metadata: Any, param_dtype: torch.dtype, *,
                        out: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None:
        if out is not None:  # the all-gather wrote into the unsharded parameter's storage already
            return None
        return outputs[0], ()

    local.fsdp_pre_all_gather = pre_all_gather  # type: ignore[attr-defined]
    local.fsdp_post_all_gather = post_all_gather  # type: ignore[attr-defined]


def held_masters(model: nn.Module) -> list[MasterShard]:
    """The master shards :func:`hold_masters` moved to host memory for ``model`` (none when it moved none)."""
    out: list[MasterShard] = []
    for p in model.parameters():
        shard = getattr(getattr(p, "_local_tensor", None), "trex_master", None)
        if isinstance(shard, MasterShard):
            out.append(shard)
    return out


@contextlib.contextmanager
def stored_on_device(shards: Iterable[MasterShard]) -> Iterator[None]:
    """The master shards stored on the device for the duration, back in their host copies afterwards: for
    gathering whole parameters (full state dicts), which NCCL / HCCL cannot do from host memory. Between
    steps only (a step with masters returns once they have landed in host memory)."""
    moved = list(shards)
    with torch.no_grad():
        for m in moved:
            m.local.data = m.host_view.to(m.compute.device)
    try:
        yield
    finally:
        with torch.no_grad():
            for m in moved:
                m.local.data = m.host_view
