"""Parameter counts, FLOPs per token, MFU, the device catalog and the peak FLOP/s a run is measured against
(pure Python; torch only for the peak calibrations). Per-device memory is planned by trex.trainer.plan.

FLOPs convention (label `FLOPS_CONVENTION`), per trained token (forward + backward):

    flops/token = 6 x N_active + 6 x L_attn x H x (d_qk + d_v) x K + 6 x L_attn x h_idx x d_idx x C

* N_active: parameters a token touches, without the input embedding (a lookup, no GEMM): every
  attention/norm/dense/shared-expert/router/mHC parameter, `experts_per_token` of the
  `n_routed_experts` routed experts, the output head, and the MTP modules (they run in training). The
  output head is shared with the MTP modules but runs once per use, so it counts 1 + mtp_depth times.
* Attention: QK^T and AV cost 2 x H x (d_qk + d_v) multiply-adds... i.e. 2 x H x (d_qk + d_v) FLOPs per
  attended key in the forward, x3 for forward + backward; with d_qk = d_v = d this is the familiar
  12 x H x d per key. L_attn = num_layers + mtp_depth.
* K (attended keys per query, averaged over the layers): `mla` is causal: K = T/2 (the average over the
  sequence); V4 layers count only attended keys: sliding K = min(window, T), csa adds min(top_k, T / m),
  hca adds T / (2 m') (every past entry). With d_qk = d_v = head_dim for V4's shared key/value head.
* The lightning indexer of each csa layer scores every visible compressed entry: C = T / (2 m) on average.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trex.trainer.model_args import default_layer_types

if TYPE_CHECKING:
    from trex.runtime.device import DeviceInfo

FLOPS_CONVENTION = "6N_active+attn_causal"
"""Label carried next to the MFU gauge: 6 x active non-embedding params + attended-key attention term."""

GIB = 1024**3


@dataclass(frozen=True)
class DeviceSku:
    """One accelerator model: what trex plans against (memory) and measures MFU against (peak)."""

    name: str
    """Display name."""
    device_type: str
    """The TrainJob deviceType it serves: npu, gpu or cpu."""
    memory_bytes: int | None
    """Device memory one trainer process may use (None: host memory, known only where it runs)."""
    peak_flops: float | None
    """Dense bf16/fp16 peak FLOP/s, no sparsity (None: calibrated by a measurement)."""


# Vendor specifications. One trainer process drives one device: an Ascend 910C package holds two
# 910B-class dies that the runtime exposes as two devices (16 per A3 node), so its row is one die.
DEVICES: dict[str, DeviceSku] = {
    "910b": DeviceSku("Ascend 910B", "npu", 64 * GIB, 313e12),  # 910B3 class; 64 GB HBM2e
    "910c": DeviceSku("Ascend 910C die", "npu", 64 * GIB, 376e12),  # 128 GB HBM2e / 780 TFLOPS per package
    "h100": DeviceSku("NVIDIA H100 SXM", "gpu", 80 * GIB, 989e12),  # 80 GB HBM3
    "h200": DeviceSku("NVIDIA H200 SXM", "gpu", 140 * GIB, 989e12),  # 141 GB HBM3e (143,771 MiB visible)
    "h800": DeviceSku("NVIDIA H800 SXM", "gpu", 80 * GIB, 989e12),
    "a100": DeviceSku("NVIDIA A100 80GB", "gpu", 80 * GIB, 312e12),
    "cpu": DeviceSku("CPU", "cpu", None, None),
}
"""The device catalog, keyed by the name a TrainJob's `deviceModel` and `--device` options use."""
DEFAULT_DEVICE_MODEL: dict[str, str] = {"npu": "910b", "gpu": "h100", "cpu": "cpu"}
"""The device a TrainJob plans against when `deviceModel` is unset, per deviceType."""
PEAK_FLOPS: dict[str, float] = {k: d.peak_flops for k, d in DEVICES.items() if d.peak_flops is not None}
DEVICE_ALIASES = {"ascend910c": "910c", "ascend-910c": "910c", "ascend910b": "910b", "ascend-910b": "910b"}


def device_peak(device: str, override: float | None = None) -> float:
    """Peak FLOP/s of a catalog device (or `override`); ValueError names the allowed devices."""
    if override is not None:
        if override <= 0:
            raise ValueError(f"peak FLOP/s must be positive, got {override}")
        return override
    key = DEVICE_ALIASES.get(device.lower(), device.lower())
    if key not in PEAK_FLOPS:
        raise ValueError(f"unknown device {device!r}; known: {', '.join(sorted(PEAK_FLOPS))}, cpu (measured)")
    return PEAK_FLOPS[key]


