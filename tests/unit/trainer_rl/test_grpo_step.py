"""mode grpo's pieces: the prompts a step draws, prompt tokens identical to the SFT samples', packing aligned with
the rollout's behaviour log-probs, and the config rules `trex validate` applies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trex.prompt_contract import training_messages
from trex.text.chat import encode_chat
from trex.text.tokenizer import load_or_train
from trex.trainer.config import TrainerConfig
from trex.trainer.data.sources import DataError
from trex.trainer.rl.grpo import token_logprobs
from trex.trainer.rl.prompts import PromptOrder, load_items, prompt_tokens
from trex.trainer.rl.step import GRPORun, pack, response_text, stop_tokens_of
from trex.trainer.rollout.engine import Rollout, generate
from trex.trainer.rollout.sampling import SamplingParams
from trex.trainer.rules import job_problems
from trex.verify.items import Item, Truth

QUESTIONS = [f"Maximize {k}x subject to x <= {k + 2} and x >= 0." for k in range(6)]


def _tok(tmp_path: Path):  # type: ignore[no-untyped-def]
    texts = [m["content"] for q in QUESTIONS for m in training_messages(q, "```python\nprint(1)\n```")]
    return load_or_train(None, texts * 4, 400, tmp_path / "tok", "grpo-test")


def test_prompt_order_is_a_pure_function_of_the_step_covering_each_epoch() -> None:
    order = PromptOrder(count=7, seed=3)
    steps = [order.at(s, 3) for s in range(7)]  # 21 draws = 3 epochs of 7
    flat = [i for s in steps for i in s]
    for e in range(3):
        assert sorted(flat[7 * e:7 * e + 7]) == list(range(7))  # every epoch is a permutation
    assert flat[:7] != flat[7:14]  # epochs reshuffle
    assert PromptOrder(7, 3).at(5, 3) == steps[5]  # no state: a resumed run draws the same prompts
    assert PromptOrder(7, 4).at(0, 7) != steps[0] + steps[1][:4]
    with pytest.raises(ValueError, match="per_step"):
        order.at(0, 0)


def test_load_items_reads_ordata_prompts_and_names_bad_input(tmp_path: Path) -> None:
    good = tmp_path / "prompts-00000.jsonl"
    good.write_text("".join(json.dumps({"id": f"q{i}", "question": q, "answer": i}) + "\n"
                            for i, q in enumerate(QUESTIONS)))
    items = load_items(str(tmp_path / "prompts-*.jsonl"), "ordata")
    assert [it.id for it in items] == [f"q{i}" for i in range(6)] and items[2].truth is not None
    assert items[2].truth.value == 2.0
    dup = tmp_path / "prompts-00001.jsonl"
    dup.write_text(json.dumps({"id": "q0", "question": "again", "answer": 1}) + "\n")
    with pytest.raises(DataError, match="item id 'q0' occurs more than once"):
        load_items(str(tmp_path / "prompts-*.jsonl"), "ordata")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "question": "no truth"}) + "\n")
    with pytest.raises(DataError, match="answer"):
        load_items(str(bad), "ordata")
    with pytest.raises(DataError, match="does not exist"):
        load_items(str(tmp_path / "missing.jsonl"), "ordata")


def test_prompt_tokens_equal_the_sft_samples_up_to_the_assistant_answer(tmp_path: Path) -> None:
    """The tokens a GRPO rollout continues from are exactly those an SFT sample of the same problem holds before its
    first answer token (one prompt contract for SFT, GRPO and `trex eval`)."""
    tok = _tok(tmp_path)
    items = [Item(id=f"q{i}", question=q, truth=Truth("optimal", 1.0, "1")) for i, q in enumerate(QUESTIONS)]
    run = GRPORun(_grpo(), tok, items, verifier=None, wal_dir=tmp_path)  # type: ignore[arg-type]  # the defaults
    for i, q in enumerate(QUESTIONS[:3]):
        sample = encode_chat(tok, training_messages(q, "```python\nprint(1)\n```"))  # ORData's SFT record
        first_target = int(sample.mask.argmax())
        assert run.prompt(i) == sample.ids[:first_target].tolist()
    other = prompt_tokens(tok, items[0], "ordata", "sirl", None, None)  # a published framing is another prompt
    assert other != run.prompt(0)


def _rollout(prompt: list[int], tokens: list[int], version: int = 0) -> Rollout:
    return Rollout(sample_id=0, prompt=prompt, tokens=tokens, logprobs=[-0.5 - i for i in range(len(tokens))],
                   versions=[version] * len(tokens), policy_version=1)


def test_pack_aligns_targets_logprobs_and_masks() -> None:
    rows = [_rollout([5, 6, 7], [8, 9]), _rollout([5], [4, 3, 2], version=1), _rollout([1, 2], [])]
    b = pack(rows, pad=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 4, 3, 2, 0], [1, 2, 0, 0, 0]]
    # position t predicts token t + 1: the response's first token is predicted at the prompt's last position
    assert b.targets.tolist() == [[0, 0, 8, 9, 0], [4, 3, 2, 0, 0], [0, 0, 0, 0, 0]]
    assert b.mask.tolist() == [[False, False, True, True, False], [True, True, True, False, False], [False] * 5]
    assert b.old_logp[0, 2:4].tolist() == [-0.5, -1.5] and b.old_logp[1, :3].tolist() == [-0.5, -1.5, -2.5]
    assert b.stale.tolist()[0] == [False, False, True, True, False] and not b.stale[1].any()


def test_loss_logprobs_of_the_unchanged_policy_equal_the_behaviour_logprobs(tmp_path: Path) -> None:
    """On-policy the importance ratio is 1: the loss side's log-probs of the sampled tokens (packed, padded, at the
    sampling temperature) equal what the rollout engine recorded while decoding with the KV cache."""
    from trex.trainer.config import ModelConfig
    from trex.trainer.model import build_model

    model = build_model(ModelConfig(preset="tiny", dtype="fp64"), device="cpu", dtype=torch.float64, seed=5)
    params = SamplingParams(temperature=0.7, max_new_tokens=6, stop_tokens=(3,))
    prompts = [[7, 8, 9, 10], [7, 8, 9, 10], [11, 12]]
    rollouts = generate(model, prompts, params, seed=2)
    b = pack(rollouts, pad=0)
    logp = token_logprobs(model(b.input_ids).logits / params.temperature, b.targets)
    assert torch.allclose(logp[b.mask], b.old_logp[b.mask], atol=1e-9)
    assert int(b.mask.sum()) == sum(len(r.tokens) for r in rollouts) > 6


def test_response_text_drops_the_stop_token(tmp_path: Path) -> None:
    tok = _tok(tmp_path)
    stops = stop_tokens_of(tok)
    assert len(stops) == 2
    body = tok.encode("print(1)", add_special_tokens=False).ids
    assert response_text(tok, _rollout([1], [*body, stops[0]]), stops) == "print(1)"
    assert response_text(tok, _rollout([1], body), stops) == "print(1)"


def _grpo(**extra: object) -> TrainerConfig:
    base: dict[str, object] = {"mode": "grpo", "model": {"preset": "tiny"}, "data": {"train": "p.jsonl"}}
    return TrainerConfig.model_validate({**base, **extra})


def test_validate_refuses_what_grpo_cannot_run_naming_the_field() -> None:
    assert job_problems(_grpo(), 1) == []
    assert job_problems(_grpo(parallelism={"dp": 2}), 2) == []  # FSDP2 units gathered per data-parallel rank
    assert job_problems(_grpo(parallelism={"ep": 2}), 2) == []  # decoded on a whole replica
    assert job_problems(_grpo(parallelism={"tp": 2}, data={"train": "p.jsonl", "microBatchSize": 2}), 2) == []
    (field, msg), = job_problems(_grpo(parallelism={"tp": 2}, data={"train": "p.jsonl", "microBatchSize": 2},
                                       grpo={"promptsPerStep": 1, "groupSize": 3}), 2)
    assert field == "grpo.groupSize" and "groupSize = 3 responses, not a multiple of tp=2" in msg
    with pytest.raises(ValueError, match="protocol: unknown 'nope'"):
        _grpo(grpo={"protocol": "nope"})
    with pytest.raises(ValueError, match="promptFormat: unknown 'bench4opt'"):
        _grpo(grpo={"promptFormat": "bench4opt"})
    with pytest.raises(ValueError, match="promptSet: unknown"):
        _grpo(grpo={"promptSet": "x"})
    with pytest.raises(ValueError, match="groupSize"):
        _grpo(grpo={"groupSize": 1})


def test_trainer_config_rules_need_prompts_and_whole_groups_per_rank() -> None:
    from trex.trainer.rules import local_problems as config_problems

    cfg = TrainerConfig.model_validate({"mode": "grpo", "model": {"preset": "tiny"}})
    assert ("data.train", "mode 'grpo' needs prompts with ground truths: an ORDataJob's prompts rendering "
            "(dataFrom) or a benchmark file") in config_problems(cfg)
    odd = _grpo(grpo={"promptsPerStep": 3})
    assert any(f == "grpo.promptsPerStep" for f, _ in job_problems(odd, 2))  # the rule validate applies
    assert not any(f == "data.globalBatchSize" for f, _ in config_problems(odd, dp=2))
