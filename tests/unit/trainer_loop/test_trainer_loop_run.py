"""The training loop end to end on the tiny preset: learning, bit-identical resume, NaN guard, metrics."""

from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer, TrainResult


def tiny_cfg(tmp: Path, **over: Any) -> TrainerConfig:
    data: dict[str, Any] = {
        "model": {"preset": "tiny"},
        "maxSteps": 8,
        "data": {"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 4},
        "optimizer": {"schedule": {"warmupSteps": 2}, "batchRamp": [{"step": 0, "globalBatchSize": 2},
                                                                    {"step": 3, "globalBatchSize": 4}]},
        "stability": {"warmupSteps": 2, "window": 4, "zThreshold": 0.3, "cooldownSteps": 1,
                      "anticipatoryDelta": 2, "anticipatoryWindow": 3},
        "checkpoint": {"dir": str(tmp / "ckpt"), "intervalSteps": 3, "keepLast": 5},
    }
    data.update(over)
    return load_section(TrainerConfig, data)


def _run(cfg: TrainerConfig, out: Path, steps: int) -> tuple[Trainer, TrainResult]:
    tr = Trainer(cfg, out, measure_peak=False, log=lambda _m: None)
    return tr, tr.run(steps)


def _losses(res: TrainResult) -> list[float]:
    return [r.loss for r in res.history]


def _spiky(tmp: Path) -> TrainerConfig:
    """A too-high AdamW LR makes the loss jump (once, at step 3, from this seed's initial weights), so
    anticipatory routing spans the checkpoints."""
    return tiny_cfg(tmp, seed=2, optimizer={"adamw": {"lr": 0.3}, "schedule": {"warmupSteps": 0},
                                    "batchRamp": [{"step": 0, "globalBatchSize": 2}, {"step": 3, "globalBatchSize": 4}]})


def test_resume_is_bit_identical_and_truncation_falls_back(tmp_path: Path) -> None:
    ref_tr, ref = _run(_spiky(tmp_path / "a"), tmp_path / "a", 8)
    ref_losses = _losses(ref)
    ref_state = {k: v.clone() for k, v in ref_tr.model.state_dict().items()}
    assert ref.spikes == 1 and [r.anticipatory for r in ref.history] == [False] * 3 + [True] * 3 + [False] * 2

    cfg = _spiky(tmp_path / "b")
    first, res_a = _run(cfg, tmp_path / "b", 4)  # checkpoints at 3 and 4 (final)
    assert res_a.last_checkpoint == 4
    del first
    second, res_b = _run(cfg, tmp_path / "b", 8)
    assert _losses(res_a) + _losses(res_b) == ref_losses
    for k, v in second.model.state_dict().items():
        assert torch.equal(v, ref_state[k]), k
    assert second.spikes == ref_tr.spikes and second.tokens_seen == ref_tr.tokens_seen

    # A truncated newest checkpoint: the next run resumes from the previous one and still matches.
    shard = next((tmp_path / "b" / "ckpt" / "step-00000008").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    third = Trainer(cfg, tmp_path / "b", measure_peak=False, log=lambda _m: None)
    assert third.resume() and third.step == 6
    losses_c = [third.train_step().loss for _ in range(2)]
    assert losses_c == ref_losses[6:]


def test_nan_guard_skips_update_and_bias(tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path, stability={"enabled": False})
    tr = Trainer(cfg, tmp_path, measure_peak=False, log=lambda _m: None)
    tr.train_step()
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    adamw = tr.opts.adamw
    assert adamw is not None
    head = dict(tr.model.named_parameters())["lm_head.weight"]
    moments = {k: v.clone() for k, v in adamw.state[head].items()}

    def poison(_m: Any, _i: Any, out: Any) -> Any:
        out.hidden = out.hidden * float("nan")  # the loop asks for hidden states (fused head + loss)
        return out

    handle = tr.model.register_forward_hook(poison)
    rec = tr.train_step()
    handle.remove()
    assert rec.skipped and tr.skipped == 1 and math.isnan(rec.loss)
    for k, v in tr.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    for k, v in adamw.state[head].items():
        assert torch.equal(v, moments[k]), k
    assert all(p.grad is None for p in tr.model.parameters())
    rec = tr.train_step()
    assert not rec.skipped and math.isfinite(rec.loss)
    assert not torch.equal(tr.model.state_dict()["lm_head.weight"], before["lm_head.weight"])


def test_metrics_endpoint_and_jsonl(tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path, maxSteps=2, data={"seqLen": 32, "microBatchSize": 2, "globalBatchSize": 4,
                                               "seqLenCurriculum": [{"step": 1, "seqLen": 16}]})
    tr = Trainer(cfg, tmp_path, measure_peak=False, log=lambda _m: None, metrics_port=0)
    tr.run(2)
    assert tr.telemetry is not None
    port = tr.telemetry.exporter.port
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    mfu_lines = [ln for ln in body.splitlines() if ln.startswith("trex_train_mfu{")]
    assert mfu_lines and 'flops_convention="6N_active+attn_causal"' in mfu_lines[0] and 'device="cpu:' in mfu_lines[0]
    assert float(mfu_lines[0].rsplit(" ", 1)[1]) > 0
    assert 'trex_train_last_checkpoint_step{job_name="local"} 2.0' in body
    assert 'source="measured-gemm-fp32:cpu-quick"' in body
    lines = (tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    assert [r["global_batch"] for r in recs] == [2, 2]  # batch ramp: 2 sequences until step 3
    assert [r["seq_len"] for r in recs] == [32, 16]  # curriculum: 16 tokens from step 1
    assert [r["tokens"] for r in recs] == [64, 32]


@pytest.mark.slow
def test_tiny_model_learns_without_nan(tmp_path: Path) -> None:
    cfg = tiny_cfg(tmp_path, maxSteps=200, optimizer={"schedule": {"warmupSteps": 10}},
                   stability={"enabled": True}, checkpoint={"dir": str(tmp_path / "c"), "intervalSteps": 1000},
                   data={"seqLen": 64, "microBatchSize": 4, "globalBatchSize": 4})
    tr = Trainer(cfg, tmp_path, measure_peak=False, log=lambda _m: None)
    res = tr.run(200)
    losses = [r.loss for r in res.history]
    assert len(losses) == 200 and all(math.isfinite(x) for x in losses) and res.skipped_steps == 0
    first, last = sum(losses[:5]) / 5, sum(losses[-20:]) / 20
    assert first > 5.5  # ~ln(vocab) at initialisation
    assert last < 0.55 * first, (first, last)


def test_resume_takes_hyperparameters_from_the_current_config(tmp_path: Path) -> None:
    _run(tiny_cfg(tmp_path, maxSteps=3), tmp_path, 3)
    changed = tiny_cfg(tmp_path, maxSteps=3, optimizer={"adamw": {"lr": 5e-4, "weightDecay": 0.0},
                                                        "muon": {"momentum": 0.9}})
    tr = Trainer(changed, tmp_path, measure_peak=False, log=lambda _m: None)
    assert tr.resume() and tr.step == 3
    assert tr.opts.adamw is not None and tr.opts.muon is not None
    g = tr.opts.adamw.param_groups[0]
    assert g["initial_lr"] == 5e-4 and g["weight_decay"] == 0.0
    assert tr.opts.muon.param_groups[0]["momentum"] == 0.9
    assert any(len(s) for s in tr.opts.adamw.state.values())  # moments restored


def test_accumulated_loss_is_token_weighted_like_one_big_batch(tmp_path: Path) -> None:
    """Two SFT micro-batches with different numbers of loss tokens: the step's LM loss equals the masked mean
    over one forward of both rows, not the plain mean of the two micro-batch means."""
    from trex.trainer.data.loader import SampleLoader
    from trex.trainer.model import compute_loss

    rows = [{"messages": [{"role": "user", "content": "q " * (1 + i % 7)},
                          {"role": "assistant", "content": "answer " * (1 + (3 * i) % 11)}]} for i in range(40)]
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tiny_cfg(tmp_path, mode="sft", stability={"enabled": False},
                   data={"train": str(data), "seqLen": 24, "microBatchSize": 1, "globalBatchSize": 2,
                         "tokenizer": {"vocabSize": 300}})
    tr = Trainer(cfg, tmp_path, measure_peak=False, log=lambda _m: None)
    assert isinstance(tr.objective.loader, SampleLoader)
    whole = SampleLoader(tr.objective.loader.docs, tr.objective.loader.seed, tr.objective.loader.pad_id).next_batch(2, 24)
    per_row = [float(x) for x in whole["loss_mask"].sum(1)]
    assert per_row[0] != per_row[1] and min(per_row) > 0
    with torch.no_grad():
        out = tr.model(whole["input_ids"], whole["position_ids"], whole["doc_ids"])
        _, parts = compute_loss(out, whole["labels"], whole["loss_mask"], cfg.routing, 0)
        row_lm = [compute_loss(tr.model(*(whole[k][i:i + 1] for k in ("input_ids", "position_ids", "doc_ids"))),
                               whole["labels"][i:i + 1], whole["loss_mask"][i:i + 1], cfg.routing, 0)[1]["lm"]
                  for i in range(2)]
    rec = tr.train_step()
    assert rec.parts["lm"] == pytest.approx(parts["lm"], rel=1e-5)
    assert rec.loss == pytest.approx(sum(r * n for r, n in zip(row_lm, per_row, strict=True)) / sum(per_row), rel=1e-5)
    assert abs(rec.loss - sum(row_lm) / 2) > 1e-4