def measure_cpu_peak_flops(seconds: float = 1.0, n: int = 512, dtype: str = "fp32") -> float:
    """Calibrate the CPU peak with n x n GEMMs in ``dtype`` ("fp32" or "bf16") for about `seconds`;
    returns FLOP/s (best of runs)."""
    import torch

    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be fp32 or bf16, got {dtype!r}")
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float32
    a = torch.randn(n, n, dtype=tdt)
    b = torch.randn(n, n, dtype=tdt)
    torch.mm(a, b)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        reps = 4
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        dt = time.perf_counter() - t0
        best = max(best, reps * 2 * n**3 / max(dt, 1e-9))
        if time.perf_counter() >= deadline:
            return best


def _i(v: Mapping[str, Any], key: str) -> int:
    return int(v[key])


@dataclass(frozen=True)
class ParamBreakdown:
    """Parameter counts by part (elements)."""

    embedding: int
    head: int
    attention: int
    dense_ffn: int
    routed_experts: int
    shared_and_router: int
    norms_and_hc: int
    active_routed: int
    mtp: int = 0
    """The MTP modules' own parameters (block, projections, norms, mHC head), counted in the parts
    above too; the checkpoint holds them, DeepSeek's published totals do not."""
    mtp_active: int = 0
    """What of `mtp` one token touches (its block's top-k routed experts only)."""

    @property
    def total(self) -> int:
        """Every parameter."""
        return (self.embedding + self.head + self.attention + self.dense_ffn + self.routed_experts
                + self.shared_and_router + self.norms_and_hc)

    @property
    def active(self) -> int:
        """Parameters one token touches (routed experts: top-k only), embedding included."""
        return self.total - self.routed_experts + self.active_routed

    @property
    def active_non_embedding(self) -> int:
        """Active parameters without the input embedding: the N of 6N."""
        return self.active - self.embedding

    @property
    def main_model(self) -> int:
        """Every parameter but the MTP modules': how DeepSeek states a model's size (V4-Flash 284B,
        V4-Pro 1.6T; the released checkpoints hold the MTP block as well)."""
        return self.total - self.mtp

    @property
    def main_model_activated(self) -> int:
        """Active parameters of the main model without the input embedding (a lookup): how DeepSeek
        states activated parameters (V4-Flash 13B, V4-Pro 49B)."""
        return self.active - self.embedding - self.mtp_active

    @property
    def experts(self) -> int:
        """Parameters sharded by expert parallelism."""
        return self.routed_experts

    @property
    def dense(self) -> int:
        """Everything that is not a routed expert (sharded by tp/pp)."""
        return self.total - self.routed_experts


def layer_kinds(v: Mapping[str, Any]) -> list[str]:
    """Attention kind of every block (trunk, then MTP): mla, or V4's sliding / csa / hca."""
    n, mtp = _i(v, "num_layers"), _i(v, "mtp_depth")
    if v["attention"] == "mla":
        return ["mla"] * (n + mtp)
    given = list(v.get("layer_types") or default_layer_types(n))
    return (given + ["sliding"] * (n + mtp))[: n + mtp]


def _pool_params(d: int, dim: int, every: int, overlap: bool) -> int:
    width = 2 * dim if overlap else dim
    return 2 * d * width + every * width + dim


def _attention_params(v: Mapping[str, Any], kind: str) -> int:
    d, h = _i(v, "hidden_size"), _i(v, "num_heads")
    nope, rope, vd = _i(v, "qk_nope_head_dim"), _i(v, "qk_rope_head_dim"), _i(v, "v_head_dim")
    ql, kl = _i(v, "q_lora_rank"), _i(v, "kv_lora_rank")
    qk = nope + rope
    q = d * ql + ql + ql * h * qk if ql > 0 else d * h * qk
    if kind == "mla":
        return q + d * (kl + rope) + kl + kl * h * (nope + vd) + h * vd * d
    g, orank = _i(v, "o_groups"), _i(v, "o_lora_rank")
    n = q + d * qk + qk + h * qk * orank + g * orank * d + h
    if kind == "hca":
        n += _pool_params(d, qk, _i(v, "hca_compress_every"), overlap=False)
    if kind == "csa":
        ih, idim, m = _i(v, "csa_indexer_heads"), _i(v, "csa_indexer_dim"), _i(v, "csa_compress_every")
        n += _pool_params(d, qk, m, overlap=True) + _pool_params(d, idim, m, overlap=True) + ql * ih * idim + d * ih
    return n


def _hc_block(v: Mapping[str, Any]) -> int:
    n, d = _i(v, "hc_mult"), _i(v, "hidden_size")
    if n == 1:
        return 0
    return 2 * (n * d * (2 * n + n * n) + 3 + 2 * n + n * n)


def _hc_head(v: Mapping[str, Any]) -> int:
    n, d = _i(v, "hc_mult"), _i(v, "hidden_size")
    return 0 if n == 1 else n * d * n + 1 + n


