"""The OR loop through the quickstart's own settings: one prompt contract from ORData to training to
evaluation (token for token), whole-sample SFT packing, the oracle at the EvalJob's budget, and the
length-budget rules of `trex validate` on the quickstart job graph."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from trex.config_base import load_section
from trex.evaluation.benchmarks import load_benchmark
from trex.evaluation.models.transformers_model import render_chat
from trex.evaluation.oracle import oracle_pass_at_1
from trex.evaluation.prompts import build_messages
from trex.ordata.config import ORDataConfig
from trex.ordata.pipeline import PROMPT_RECORD, heldout_record, merge, run_shard
from trex.prompt_contract import prompt_messages
from trex.trainer.config import DataConfig, ModelConfig, resolved_model_values
from trex.trainer.data.build import build_data
from trex.trainer.data.packing import first_target, policy_counts
from trex.trainer.export import save_tokenizer
from trex_operator.budgets import budget_problems
from trex_operator.validate import check_document

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "examples" / "quickstart"


def _doc(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((QUICKSTART / name).read_text())
    return data


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The quickstart ORData job run locally (its count capped at 32 to keep the test short), and the tokenizer
    and SFT loader its TrainJob builds."""
    out = tmp_path_factory.mktemp("quickstart")
    spec = _doc("ordatajob.yaml")["spec"]["ordata"]
    cfg = load_section(ORDataConfig, {**spec, "count": min(spec["count"], 32), "output": str(out)})
    for i in range(cfg.shards.num_shards):
        run_shard(cfg, i, cfg.shards.num_shards, out, show_progress=False)
    manifest = merge(out)
    trainer = _doc("trainjob.yaml")["spec"]["trainer"]
    data = load_section(DataConfig, {**trainer["data"], "train": str(out / "merged")})
    model_vocab = int(str(resolved_model_values(load_section(ModelConfig, trainer["model"]))["vocab_size"]))
    tok, loader, fmt = build_data(data, out / "tokenizer", model_vocab)
    hf_dir = out / "hf"
    hf_dir.mkdir()
    save_tokenizer(tok, hf_dir, int(data.seq_len))
    return {"out": out, "manifest": manifest, "tok": tok, "loader": loader, "fmt": fmt, "data": data, "hf": hf_dir}


