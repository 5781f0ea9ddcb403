"""GRPO's frozen reference: distributed like the student at two ranks (spawn, gloo, float64), its log-probs equal the
single-process reference's to 1e-10; stored in the model dtype without gradients; not built when the KL is off."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from helpers.gloo import gloo_rank
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.model import build_model
from trex.trainer.parallel.mesh import ParallelDims
from trex.trainer.rl.objective import build_reference
from trex.trainer.rl.step import sampled_logprobs

LAYOUTS: dict[str, dict[str, int]] = {"dp2": {"dp": 2}, "tp2": {"tp": 2}, "ep2": {"ep": 2}, "dp2-hf": {"dp": 2}}
"""Name -> layout; "-hf": the reference's initial weights come from checkpoint.initFromHf (read by slice)."""


def _cfg(layout: dict[str, int] | None = None, kl: float = 0.05, dtype: str = "fp64",
         hf: Path | None = None) -> TrainerConfig:
    return load_section(TrainerConfig, {
        "mode": "grpo", "model": {"preset": "tiny", "dtype": dtype}, "parallelism": layout or {}, "seed": 7,
        "data": {"train": "prompts.jsonl", "tokenizer": {"vocabSize": 512}},
        "grpo": {"promptsPerStep": 2, "groupSize": 2, "klCoef": kl},
        "checkpoint": {"initFromHf": str(hf) if hf else None}})


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 512, (4, 10), generator=g)
    return ids, torch.roll(ids, -1, dims=1)


def _loss_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(12)
    mask = torch.ones(4, 10, dtype=torch.bool)
    mask[:, :4] = False
    mask[3, 6:] = False
    return {"mask": mask, "old": -torch.rand(4, 10, generator=g, dtype=torch.float64) * 6,
            "ref": -torch.rand(4, 10, generator=g, dtype=torch.float64) * 6,
            "adv": torch.tensor([1.0, -0.5, 0.25, -1.0], dtype=torch.float64)}


def _grpo_backward(model: Any, rows: slice, total: int) -> torch.Tensor:
    """The GRPO loss of ``rows`` of the batch through the fused, MTP-less path, weighted to the global token mean
    and back-propagated; returns the expert counts."""
    from trex.trainer.rl.grpo import grpo_loss

    ids, targets = _ids()
    x = _loss_inputs()
    out = model(ids[rows], logits=False, mtp=False)
    from trex.trainer.rl.step import output_logprobs

    logp = output_logprobs(out, targets[rows], 0.8)
    res = grpo_loss(logp, x["old"][rows], x["ref"][rows], x["adv"][rows], x["mask"][rows], kl_coef=0.05)
    (res.loss * (res.tokens / total)).backward()
    return out.expert_counts


def _student_grads(cfg: TrainerConfig, lay: Any, rank: int) -> dict[str, Any]:
    """Two backward passes of the GRPO loss over this rank's half of the batch on the FSDP2 student (a model with an
    MTP module its forward skips); the gradients gathered whole."""
    from trex.trainer.build import distributed_model

    model, _ = distributed_model(cfg.model.args, lay.dims, lay.meshes, torch.float64, torch.device("cpu"), cfg.seed)
    total = int(_loss_inputs()["mask"].sum())
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        counts = _grpo_backward(model, slice(2 * rank, 2 * rank + 2), total)
    grads = {k: None if p.grad is None else p.grad.full_tensor() for k, p in model.named_parameters()}
    return {"grads": grads, "rows": counts.shape[0]}


