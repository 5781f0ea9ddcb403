"""Sharded Hugging Face load: every rank reads only the boxes of the safetensors files its shards hold.

The slice reader and the per-box FP8/FP4 dequantisation against safetensors' whole-file load and whole-tensor
dequantisation; a release-layout FP8/FP4 folder (both V4 layouts) loaded at 2 ranks (dp2, etp2) and 4 ranks
(dp2 x ep2, tp2 x ep2) equal, bit for bit, to the same box of the one-process load; bytes read per rank
falling as 1/N plus the replicated tensors."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers.gloo import gloo_rank
from trex.trainer.model.args import ModelArgs

V4 = dict(attention="csa", vocab_size=64, hidden_size=64, num_heads=2, q_lora_rank=16, qk_nope_head_dim=24,
          qk_rope_head_dim=8, v_head_dim=32, hc_mult=2, num_layers=2, layer_types=["csa", "hca"],
          csa_compress_every=4, hca_compress_every=8, csa_top_k=2, csa_window=4, csa_indexer_heads=2,
          csa_indexer_dim=32, n_routed_experts=8, experts_per_token=2, moe_intermediate_size=64, o_groups=2,
          o_lora_rank=8, mtp_depth=1, n_hash_layers=1, scoring="sqrt-softplus", init_std=0.1)
LAYOUTS = {2: {"dp2": {"dp_shard": 2}, "etp2": {"dp_shard": 2, "etp": 2}},
           4: {"dp2xep2": {"dp_shard": 4, "ep": 2}, "tp2xep2": {"dp_shard": 2, "tp": 2, "ep": 2}}}
FOLDERS = ("hf-fp8-fp4", "original-fp8-fp4", "hf-fp8")


def test_slice_reader_matches_safetensors(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file
    from trex.trainer.hfio.reader import SafetensorsFolder

    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(7, 5, 9, generator=g), "b": torch.randn(6, 11, generator=g).bfloat16(),
               "c": torch.randint(-128, 127, (4, 16), generator=g, dtype=torch.int8),
               "d": torch.randn(5, 8, generator=g).to(torch.float8_e4m3fn), "s": torch.tensor(3.5)}
    save_file(tensors, tmp_path / "m.safetensors")
    want = load_file(tmp_path / "m.safetensors")
    with SafetensorsFolder(tmp_path) as folder:
        assert torch.equal(folder.read("s", ()), want["s"])
        for name, t in want.items():
            for _ in range(12):
                box = []
                for n in t.shape:
                    a = int(torch.randint(0, n, (1,), generator=g))
                    box.append((a, int(torch.randint(a, n + 1, (1,), generator=g))))
                got = folder.read(name, tuple(slice(a, b) for a, b in box))
                ref = t[tuple(slice(a, b) for a, b in box)]
                assert got.dtype == ref.dtype and torch.equal(got.contiguous().reshape(-1).view(torch.uint8),
                                                             ref.contiguous().reshape(-1).view(torch.uint8))
        before = folder.bytes_read
        folder.read("a", (slice(1, 3), slice(0, 5), slice(2, 4)))
        assert folder.bytes_read - before == 2 * 5 * 2 * 4  # exactly the box, in fp32 bytes


@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
def test_box_dequantization_equals_the_whole_tensor_s(tmp_path: Path, fmt: str) -> None:
    from safetensors.torch import save_file
    from trex.trainer.hfio.reader import SafetensorsFolder
    from trex.trainer.model.quant import fp4_dequantize, fp4_quantize, fp8_dequantize, fp8_quantize
    from trex.trainer.quant_io import read_dequantized

    g = torch.Generator().manual_seed(1)
    w = torch.randn(3, 300, 320, generator=g)
    q, s = fp8_quantize(w) if fmt == "fp8" else fp4_quantize(w)
    full = fp8_dequantize(q, s) if fmt == "fp8" else fp4_dequantize(q, s)
    save_file({"w": q, "w_scale_inv": s}, tmp_path / "m.safetensors")
    with SafetensorsFolder(tmp_path) as folder:
        dtype = folder.tensors["w"].dtype
        for box in ([(0, 3), (0, 300), (0, 320)], [(1, 2), (130, 257), (33, 301)], [(0, 3), (299, 300), (0, 1)],
                    [(2, 3), (5, 5), (0, 320)]):
            before = folder.bytes_read
            got = read_dequantized(folder.read, "w", "w_scale_inv", dtype, (3, 300, 320), box)
            assert torch.equal(got, full[tuple(slice(a, b) for a, b in box)]), box
            if box[1] == (130, 257):  # rows 128..384 clipped to 300, cols whole blocks around 33..301
                cols = (320 - 0) if fmt == "fp8" else (320 - 32)
                rows = (300 - 128) if fmt == "fp8" else 127
                assert folder.bytes_read - before >= rows * cols // (1 if fmt == "fp8" else 2)
                assert folder.bytes_read - before < w[0].numel()  # never the whole expert


def test_bad_folders_are_named(tmp_path: Path) -> None:
    """A truncated file names the file and tensor; a tensor of the wrong shape names the parameter."""
    from safetensors.torch import save_file
    from trex.trainer.hf import load_hf_into, save_hf
    from trex.trainer.hfio.reader import SafetensorsFolder
    from trex.trainer.model.model import build_model_from_args

    save_file({"a": torch.randn(64, 64)}, tmp_path / "m.safetensors")
    raw = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "m.safetensors").write_bytes(raw[: len(raw) - 100])
    with SafetensorsFolder(tmp_path) as folder, pytest.raises(OSError, match=r"m.safetensors: short read of a"):
        folder.read("a", (slice(60, 64), slice(0, 64)))
    small = ModelArgs(**dict(V4, mtp_depth=0))  # type: ignore[arg-type]
    save_hf(build_model_from_args(small, seed=0), tmp_path / "hf")
    wider = build_model_from_args(ModelArgs(**dict(V4, mtp_depth=0, vocab_size=96)), seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"(embed_tokens|lm_head).weight: checkpoint shape \(64, 64\) != model shape \(96, 64\)"):
        load_hf_into(wider, tmp_path / "hf")


def _args() -> ModelArgs:
    return ModelArgs(**V4)  # type: ignore[arg-type]


def _worker(rank: int, world: int, out: str) -> None:
    from trex.trainer.build import build_layout, distributed_model
    from trex.trainer.hf import load_hf_sharded
    from trex.trainer.parallel.init import local_indices
    from trex.trainer.parallel.mesh import ParallelDims

    torch.set_num_threads(1)
    with gloo_rank(rank, world, f"{out}/rendezvous-{world}"):
        root = Path(out)
        result: dict[str, Any] = {}
        for name, degrees in LAYOUTS[world].items():
            layout = build_layout(ParallelDims(world=world, **degrees), world, "cpu")
            assert layout.meshes is not None
            for folder in FOLDERS:
                ref = torch.load(root / f"{folder}.pt")
                model, _ = distributed_model(_args(), layout.dims, layout.meshes, torch.float32, torch.device("cpu"), 5)
                stats = load_hf_sharded(model, root / folder)
                bad = []
                for key, t in (dict(model.named_parameters()) | dict(model.named_buffers())).items():
                    if key not in ref:
                        continue
                    local, _, index = local_indices(t)
                    want = ref[key]
                    for dim, ix in enumerate(index):
                        if ix is not None:
                            want = want.index_select(dim, ix)
                    if not torch.equal(local, want):
                        bad.append(key)
                result[f"{name}/{folder}"] = {"bad": bad, "bytes": stats.bytes_read, "tensors": stats.tensors}
        (root / f"result-{world}-{rank}.json").write_text(json.dumps(result))


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trex.trainer.hf import load_hf, save_hf
    from trex.trainer.model.model import build_model_from_args

    out = tmp_path_factory.mktemp("sliced")
    src = build_model_from_args(_args(), seed=3)
    for folder in FOLDERS:
        layout, quant = folder.split("-", 1)
        save_hf(src, out / folder, layout=layout, quant=quant, max_shard_bytes=64 * 1024)
        ref = load_hf(out / folder)  # one process: the whole tensors
        torch.save(ref.state_dict(), out / f"{folder}.pt")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for world in (2, 4):
        mp.spawn(_worker, args=(world, str(out)), nprocs=world, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_load_equals_one_process_load(loaded: Path, world: int) -> None:
    for rank in range(world):
        got = json.loads((loaded / f"result-{world}-{rank}.json").read_text())
        assert set(got) == {f"{name}/{f}" for name in LAYOUTS[world] for f in FOLDERS}
        for case, r in got.items():
            assert r["bad"] == [], (rank, case)
            assert r["tensors"] > 50, case


SCALE = dict(V4, vocab_size=4096, hidden_size=256, n_routed_experts=16, moe_intermediate_size=256, q_lora_rank=64,
             qk_nope_head_dim=96, qk_rope_head_dim=32, v_head_dim=128, o_lora_rank=32, csa_indexer_dim=64)
"""A V4-shaped model of 13M parameters (52 MB in fp32; 17 MB stored as FP8/FP4 with DeepSeek's names)."""
BYTES_CONSTANT = 1 << 20
"""Bytes every rank reads besides its 1/N: the replicated tensors (norms, routers, mHC) and whole scale blocks."""
RSS_CONSTANT = 24 << 20
"""Peak resident bytes besides 1/N of the model: one box being read and dequantized, allocator slack."""


def _status(key: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key + ":"))
    return int(line.split()[1]) * 1024


