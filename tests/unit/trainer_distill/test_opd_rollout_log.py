"""Mode opd logs its rollouts per step as mode grpo does (trex.trainer.rollout.steplog): a trainer preempted in the
middle of a step's rollouts and restarted from its checkpoint reads the step's log back and continues each sample from
what it holds; its tokens, log-probs and loss equal an uninterrupted run's (fp64, fixed seeds), and only the current
step's log is kept. Tokens a log holds from an older policy version are stale: context, not scored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.hf import save_hf
from trex.trainer.loop import Trainer
from trex.trainer.model import build_model
from trex.trainer.rollout.engine import generate
from trex.trainer.rollout.wal import RECORD_SIZE, group_records, read_log

MODEL = {"preset": "tiny", "dtype": "fp64", "overrides": {"numLayers": 1, "mtpDepth": 0, "maxSeqLen": 512}}
PROMPTS = ["minimise the cost of a diet", "a diet with three foods", "pack items of value", "the optimal value is"]
BUDGET, CUT_AFTER = 24, 7
"""Response tokens per sample, and the decode steps the preempted rollout runs before it is cut."""


class Preempted(Exception):
    """The trainer's process going away in the middle of a rollout."""


def _cfg(root: Path, teacher: Path) -> TrainerConfig:
    root.mkdir(parents=True, exist_ok=True)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "question": q, "answer": float(i)}) + "\n"
                               for i, q in enumerate(PROMPTS)))
    return load_section(TrainerConfig, {
        "mode": "opd", "model": MODEL, "maxSteps": 3, "deterministic": True,
        "optimizer": {"schedule": {"warmupSteps": 0}, "adamw": {"lr": 0.01}},
        "data": {"train": str(prompts)},
        "opd": {"teachers": [{"path": str(teacher)}], "promptsPerStep": 2, "samplesPerPrompt": 2,
                "sampling": {"maxNewTokens": BUDGET, "temperature": 1.3}, "chunkSize": 16},
        "checkpoint": {"dir": str(root / "ckpt"), "intervalSteps": 2, "exportHf": False},
    })


def _trainer(cfg: TrainerConfig, root: Path) -> Trainer:
    return Trainer(cfg, root, measure_peak=False, log=lambda _m: None)


def _samples(path: Path) -> dict[int, tuple[list[int], list[float]]]:
    """Tokens and log-probs per sample id that a rollout log holds (read by the log's own parser)."""
    _, records, _ = read_log(path.read_bytes(), path)
    return {sid: (s.tokens, s.logprobs) for sid, s in group_records(records, path).items()}


def test_a_restarted_opd_trainer_continues_the_step_from_its_rollout_log(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    teacher = tmp_path / "teacher"
    save_hf(build_model(load_section(TrainerConfig, {"model": MODEL}).model, seed=7), teacher)
    log_name = "step-00000002-rank-00000.wal"

    whole = _trainer(_cfg(tmp_path / "whole", teacher), tmp_path / "whole").run()
    logs = tmp_path / "whole" / "ckpt" / "rollouts"
    assert sorted(p.name for p in logs.iterdir()) == [log_name]  # steps 0 and 1's logs were removed
    want = _samples(logs / log_name)
    assert len(want) == 4 and all(len(t) > CUT_AFTER for t, _ in want.values())

    cfg = _cfg(tmp_path / "parts", teacher)
    _trainer(cfg, tmp_path / "parts").run(2)  # checkpointed after step 1
    cut_log = tmp_path / "parts" / "ckpt" / "rollouts" / log_name

    def preempted(*args: Any, **kw: Any) -> Any:
        def stop(step: int) -> None:
            if step == CUT_AFTER:
                raise Preempted
        return generate(*args, **kw, on_step=stop)

    with monkeypatch.context() as m:
        m.setattr("trex.trainer.distill.run.generate", preempted)
        cut = _trainer(cfg, tmp_path / "parts")
        with pytest.raises(Preempted):
            cut.run()
        cut.objective.close()
    at_cut = cut_log.read_bytes()
    held = _samples(cut_log)
    logged = sum(len(t) for t, _ in held.values())
    assert len(held) == 4 and logged == 4 * CUT_AFTER  # part of the step, every sample inside its response
    stale = cut_log.with_name("step-00000001-rank-00000.wal")
    stale.write_bytes(at_cut)  # a log of another step: the rerun removes it

    again = _trainer(cfg, tmp_path / "parts")
    rest = again.run()
    assert again.step == 3 and len(rest.history) == 1
    got = _samples(cut_log)
    assert {k: t for k, (t, _) in got.items()} == {k: t for k, (t, _) in want.items()}
    for k, (_, lps) in got.items():
        assert lps == pytest.approx(want[k][1], abs=1e-10)  # re-prefilled logits differ only by rounding
    assert rest.history[0].metrics["opd_resumed_tokens"] == logged
    assert whole.history[2].metrics["opd_resumed_tokens"] == 0
    assert rest.history[0].loss == whole.history[2].loss
    final = cut_log.read_bytes()
    assert final[:len(at_cut)] == at_cut and len(final) - len(at_cut) == RECORD_SIZE * (
        sum(len(t) for t, _ in want.values()) - logged)  # appended to, not rewritten
    assert not stale.exists()
    a, b = whole.history[2], rest.history[0]
    assert a.parts == b.parts
    assert torch.equal(torch.tensor(a.grad_norm), torch.tensor(b.grad_norm))


def test_stale_tokens_are_context_but_not_scored() -> None:
    """A rollout whose first two tokens were sampled under an older policy version (logged before a push): they stay
    in the sequence, only the newer tokens are scored (as GRPO's loss masks stale tokens)."""
    from trex.trainer.distill.opd import pack
    from trex.trainer.rollout.engine import Rollout

    r = Rollout(sample_id=0, prompt=[5, 6], tokens=[7, 8, 9, 10], logprobs=[-1.0] * 4, versions=[1, 1, 2, 2],
                policy_version=2)
    fresh = Rollout(sample_id=1, prompt=[5], tokens=[11, 12], logprobs=[-1.0] * 2, versions=[2, 2], policy_version=2)
    b = pack([r, fresh], [["t"], ["t"]], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9, 10], [5, 11, 12, 0, 0, 0]]
    assert b.mask.tolist() == [[False, False, False, True, True, False], [True, True, False, False, False, False]]
    assert b.tokens == 4