def _worker(rank: int, world: int, out: str) -> None:
    from trex.trainer.build import build_layout

    torch.set_num_threads(1)
    with gloo_rank(rank, world, f"{out}/rendezvous"):
        for name, layout in LAYOUTS.items():
            cfg = _cfg(layout, hf=Path(out, "hf") if name.endswith("-hf") else None)
            lay = build_layout(ParallelDims.from_config(cfg, world), world, "cpu")
            ref = build_reference(cfg, torch.device("cpu"), lay.dims, lay.meshes)
            assert ref is not None
            ids, targets = _ids()
            with torch.no_grad():
                lp = sampled_logprobs(ref, ids, targets, 0.8)
            local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in ref.parameters())
            whole = sum(p.numel() for p in ref.parameters())
            facts: dict[str, Any] = {
                "logp": lp.tolist(), "local": local, "whole": whole,
                "grad": any(p.requires_grad for p in ref.parameters()),
                "dtypes": sorted({str(p.dtype) for p in ref.parameters()})}
            Path(out, f"{name}-{rank}.json").write_text(json.dumps(facts))
            off = build_reference(_cfg(layout, kl=0.0), torch.device("cpu"), lay.dims, lay.meshes)
            assert off is None
            if name == "dp2":
                torch.save(_student_grads(cfg, lay, rank), Path(out, f"grads-{rank}.pt"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trex.trainer.hf import save_hf

    root = tmp_path_factory.mktemp("grpo-reference")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    save_hf(build_model(_cfg().model, dtype=torch.float64, seed=9), root / "hf")
    mp.spawn(_worker, args=(2, str(root)), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return root


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_distributed_reference_equals_the_single_process_one(layout: str, runs: Path) -> None:
    def logprobs(cfg: TrainerConfig) -> torch.Tensor:
        ref = build_reference(cfg, torch.device("cpu"), ParallelDims.from_config(cfg, 1), None)
        assert ref is not None
        ids, targets = _ids()
        with torch.no_grad():
            return torch.log_softmax(ref(ids).logits / 0.8, dim=-1).gather(-1, targets[..., None]).squeeze(-1)  # type: ignore[operator]

    hf = layout.endswith("-hf")
    want = logprobs(_cfg(hf=runs / "hf" if hf else None))
    if hf:  # the folder's weights, not the seed's
        assert (want - logprobs(_cfg())).abs().max() > 1e-3
    ref = build_model(_cfg().model, dtype=torch.float64)
    whole = sum(p.numel() for p in ref.parameters())
    for rank in range(2):
        got = json.loads(Path(runs, f"{layout}-{rank}.json").read_text())
        torch.testing.assert_close(torch.tensor(got["logp"], dtype=torch.float64), want, atol=1e-10, rtol=0)
        assert got["whole"] == whole and got["local"] < whole  # no rank holds the reference whole
        assert not got["grad"] and got["dtypes"] == ["torch.float64"]


def test_no_reference_without_a_kl_term_and_the_model_dtype_without_one() -> None:
    assert build_reference(_cfg(kl=0.0), torch.device("cpu"), ParallelDims.from_config(_cfg(), 1), None) is None
    ref = build_reference(_cfg(dtype="bf16"), torch.device("cpu"), ParallelDims.from_config(_cfg(), 1), None)
    assert ref is not None
    assert {p.dtype for p in ref.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in ref.parameters()) and not ref.training


def test_grpo_gradients_at_two_ranks_equal_one_process(runs: Path) -> None:
    """dp2 (FSDP2) with an MTP module the RL forward skips: after two backward passes the summed gradients equal the
    single-process gradients of the whole batch to 1e-10; the MTP parameters get none."""
    cfg = _cfg()
    model = build_model(cfg.model, device="cpu", dtype=torch.float64, seed=cfg.seed)
    assert model.args.mtp_depth == 1
    total = int(_loss_inputs()["mask"].sum())
    counts = _grpo_backward(model, slice(0, 4), total)
    for rank in range(2):
        got = torch.load(Path(runs, f"grads-{rank}.pt"))
        assert got["rows"] == counts.shape[0] == model.args.n_moe_layers
        for k, p in model.named_parameters():
            if k.startswith("mtp."):
                assert p.grad is None and got["grads"][k] is None, k
                continue
            assert p.grad is not None, k
            torch.testing.assert_close(got["grads"][k], p.grad, atol=1e-10, rtol=0, msg=k)