def test_training_prompt_equals_eval_prompt_token_for_token(loop: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(loop["hf"])
    records = [json.loads(line) for f in sorted((loop["out"] / "merged").glob("sft-*.jsonl"))
               for line in f.read_text().splitlines()]
    assert loop["manifest"]["prompt_contract"] == PROMPT_RECORD
    items = {it.id: it for it in load_benchmark("ordata", _items_file(loop["out"], records)).items}
    for rec, doc in zip(records, loop["loader"].docs, strict=True):
        # what the trainer sees up to (and including) the assistant opener ...
        trained = doc.ids[:first_target(doc)].tolist()
        # ... and what `trex eval` sends through the exported chat template, for the same problem
        msgs = build_messages(items[rec["id"]], "strict", "ordata")
        sent = hf(render_chat(hf, msgs), add_special_tokens=False)["input_ids"]
        assert sent == trained, rec["id"]
        assert msgs == rec["messages"][:2]
    # the held-out items (never trained on) get the same contract
    held = load_benchmark("ordata", loop["out"] / "heldout" / "heldout.jsonl").items
    assert held and all(build_messages(it, "strict", "ordata") == prompt_messages(it.question) for it in held)


def _items_file(out: Path, records: list[dict[str, Any]]) -> Path:
    path = out / "trained-items.jsonl"
    path.write_text("".join(json.dumps(heldout_record(r)) + "\n" for r in records))
    return path


def test_quickstart_packs_every_sample_whole(loop: dict[str, Any]) -> None:
    assert loop["fmt"] == "chat"
    counts = policy_counts(loop["loader"].docs, loop["data"].seq_len)
    assert counts == {"whole": len(loop["loader"].docs), "truncated": 0, "dropped": 0}


def test_oracle_scores_100_percent_at_the_quickstart_budget(loop: dict[str, Any], tmp_path: Path) -> None:
    ev = _doc("evaljob.yaml")["spec"]["evaluation"]
    budget = ev["model"]["sampling"]["maxTokens"]
    limit = ev["benchmarks"][0]["limit"]
    held = loop["out"] / "heldout" / "heldout.jsonl"
    score, n = oracle_pass_at_1(held, loop["hf"] / "tokenizer.json", budget, tmp_path / "fit", limit)
    assert n == min(limit, len(held.read_text().splitlines())) and n > 0
    assert score == 1.0
    # the old budget of 512 tokens cuts every correct answer: the check can fail
    cut, _ = oracle_pass_at_1(held, loop["hf"] / "tokenizer.json", 512, tmp_path / "cut", limit)
    assert cut < 0.5


def _graph(ev_tokens: int | None = None, seq_len: int | None = None, max_pos: int | None = None,
           grpo_tokens: int | None = None) -> list[str]:
    docs = [_doc("ordatajob.yaml"), _doc("trainjob.yaml"), _doc("evaljob.yaml"), _doc("trainjob-grpo.yaml")]
    docs = copy.deepcopy(docs)
    if grpo_tokens is not None:
        docs[3]["spec"]["trainer"]["grpo"]["maxNewTokens"] = grpo_tokens
    if ev_tokens is not None:
        docs[2]["spec"]["evaluation"]["model"]["sampling"]["maxTokens"] = ev_tokens
    if seq_len is not None:
        docs[1]["spec"]["trainer"]["data"]["seqLen"] = seq_len
    if max_pos is not None:
        docs[1]["spec"]["trainer"]["model"]["overrides"]["maxSeqLen"] = max_pos
        docs[1]["spec"]["trainer"]["data"]["seqLen"] = min(max_pos, docs[1]["spec"]["trainer"]["data"]["seqLen"])
    checked = [check_document(f"f{i}.yaml", 0, d) for i, d in enumerate(docs)]
    assert all(not c.problems for c in checked), [p.line() for c in checked for p in c.problems]
    return [p.line() for p in budget_problems(checked)]


def test_validate_rejects_budgets_that_cannot_hold_the_samples() -> None:
    assert _graph() == []
    (line,) = _graph(ev_tokens=512)
    assert "EvalJob/quickstart-eval: spec.evaluation.model.sampling.maxTokens: 512 is below" in line
    assert "reference answers" in line
    (line,) = _graph(seq_len=256)
    assert "TrainJob/quickstart-train: spec.trainer.data.seqLen: 256:" in line and "median" in line
    (line,) = _graph(max_pos=512)
    assert "spec.trainer.model.overrides.maxSeqLen: 512:" in line
    (line,) = _graph(grpo_tokens=256)  # GRPO responses cut short of any reference answer never earn the objective
    assert "TrainJob/quickstart-grpo: spec.trainer.grpo.maxNewTokens: 256 is below" in line
    assert "TrainJob/quickstart-train's tokenizer" in line


def test_demo_prints_the_oracle_check_from_the_jobs_outputs(loop: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    from trex_operator.demo import local_output, oracle_lines

    docs = [_doc("ordatajob.yaml"), _doc("trainjob.yaml"), _doc("evaljob.yaml")]
    data, ckpt = local_output(docs[0], tmp_path), local_output(docs[1], tmp_path)
    assert data is not None and ckpt is not None
    shutil.copytree(loop["out"] / "heldout", data / "heldout")
    shutil.copytree(loop["hf"], ckpt / "hf")
    (line,) = oracle_lines(docs, tmp_path)
    assert "maxTokens=1536 score Pass@1 = 100 %" in line and "the budget holds a correct answer" in line
    docs[2]["spec"]["evaluation"]["model"]["sampling"]["maxTokens"] = 256
    shutil.rmtree(tmp_path / "oracle-check")
    assert "the budget cuts correct answers" in oracle_lines(docs, tmp_path)[0]
