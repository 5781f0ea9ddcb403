"""GRPO learns a small task end to end on 2 CPU cores: after a short SFT that teaches the answer's format but
prints a random digit, `mode: grpo` (initialised from the SFT run's Hugging Face export, with its tokenizer)
raises the mean reward from about 0.1 to at least 0.5. The reward is 1 when the program, run in the sandbox,
prints the number the prompt states."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from trex.config_base import load_section
from trex.prompt_contract import training_messages
from trex.sandbox import Limits, run_python_async
from trex.trainer.config import TrainerConfig
from trex.trainer.export import export_hf
from trex.trainer.loop import Trainer
from trex.trainer.rl.reward import Reward
from trex.verify.extract import extract_code
from trex.verify.items import Item

NUMBERS = (7,)
SFT_STEPS, GRPO_STEPS = 60, 30


class PrintsTheNumber:
    """Reward 1 when the answer's program exits 0 in the sandbox and prints the prompt's number, else 0."""

    async def score(self, completions: Sequence[str], items: Sequence[Item]) -> list[Reward]:
        sem = asyncio.Semaphore(2)

        async def one(text: str, item: Item) -> Reward:
            code, _ = extract_code(text)
            if code is None:
                return Reward(0.0, 0.0, 0.0, 0.0, "no_code", "no python block")
            async with sem:
                res = await run_python_async(code, limits=Limits(timeout_s=10, cpu_s=10, memory_mb=1024,
                                                                 max_output_kb=64))
            assert item.truth is not None and item.truth.value is not None
            ok = res.exit_code == 0 and res.stdout.strip() == str(int(item.truth.value))
            return Reward(float(ok), 1.0, float(res.exit_code == 0), float(ok),
                          "correct" if ok else "wrong_objective", "")

        return list(await asyncio.gather(*(one(t, i) for t, i in zip(completions, items, strict=True))))


def _question(n: int) -> str:
    return f"Print the number {n}."


BASE = {"model": {"preset": "tiny", "overrides": {"mtpDepth": 0}}, "device": "cpu", "stability": {"enabled": False}}


@pytest.mark.timeout(900)
def test_grpo_raises_the_reward_of_a_learnable_task(tmp_path: Path) -> None:
    rng = random.Random(0)
    sft_data = tmp_path / "sft.jsonl"
    with sft_data.open("w") as f:  # the format, with a digit unrelated to the prompt's
        for _ in range(400):
            messages = training_messages(_question(rng.randrange(10)), f"```python\nprint({rng.randrange(10)})\n```")
            f.write(json.dumps({"messages": messages}) + "\n")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"n{n}", "question": _question(n), "answer": n}) + "\n"
                               for n in NUMBERS))
    sft_cfg = load_section(TrainerConfig, {
        **BASE, "mode": "sft", "maxSteps": SFT_STEPS,
        "optimizer": {"schedule": {"warmupSteps": 0, "decay": "none"}},
        "data": {"train": str(sft_data), "seqLen": 256, "microBatchSize": 16, "globalBatchSize": 16,
                 "tokenizer": {"vocabSize": 512}},
        "checkpoint": {"dir": str(tmp_path / "sft"), "intervalSteps": 1000}})
    sft = Trainer(sft_cfg, tmp_path, measure_peak=False, log=lambda _m: None)
    sft.run()
    hf = export_hf(sft.model, sft.tokenizer, tmp_path / "sft" / "hf")

    grpo_cfg = load_section(TrainerConfig, {
        **BASE, "mode": "grpo", "maxSteps": GRPO_STEPS,
        # Muon and AdamW normalise their steps: a sparse, noisy policy gradient needs small learning rates and a
        # warmup (an unwarmed first AdamW step moves every embedding and head weight by the full rate)
        "optimizer": {"schedule": {"warmupSteps": 5, "decay": "none"}, "muon": {"lr": 0.001}, "adamw": {"lr": 0.002}},
        "data": {"train": str(prompts), "microBatchSize": 32, "tokenizer": {"path": str(Path(hf) / "tokenizer.json")}},
        "grpo": {"promptsPerStep": 4, "groupSize": 8, "maxNewTokens": 12, "klCoef": 0.0},
        "checkpoint": {"dir": str(tmp_path / "grpo"), "intervalSteps": 1000, "initFromHf": str(hf),
                       "exportHf": False}})
    grpo = Trainer(grpo_cfg, tmp_path, measure_peak=False, log=lambda _m: None, verifier=PrintsTheNumber())
    res = grpo.run()
    rewards = [r.stats.reward_mean for r in res.history]  # type: ignore[union-attr]
    start, end = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    assert start < 0.25, rewards  # about one digit in ten is right before RL
    assert end >= 0.5, rewards
