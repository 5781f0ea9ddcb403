"""Does the OR loop learn? ORData -> SFT -> evaluation on CPU, with the controls that tell learning from luck.

    .venv/bin/python benchmarks/or_loop_learning.py [--seeds 0,1,2] [--steps 300] [--preset tiny]
        [--families knapsack] [--count 240] [--items 12] [--max-tokens 0] [--out DIR]

Per seed: ORData on simple families in the concise rendering (one style, gurobipy code), SFT of a small
preset (its vocabulary and positions widened to fit the samples), then, through the real `trex eval`
harness (prompt contract, extraction, sandbox, strict scoring):

- ``untrained``: the same model before training, on the held-out items;
- ``trained/train``: the checkpoint on items it was trained on (memorisation);
- ``trained/heldout``: the checkpoint on held-out items (the learning figure);
- ``control``: each held-out item answered with the reference answer of another item of its family (the
  template with another item's numbers), so chance matches (ceil(6/3) = 2 for any 6 and 3) are not counted
  as learning;
- ``oracle``: each held-out item's own reference answer cut at the generation budget (must be 100 %).

It also prints the reference answer's loss per token under the training record's tokens and under the
tokens `trex eval` sends through the exported chat template (equal by construction of the contract).
Held-out Pass@1 clearly above both ``untrained`` and ``control`` is learning; the figures are the
honest baseline the GRPO work starts from.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def make_ordata(out: Path, seed: int, families: list[str], count: int) -> tuple[Path, Path]:
    """Generate and merge one ORData corpus; (merged folder, held-out file)."""
    from trex.config_base import load_section
    from trex.ordata.config import ORDataConfig
    from trex.ordata.pipeline import HELDOUT_DIR, HELDOUT_FILE, merge, run_shard

    cfg = load_section(ORDataConfig, {
        "count": count, "seed": seed, "heldoutFraction": 0.2, "outputs": ["sft"],
        "families": [{"name": f, "size": {"min": 2, "max": 3}} for f in families],
        "render": {"styles": ["formal"], "forms": ["concise"]},
        "reconstruction": {"codeSolver": "gurobipy"}, "output": str(out)})
    run_shard(cfg, 0, 1, out, show_progress=False)
    merge(out)
    return out / "merged", out / HELDOUT_DIR / HELDOUT_FILE


def train(merged: Path, out: Path, seed: int, preset: str, steps: int, seq_len: int) -> tuple[Any, Any, float]:
    """SFT for ``steps`` steps; the Trainer (its model and tokenizer) and the untrained export folder."""
    from trex.config_base import load_section
    from trex.trainer.config import TrainerConfig
    from trex.trainer.export import export_hf
    from trex.trainer.loop import Trainer

    cfg = load_section(TrainerConfig, {
        "mode": "sft", "seed": seed, "maxSteps": steps,
        "model": {"preset": preset, "overrides": {"vocabSize": 2048, "maxSeqLen": seq_len}},
        "data": {"train": str(merged), "seqLen": seq_len, "microBatchSize": 4, "globalBatchSize": 4,
                 "tokenizer": {"vocabSize": 2048}, "seed": seed},
        "optimizer": {"schedule": {"warmupSteps": 20}},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(out / "ckpt"), "intervalSteps": steps, "keepLast": 1, "resume": False},
        "logging": {"intervalSteps": 50}})
    tr = Trainer(cfg, out, measure_peak=False, log=lambda m: print("   ", m, file=sys.stderr))
    export_hf(tr.model, tr.tokenizer, out / "untrained")
    t0 = time.perf_counter()
    res = tr.run(steps)
    export_hf(tr.model, tr.tokenizer, out / "trained")
    return tr, res, time.perf_counter() - t0


def pass_at_1(items_file: Path, model: Any, out: Path) -> float:
    """Pass@1 (strict protocol) of ``model`` on the ORData items in ``items_file`` through the harness."""
    from trex.config_base import load_section
    from trex.evaluation.config import EvalConfig
    from trex.evaluation.runner import run_eval

    cfg = load_section(EvalConfig, {"protocol": "strict", "model": {"kind": "reference"},
                                    "benchmarks": [{"name": "ordata", "path": str(items_file)}],
                                    "output": str(out)})
    outcome = asyncio.run(run_eval(cfg, model, out_dir=out))
    return float(outcome.summary["benchmarks"]["ordata"]["pass@1"])


def write_items(records: list[dict[str, Any]], path: Path) -> Path:
    """Held-out-format records (id, question, answer, family, reference) as JSONL."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def control_answers(items: list[dict[str, Any]], pool: list[dict[str, Any]]) -> dict[str, str]:
    """For each item, the reference answer of a different item of the same family (another item's numbers)."""
    out: dict[str, str] = {}
    for i, it in enumerate(items):
        same = [p for p in pool if p["family"] == it["family"] and p["id"] != it["id"]]
        out[it["id"]] = same[i % len(same)]["reference"]
    return out