def param_breakdown(v: Mapping[str, Any]) -> ParamBreakdown:
    """Exact parameter counts of the model `v` (resolved preset values) builds."""
    d, vocab = _i(v, "hidden_size"), _i(v, "vocab_size")
    layers, dense_layers, mtp = _i(v, "num_layers"), _i(v, "n_dense_layers"), _i(v, "mtp_depth")
    e, k, mi, ns = _i(v, "n_routed_experts"), _i(v, "experts_per_token"), _i(v, "moe_intermediate_size"), \
        _i(v, "n_shared_experts")
    moe_layers = layers - dense_layers + mtp
    attn_layers = layers + mtp
    expert = 3 * mi * d
    kinds = layer_kinds(v)
    mtp_shared = 2 * d + 2 * d * d + d + _hc_head(v)  # hnorm, enorm, the input projections, norm, hc head
    mtp_block = 2 * d + _hc_block(v) + e * d + 3 * d * mi * ns  # norms, mHC, router, shared expert
    mtp_params = sum(_attention_params(v, kind) for kind in kinds[layers:]) + mtp * (mtp_shared + mtp_block)
    return ParamBreakdown(
        embedding=vocab * d,
        head=vocab * d,
        attention=sum(_attention_params(v, kind) for kind in kinds),
        dense_ffn=dense_layers * 3 * d * _i(v, "intermediate_size"),
        routed_experts=moe_layers * e * expert,
        shared_and_router=moe_layers * (e * d + 3 * d * mi * ns),
        norms_and_hc=(attn_layers * (2 * d + _hc_block(v)) + d + _hc_head(v)
                      + mtp * (2 * d + 2 * d * d + d + _hc_head(v))),
        active_routed=moe_layers * k * expert,
        mtp=mtp_params + mtp * e * expert,
        mtp_active=mtp_params + mtp * k * expert,
    )


def attended_keys(v: Mapping[str, Any], seq_len: int, kind: str | None = None) -> float:
    """Average keys one query attends to in a layer of `kind` (default: averaged over the model's
    layers; see the module docstring)."""
    if kind is None:
        kinds = layer_kinds(v)
        return sum(attended_keys(v, seq_len, k) for k in kinds) / len(kinds)
    if kind == "mla":
        return seq_len / 2
    keys = float(min(_i(v, "csa_window"), seq_len))
    if kind == "csa":
        keys += min(_i(v, "csa_top_k"), seq_len / _i(v, "csa_compress_every"))
    if kind == "hca":
        keys += seq_len / (2 * _i(v, "hca_compress_every"))
    return keys


def flops_per_token(v: Mapping[str, Any], seq_len: int) -> float:
    """Training FLOPs per token under FLOPS_CONVENTION."""
    p = param_breakdown(v)
    attn_layers = _i(v, "num_layers") + _i(v, "mtp_depth")
    h = _i(v, "num_heads")
    dqk = _i(v, "qk_nope_head_dim") + _i(v, "qk_rope_head_dim")
    flops = 6.0 * (p.active_non_embedding + _i(v, "mtp_depth") * p.head)
    flops += 6.0 * attn_layers * h * (dqk + _i(v, "v_head_dim")) * attended_keys(v, seq_len)
    n_csa = layer_kinds(v).count("csa")
    flops += (6.0 * n_csa * _i(v, "csa_indexer_heads") * _i(v, "csa_indexer_dim")
              * seq_len / (2 * _i(v, "csa_compress_every")))
    return flops


def mfu(tokens_per_second: float, flops_per_token_: float, peak: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the peak."""
    if peak <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak}")
    return tokens_per_second * flops_per_token_ / peak


def peak_flops(device: DeviceInfo, measure: bool = True, seconds: float = 1.0,
               dtype: str = "fp32") -> tuple[float, str]:
    """(peak FLOP/s, source): the SKU catalog for accelerators, a short calibration GEMM on CPU or unknown SKUs.
    On CPU the calibration runs in the training's GEMM dtype (``dtype``: "fp32" or "bf16"), so a bf16 run's
    MFU is measured against the bf16 peak, not the lower fp32 one."""
    if device.kind != "cpu":
        name = device.name.lower().replace(" ", "")
        for key in sorted(PEAK_FLOPS, key=len, reverse=True):
            if key in name:
                return device_peak(key), f"catalog:{key}"
        return measure_device_gemm_flops(device, seconds), f"measured-gemm-bf16:{device.kind}"
    if not measure:
        return measure_device_gemm_flops(device, 0.05, n=256), "measured-gemm-fp32:cpu-quick"
    return measure_cpu_peak_flops(seconds=seconds, dtype=dtype), f"measured-gemm-{dtype}:cpu"


def measure_device_gemm_flops(device: DeviceInfo, seconds: float, n: int = 4096) -> float:
    """Best FLOP/s of square GEMMs on ``device`` (bf16 on accelerators, fp32 on CPU) over about ``seconds``."""
    import torch

    dev = device.torch_device()
    dtype = torch.float32 if device.kind == "cpu" else torch.bfloat16
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    mod = device.module()
    torch.mm(a, b)
    mod.synchronize()
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        mod.synchronize()
        best = max(best, 4 * 2 * n**3 / max(time.perf_counter() - t0, 1e-9))
        if time.perf_counter() >= deadline:
            return best
