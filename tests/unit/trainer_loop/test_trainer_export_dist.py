"""Distributed Hugging Face export (spawn, gloo): every layout's export equals the single-process export tensor for
tensor, bit for bit (bf16, FP8, FP8 + FP4); transformers loads the two-rank bf16 export with trex's logits; the
quantised export loads back through trex's loader within a float64 quantiser's error; and each rank's peak
memory during the export falls with the world size."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors import safe_open
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.export import export_trainer
from trex.trainer.loop import Trainer

MODEL: dict[str, Any] = {"preset": "tiny", "dtype": "bf16", "overrides": {"numLayers": 2, "mtpDepth": 1}}
WORLD2 = {"dp2": {"dp": 2}, "tp2": {"tp": 2}, "ep2": {"ep": 2}}
WORLD4 = {"tp2-ep2": {"tp": 2, "ep": 2}}
"""At four ranks: two data-parallel ranks of two tp ranks each, experts over ep pairs across them."""
QUANTS = ("none", "fp8", "fp8-fp4")
V4: dict[str, Any] = {"preset": "tiny", "dtype": "bf16", "overrides": {
    "attention": "csa", "qLoraRank": 32, "vHeadDim": 24, "hcMult": 2, "scoring": "sqrt-softplus", "nHashLayers": 1,
    "numLayers": 2, "layerTypes": ["csa", "hca"]}}
"""A DeepSeek-V4 shape (gate_up_proj joins two parameters; tp splits o_a rows and sinks), exported fp8-fp4."""


def _cfg(root: Path, layout: dict[str, Any], quant: str, model: dict[str, Any] = MODEL) -> TrainerConfig:
    return load_section(TrainerConfig, {
        "model": model, "maxSteps": 1, "parallelism": layout,
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 4},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(root), "exportQuant": quant},
    })


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                assert k not in out, f"{k} stored twice"
                out[k] = h.get_tensor(k)
    return out


def _assert_same(got: Path, want: Path) -> None:
    a, b = _tensors(got), _tensors(want)
    assert sorted(a) == sorted(b)
    for k, t in b.items():
        assert a[k].dtype == t.dtype and a[k].shape == t.shape, k
        assert a[k].reshape(-1).view(torch.uint8).tolist() == t.reshape(-1).view(torch.uint8).tolist(), k
    if (want / "model.safetensors.index.json").exists() or (got / "model.safetensors.index.json").exists():
        index = json.loads((got / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == set(b)
        for name, fname in index["weight_map"].items():
            with safe_open(str(got / fname), "pt") as h:
                assert name in h.keys()


def _worker(rank: int, world: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous-{world}", rank=rank, world_size=world)
    try:
        root = Path(out)
        for name, layout in (WORLD2 if world == 2 else WORLD4).items():
            for quant in QUANTS:
                tr = Trainer(_cfg(root / f"{name}-{quant}", layout, quant), root, group=dist.group.WORLD,
                             measure_peak=False, log=lambda _m: None)
                export_trainer(tr, root / f"{name}-{quant}" / "hf")
            if world == 2 and name != "dp2":
                tr = Trainer(_cfg(root / f"v4-{name}", layout, "fp8-fp4", V4), root, group=dist.group.WORLD,
                             measure_peak=False, log=lambda _m: None)
                export_trainer(tr, root / f"v4-{name}" / "hf")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export")
    for quant in QUANTS:
        tr = Trainer(_cfg(root / f"single-{quant}", {}, quant), root, measure_peak=False, log=lambda _m: None)
        export_trainer(tr, root / f"single-{quant}" / "hf")
    tr = Trainer(_cfg(root / "v4-single", {}, "fp8-fp4", V4), root, measure_peak=False, log=lambda _m: None)
    export_trainer(tr, root / "v4-single" / "hf")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for world in (2, 4):
        mp.spawn(_worker, args=(world, str(root)), nprocs=world, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return root


@pytest.mark.slow
@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("layout", [*WORLD2, *WORLD4])
def test_distributed_export_equals_single_process_bit_for_bit(exports: Path, layout: str, quant: str) -> None:
    got = exports / f"{layout}-{quant}" / "hf"
    _assert_same(got, exports / f"single-{quant}" / "hf")
    assert json.loads((got / "config.json").read_text()).get("quantization_config", {}).get(
        "expert_dtype") == ("fp4" if quant == "fp8-fp4" else None)
    assert (got / "tokenizer.json").exists() and not got.with_name("hf.partial").exists()


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["tp2", "ep2"])
def test_distributed_v4_fp4_export_equals_single_process_bit_for_bit(exports: Path, layout: str) -> None:
    _assert_same(exports / f"v4-{layout}" / "hf", exports / "v4-single" / "hf")
    assert any(t.dtype == torch.int8 for t in _tensors(exports / "v4-single" / "hf").values())


@pytest.mark.slow
def test_single_process_export_equals_save_hf(exports: Path, tmp_path: Path) -> None:
    """The owner-plan writer stores exactly what hf.save_hf (one process, whole tensors) stores."""
    from trex.trainer.hf import save_hf

    for quant in QUANTS:
        tr = Trainer(_cfg(tmp_path / quant, {}, quant), tmp_path, measure_peak=False, log=lambda _m: None)
        save_hf(tr.model, tmp_path / quant / "ref", quant=quant)
        _assert_same(exports / f"single-{quant}" / "hf", tmp_path / quant / "ref")


@pytest.mark.slow
def test_transformers_loads_the_two_rank_export(exports: Path, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tr = Trainer(_cfg(tmp_path, {}, "none"), tmp_path, measure_peak=False, log=lambda _m: None)
    hf = transformers.AutoModelForCausalLM.from_pretrained(exports / "ep2-none" / "hf", dtype=torch.float32).eval()
    ours = tr.model.float().eval()
    ids = torch.randint(0, 512, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = ours(ids).logits, hf(ids).logits
    assert float((got - want).abs().max()) <= 2e-2 * float(want.abs().max())


def _fp8_reference_error(w: torch.Tensor) -> torch.Tensor:
    """Elementwise bound of a float64 FP8 e4m3 block quantiser: half a step of 3 mantissa bits at the value,
    with the block scale amax / 448 (subnormals: half of 2^-9 of the scale)."""
    w = w.double()
    rows, cols = w.shape[-2:]
    pad = torch.nn.functional.pad(w, (0, -cols % 128, 0, -rows % 128))
    blocks = pad.reshape(*pad.shape[:-2], pad.shape[-2] // 128, 128, pad.shape[-1] // 128, 128)
    scale = blocks.abs().amax(dim=(-3, -1)).clamp_min(1e-300) / 448
    s = scale.repeat_interleave(128, -2).repeat_interleave(128, -1)[..., :rows, :cols]
    return torch.maximum(w.abs() * 2.0**-4, s * 2.0**-10) * (1 + 1e-6)


def _fp4_reference(w: torch.Tensor) -> torch.Tensor:
    """A float64 FP4 e2m1 quantise/dequantise: power-of-two scale per 1 x 32 (the smallest 2^e with amax / 2^e
    <= 6), each value the nearest of the e2m1 grid (the error is what counts: ties either way)."""
    w = w.double()
    blocks = w.reshape(*w.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = torch.exp2(torch.ceil(torch.log2(torch.where(amax > 0, amax / 6, torch.ones_like(amax)))))
    grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)
    x = blocks / scale
    idx = (x.abs().unsqueeze(-1) - grid).abs().argmin(-1)
    return (torch.sign(x) * grid[idx] * scale).reshape(w.shape)


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["fp8", "fp8-fp4"])
def test_quantised_export_loads_through_trex_within_quantisation_error(exports: Path, tmp_path: Path,
                                                                       quant: str) -> None:
    from trex.trainer.hf import load_hf
    from trex.trainer.quant_io import quant_kind

    tr = Trainer(_cfg(tmp_path, {}, quant), tmp_path, measure_peak=False, log=lambda _m: None)
    want = {k: v.double() for k, v in tr.model.state_dict().items()}
    loaded = load_hf(exports / f"tp2-ep2-{quant}" / "hf").state_dict()
    assert sorted(loaded) == sorted(want)
    kinds = {"fp8": 0, "fp4": 0, None: 0}
    for k, w in want.items():
        got = loaded[k].double()
        stacked = k.split(".")[-1] in ("gate_proj", "up_proj", "down_proj") and ".experts." in k
        stored = "model." + (k.replace(".experts.", ".experts.0.") + ".weight" if stacked else k)  # its HF name
        kind = quant_kind(stored, w.dim() - stacked, w.is_floating_point(), quant == "fp8-fp4")
        kinds[kind] += 1
        if kind is None:
            assert torch.equal(got, w), k
        elif kind == "fp4":
            ref = _fp4_reference(w)
            assert torch.allclose((got - w).abs(), (ref - w).abs(), rtol=0, atol=1e-12), k
        else:
            assert bool(((got - w).abs() <= _fp8_reference_error(w)).all()), k
            assert not torch.equal(got, w), k
    assert kinds["fp8"] > 0 and kinds[None] > 0 and (kinds["fp4"] > 0) == (quant == "fp8-fp4")


def _status(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def _peak_worker(rank: int, world: int, out: str) -> None:
    """Build small-cpu (fp32, ~50 MB) distributed over dp = world and export it; record the bytes of this rank's
    shards and what the export adds to them (VmHWM during the export, reset just before, above the RSS then)."""
    from trex.trainer.build import distributed_model
    from trex.trainer.hf_export import save_hf_distributed
    from trex.trainer.model import ModelArgs, build_model
    from trex.trainer.parallel.mesh import ParallelDims, build_meshes

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{out}/rdv-peak-{world}", rank=rank, world_size=world)
    dims = ParallelDims(world=world, dp_shard=world)
    meshes = build_meshes(dims, "cpu") if world > 1 else None

    def export(preset: str) -> int:
        cfg = load_section(TrainerConfig, {"model": {"preset": preset, "dtype": "fp32"}})
        if meshes is None:
            model = build_model(cfg.model, dtype=torch.float32, seed=0)
        else:
            model, _ = distributed_model(ModelArgs.from_config(cfg.model), dims, meshes, torch.float32,
                                         torch.device("cpu"), 0)
        state = model.state_dict()
        shards = sum(v.to_local().nbytes if hasattr(v, "to_local") else v.nbytes for v in state.values())
        target = Path(out) / f"{preset}-{world}"
        target.mkdir(exist_ok=True)
        before = _status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
        save_hf_distributed(state, model.args, target, dict.fromkeys(state, torch.bfloat16), chunk_bytes=1024**2)
        Path(out, f"peak-{world}-{rank}.json").write_text(json.dumps([shards, _status("VmHWM") - before]))
        return shards

    export("tiny")  # what every process loads whatever the model size (modules, gloo buffers), loaded first
    export("small-cpu")
    if world > 1:
        dist.destroy_process_group()


@pytest.mark.slow
def test_export_peak_memory_per_rank_falls_with_the_world_size(tmp_path: Path) -> None:
    """A rank's peak during the export (its shards + what the export adds) at world N is at most the one-process
    peak / N within 15 % plus one chunk's buffers (8 MiB): the export adds at most that at any world size,
    where the gather path it replaced added ~9 B/param on rank 0 (benchmarks/hf_export_memory.py)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    peaks: dict[int, int] = {}
    for world in (1, 2, 4):
        mp.spawn(_peak_worker, args=(world, str(tmp_path)), nprocs=world, join=True)  # type: ignore[attr-defined,no-untyped-call]
        rows = [json.loads(Path(tmp_path, f"peak-{world}-{r}.json").read_text()) for r in range(world)]
        assert all(added <= 8 * 1024**2 for _, added in rows), (world, rows)
        peaks[world] = max(shards + added for shards, added in rows)
    assert peaks[1] > 40 * 1024**2  # the fp32 model
    for world in (2, 4):
        assert peaks[world] <= peaks[1] / world * 1.15 + 8 * 1024**2, (world, peaks)


def test_fp4_export_of_a_shape_it_cannot_store_names_the_field(tmp_path: Path) -> None:
    """Refused before anything is written, naming checkpoint.exportQuant and the tensor."""
    from trex.trainer.hf_export import save_hf_distributed
    from trex.trainer.model import build_model

    cfg = load_section(TrainerConfig, {"model": {"preset": "tiny", "overrides": {"moeIntermediateSize": 16}}})
    model = build_model(cfg.model, dtype=torch.float32, seed=0)
    state = model.state_dict()
    with pytest.raises(ValueError, match=r"checkpoint.exportQuant=fp8-fp4: .*experts.*16 input columns"):
        save_hf_distributed(state, model.args, tmp_path, {k: v.dtype for k, v in state.items()}, quant="fp8-fp4")
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match=r"checkpoint\.exportQuant='fp4'"):
        save_hf_distributed(state, model.args, tmp_path, {k: v.dtype for k, v in state.items()}, quant="fp4")


def test_export_quant_rejects_an_unknown_mode_naming_the_field(tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="exportQuant"):
        _cfg(tmp_path, {}, "fp4")