def answer_loss(export: Path, record: dict[str, Any]) -> tuple[float, float]:
    """Loss per token of the reference answer after (a) the training record's prompt tokens, (b) the tokens
    `trex eval` sends (the export's chat template over the evaluation messages)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trex.evaluation.benchmarks.base import Item
    from trex.evaluation.prompts import build_messages

    tok = AutoTokenizer.from_pretrained(export)
    model = AutoModelForCausalLM.from_pretrained(export).eval()
    msgs = record["messages"]
    train_prompt = tok.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True)
    item = Item(id=record["id"], question=_question(record), truth=None)
    eval_prompt = tok.apply_chat_template(build_messages(item, "strict", "ordata"), tokenize=False,
                                          add_generation_prompt=True)
    answer = tok(msgs[-1]["content"] + "<|end|>", add_special_tokens=False)["input_ids"]

    def nll(prompt: str) -> float:
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([p + answer])
        with torch.inference_mode():
            logits = model(ids).logits[0, len(p) - 1:-1]
        return float(torch.nn.functional.cross_entropy(logits, torch.tensor(answer)))

    return nll(train_prompt), nll(eval_prompt)


def _question(record: dict[str, Any]) -> str:
    from trex.ordata.pipeline import problem_of

    return problem_of(record)


def run_seed(seed: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One seed end to end; its figures."""
    from trex.evaluation.models.reference import OracleModel
    from trex.evaluation.models.transformers_model import TransformersModel
    from trex.ordata.pipeline import heldout_record
    from trex.trainer.data.sources import load_records

    work = root / f"seed{seed}"
    t0 = time.perf_counter()
    merged, heldout = make_ordata(work / "ordata", seed, args.families, args.count)
    _, records = load_records(merged)
    held = [json.loads(line) for line in heldout.read_text().splitlines() if line.strip()][:args.items]
    trained_on = [heldout_record(r) for r in records][:args.items]
    t_data = time.perf_counter() - t0
    from tokenizers import Tokenizer
    from trex.trainer.data.packing import encode_chat
    from trex.trainer.data.tokenizer import train_bpe

    probe = train_bpe(["\n".join(m["content"] for m in r["messages"]) for r in records], 2048)
    longest = max(len(encode_chat(probe, r["messages"]).ids) for r in records)
    seq_len = 64 * math.ceil(longest / 64)
    tr, res, t_train = train(merged, work / "train", seed, args.preset, args.steps, seq_len)
    answer_max = max(len(tr.tokenizer.encode(h["reference"]).ids) for h in held)
    budget = args.max_tokens or answer_max + 16
    files = {"heldout": write_items(held, work / "heldout.jsonl"), "train": write_items(trained_on, work / "train.jsonl")}
    tokenizer = Tokenizer.from_file(str(work / "train" / "trained" / "tokenizer.json"))
    fig: dict[str, Any] = {"seed": seed, "samples": len(records), "heldout_items": len(held), "seq_len": seq_len,
                           "budget": budget, "final_loss": res.loss, "data_s": round(t_data, 1),
                           "train_s": round(t_train, 1)}
    t1 = time.perf_counter()
    fig["oracle"] = pass_at_1(files["heldout"], OracleModel(tokenizer, budget), work / "eval-oracle")
    fig["control"] = pass_at_1(files["heldout"], OracleModel(answers=control_answers(held, trained_on)),
                               work / "eval-control")
    for name, export, which in (("untrained", "untrained", "heldout"), ("trained/train", "trained", "train"),
                                ("trained/heldout", "trained", "heldout")):
        model = TransformersModel(work / "train" / export, max_new_tokens=budget, device="cpu")
        fig[name] = pass_at_1(files[which], model, work / f"eval-{name.replace('/', '-')}")
    fig["eval_s"] = round(time.perf_counter() - t1, 1)
    loss_train, loss_eval = answer_loss(work / "train" / "trained", records[0])
    fig["answer_loss_train_format"], fig["answer_loss_eval_format"] = round(loss_train, 4), round(loss_eval, 4)
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--families", default="knapsack")
    ap.add_argument("--count", type=int, default=240)
    ap.add_argument("--items", type=int, default=12, help="items scored per split")
    ap.add_argument("--max-tokens", type=int, default=0, help="generation budget (0: longest held-out answer + 16)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    args.families = [f.strip() for f in args.families.split(",") if f.strip()]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    root = args.out or Path(tempfile.mkdtemp(prefix="or-loop-learning-"))
    figures = []
    for seed in (int(s) for s in args.seeds.split(",")):
        fig = run_seed(seed, args, root)
        figures.append(fig)
        print(json.dumps(fig), flush=True)
    cols = ("untrained", "control", "trained/train", "trained/heldout", "oracle")
    print(f"\n{'seed':>4} " + " ".join(f"{c:>16}" for c in cols) + f" {'loss':>7} {'train s':>8}")
    for f in figures:
        print(f"{f['seed']:>4} " + " ".join(f"{100 * f[c]:>15.1f}%" for c in cols)
              + f" {f['final_loss']:>7.3f} {f['train_s']:>8.0f}")
    if len(figures) > 1:
        print("mean " + " ".join(f"{100 * statistics.mean(f[c] for f in figures):>15.1f}%" for c in cols))
    print(f"(Pass@1, strict protocol; {args.steps} SFT steps of preset {args.preset} on {','.join(args.families)}; "
          f"work folder {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