def _scale_worker(rank: int, world: int, out: str) -> None:
    from trex.trainer.build import build_layout, distributed_model
    from trex.trainer.hf import load_hf_into, load_hf_sharded
    from trex.trainer.hfio.load import LoadStats
    from trex.trainer.model.model import build_model_from_args
    from trex.trainer.parallel.mesh import ParallelDims

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{out}/scale-{world}", rank=rank, world_size=world)
    layout = None
    if world > 1:
        layout = build_layout(ParallelDims(world=world, dp_shard=world, ep=1 if world == 2 else 2), world, "cpu")

    def load(args: ModelArgs, folder: Path, measure: bool) -> LoadStats:
        if layout is not None and layout.meshes is not None:
            model, _ = distributed_model(args, layout.dims, layout.meshes, torch.float32, torch.device("cpu"), 0)
            if measure:
                Path("/proc/self/clear_refs").write_text("5")
            return load_hf_sharded(model, folder)
        plain = build_model_from_args(args, seed=0)
        if measure:
            Path("/proc/self/clear_refs").write_text("5")
        return load_hf_into(plain, folder)

    load(_args(), Path(out) / "small", False)  # the same path on a small model first: every import and cache warm
    gc.collect()
    start = _status("VmRSS")  # the runtime (torch, gloo, the imports the load uses), before the model
    stats = load(ModelArgs(**SCALE), Path(out) / "scale", True)  # type: ignore[arg-type]
    peak = _status("VmHWM")
    (Path(out) / f"scale-{world}-{rank}.json").write_text(json.dumps(
        {"bytes": stats.bytes_read, "peak_over_runtime": peak - start}))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def scale(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, int]]]:
    from trex.trainer.hf import save_hf
    from trex.trainer.model.model import build_model_from_args

    out = tmp_path_factory.mktemp("scale")
    save_hf(build_model_from_args(_args(), seed=2), out / "small", layout="original", quant="fp8-fp4")
    save_hf(build_model_from_args(ModelArgs(**SCALE), seed=2), out / "scale", layout="original",  # type: ignore[arg-type]
            quant="fp8-fp4", max_shard_bytes=4 << 20)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    got = {}
    for world in (1, 2, 4):
        mp.spawn(_scale_worker, args=(world, str(out)), nprocs=world, join=True)  # type: ignore[attr-defined,no-untyped-call]
        got[world] = [json.loads((out / f"scale-{world}-{r}.json").read_text()) for r in range(world)]
    return got


@pytest.mark.slow
def test_bytes_read_and_peak_memory_fall_as_one_over_n(scale: dict[int, list[dict[str, int]]]) -> None:
    """At 2 (dp2) and 4 (dp2 x ep2) ranks each rank reads at most 1.15/N of what one process reads plus
    BYTES_CONSTANT, and its peak resident memory over the runtime's is at most 1.15/N of one process's plus
    RSS_CONSTANT."""
    one = scale[1][0]
    assert one["bytes"] > 10 << 20
    for world in (2, 4):
        for rank, r in enumerate(scale[world]):
            assert r["bytes"] <= 1.15 * one["bytes"] / world + BYTES_CONSTANT, (world, rank, r, one)
            assert r["peak_over_runtime"] <= 1.15 * one["peak_over_runtime"] / world + RSS_CONSTANT, (world, rank, r, one)
