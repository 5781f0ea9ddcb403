"""Does the OR loop learn? ORData -> SFT -> evaluation on CPU, with the controls that tell learning from luck.

    .venv/bin/python benchmarks/or_loop_learning.py [--seeds 0,1,2] [--steps 240] [--preset tiny]
        [--shape learn|learn-large] [--layout data] [--digits 3] [--lr-scale 1] [--temperature 0]
        [--families knapsack] [--count 240] [--items 12] [--out DIR]          (make learn: one seed)

Per seed: ORData on simple families in the concise rendering (one style, gurobipy code, reference answers in
the copy-friendly ``data`` layout by default: the program restates each number once, in the problem's order),
a BPE trained on it (numbers cut into groups of ``--digits`` digits), SFT of a small model (``--shape learn``:
the tiny preset widened to a dense 2-layer, 128-wide model without MTP; positions and vocabulary sized to
the samples), then, through the real `trex eval` harness (prompt contract, extraction, sandbox, strict scoring):

- ``untrained``: the same model before training, on the held-out items;
- ``trained/train``: the checkpoint on items it was trained on (memorisation);
- ``trained/heldout``: the checkpoint on held-out items (the learning figure);
- ``control``: each held-out item answered with the reference answer of another item of its family (the
  template with another item's numbers), so chance matches (ceil(6/3) = 2 for any 6 and 3) are not counted
  as learning;
- ``oracle``: each held-out item's own reference answer cut at the generation budget (must be 100 %).

Under teacher forcing on held-out reference answers it also prints the trainer model's loss per answer token
and the share of answer tokens, and of number tokens (the ones to copy from the prompt), its argmax gets
right; and ``rollout_vs_export``: the share of greedy tokens on which the rollout engine (the trainer's own
model) and the exported checkpoint through transformers (the `trex eval` path) agree before they first
differ (1.0: the two generation paths are the same). Held-out Pass@1 clearly above both ``untrained`` and
``control`` is learning; the figures are the honest baseline the GRPO work starts from.
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

SHAPES: dict[str, dict[str, Any]] = {
    "preset": {},
    "learn": {"hiddenSize": 128, "numLayers": 2, "nDenseLayers": 2, "intermediateSize": 512, "mtpDepth": 0,
              "kvLoraRank": 64, "qkNopeHeadDim": 32, "qkRopeHeadDim": 16, "vHeadDim": 32},
    "learn-large": {"hiddenSize": 256, "numLayers": 4, "nDenseLayers": 4, "intermediateSize": 768, "mtpDepth": 0,
                    "numHeads": 8, "kvLoraRank": 64, "qkNopeHeadDim": 32, "qkRopeHeadDim": 16, "vHeadDim": 32},
}
"""Model overrides on top of the preset: ``preset`` keeps it; ``learn`` (on tiny) is a 0.9M-parameter dense
2-layer model without MTP, twice tiny's width, at about tiny's CPU cost per step; ``learn-large`` is a dense
4-layer, 256-wide, 8-head model without MTP (3.9M parameters with a 1344-entry vocabulary, 4.3M with 2048)."""


def make_ordata(out: Path, seed: int, families: list[str], count: int, layout: str) -> tuple[Path, Path]:
    """Generate and merge one ORData corpus; (merged folder, held-out file)."""
    from trex.config_base import load_section
    from trex.ordata.config import ORDataConfig
    from trex.ordata.pipeline import HELDOUT_DIR, HELDOUT_FILE, merge, run_shard

    cfg = load_section(ORDataConfig, {
        "count": count, "seed": seed, "heldoutFraction": 0.2, "outputs": ["sft"],
        "families": [{"name": f, "size": {"min": 2, "max": 3}} for f in families],
        "render": {"styles": ["formal"], "forms": ["concise"]},
        "reconstruction": {"codeSolver": "gurobipy", "layout": layout}, "output": str(out)})
    run_shard(cfg, 0, 1, out, show_progress=False)
    merge(out)
    return out / "merged", out / HELDOUT_DIR / HELDOUT_FILE


def make_tokenizer(records: list[dict[str, Any]], vocab: int, digit_group: int, path: Path) -> Any:
    """The run's BPE, trained on the SFT texts with numbers cut into groups of ``digit_group`` digits."""
    from trex.text.tokenizer import train_bpe

    tok = train_bpe(["\n".join(m["content"] for m in r["messages"]) for r in records], vocab,
                    digit_group=digit_group)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok


def train(merged: Path, out: Path, args: argparse.Namespace, seed: int, seq_len: int, tokenizer: Path,
          vocab: int) -> tuple[Any, Any, float]:
    """SFT for ``args.steps`` steps; the Trainer (its model and tokenizer), its result and the training time.
    Exports the untrained model to ``out/untrained`` and the trained one to ``out/trained``."""
    from trex.config_base import load_section
    from trex.trainer.config import TrainerConfig
    from trex.trainer.export import export_hf
    from trex.trainer.loop import Trainer

    cfg = load_section(TrainerConfig, {
        "mode": "sft", "seed": seed, "maxSteps": args.steps,
        "model": {"preset": args.preset, "overrides": {**SHAPES[args.shape], "vocabSize": vocab, "maxSeqLen": seq_len}},
        "data": {"train": str(merged), "seqLen": seq_len, "microBatchSize": args.batch,
                 "globalBatchSize": args.batch, "tokenizer": {"path": str(tokenizer)}, "seed": seed},
        "optimizer": {"schedule": {"warmupSteps": min(20, args.steps // 10)},
                      "muon": {"lr": 2e-2 * args.lr_scale}, "adamw": {"lr": 2e-3 * args.lr_scale}},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(out / "ckpt"), "intervalSteps": args.steps, "keepLast": 1, "resume": False},
        "logging": {"intervalSteps": 50}})
    tr = Trainer(cfg, out, measure_peak=False, log=lambda m: print("   ", m, file=sys.stderr))
    export_hf(tr.model, tr.tokenizer, out / "untrained")
    t0 = time.perf_counter()
    res = tr.run(args.steps)
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


def teacher_forced(model: Any, tok: Any, records: list[dict[str, Any]]) -> dict[str, float]:
    """Over ``records``' reference answers, under the trainer's model: loss per answer token, the share of answer
    tokens its argmax predicts given the reference prefix (what greedy decoding gets right one step ahead), and
    the share of the answer's numbers (what must be copied from the prompt) whose every token it predicts."""
    import torch
    from trex.text.chat import encode_chat

    digit = torch.tensor([tok.decode([i]).strip().isdigit() for i in range(tok.get_vocab_size())])
    nll, total, right, numbers, numbers_right = 0.0, 0, 0, 0, 0
    model.eval()
    with torch.inference_mode():
        for r in records:
            doc = encode_chat(tok, r["messages"])
            ids = torch.as_tensor(doc.ids, dtype=torch.long)[None]
            target = torch.as_tensor(doc.mask[1:], dtype=torch.bool)
            logits = model(ids[:, :-1]).logits[0][target]
            gold = ids[0, 1:][target]
            hit = logits.argmax(-1) == gold
            nll += float(torch.nn.functional.cross_entropy(logits, gold, reduction="sum"))
            total, right = total + len(gold), right + int(hit.sum())
            for run in _runs(digit[gold].tolist()):  # a number: consecutive digit tokens, right when all are
                numbers, numbers_right = numbers + 1, numbers_right + int(bool(hit[run[0]:run[1]].all()))
    return {"loss": nll / total, "token_accuracy": right / total, "number_accuracy": numbers_right / max(numbers, 1)}


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """[start, end) of every run of True in ``flags``."""
    out: list[tuple[int, int]] = []
    for i, f in enumerate(flags):
        if f and (i == 0 or not flags[i - 1]):
            out.append((i, i + 1))
        elif f:
            out[-1] = (out[-1][0], i + 1)
    return out


def generation_paths(trainer_model: Any, tok: Any, export: Path, records: list[dict[str, Any]],
                     budget: int) -> float:
    """Greedy completions of ``records``' prompts by the rollout engine (the trainer's own model) and by the
    exported checkpoint through transformers (the `trex eval` path): the share of tokens on which the two agree
    up to the first difference (1.0: identical; a generation-path bug shows as a low figure)."""
    import torch
    from transformers import AutoModelForCausalLM
    from trex.prompt_contract import END, EOS
    from trex.text.chat import encode_prompt
    from trex.trainer.rollout.engine import generate
    from trex.trainer.rollout.sampling import SamplingParams

    stops = (tok.token_to_id(END), tok.token_to_id(EOS))
    prompts = [encode_prompt(tok, r["messages"][:-1]).tolist() for r in records]
    trainer_model.eval()
    ours = generate(trainer_model, prompts, SamplingParams(temperature=0.0, max_new_tokens=budget, stop_tokens=stops),
                    seed=0)
    hf = AutoModelForCausalLM.from_pretrained(export).eval()
    same = total = 0
    with torch.inference_mode():
        for p, ro in zip(prompts, ours, strict=True):
            out = hf.generate(torch.tensor([p]), do_sample=False, max_new_tokens=budget, eos_token_id=list(stops),
                              pad_token_id=tok.token_to_id("<|pad|>"))[0, len(p):].tolist()
            n = max(len(out), len(ro.tokens))
            k = next((i for i, (a, b) in enumerate(zip(out, ro.tokens, strict=False)) if a != b),
                     min(len(out), len(ro.tokens)))
            same, total = same + k, total + n
    return same / max(total, 1)


def run_seed(seed: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One seed end to end; its figures."""
    from tokenizers import Tokenizer
    from trex.evaluation.models.reference import OracleModel
    from trex.evaluation.models.transformers_model import TransformersModel
    from trex.ordata.pipeline import heldout_record
    from trex.text.chat import encode_chat
    from trex.trainer.data.sources import load_records

    work = root / f"seed{seed}"
    t0 = time.perf_counter()
    merged, heldout = make_ordata(work / "ordata", seed, args.families, args.count, args.layout)
    _, records = load_records(merged)
    held_rows = [json.loads(line) for line in heldout.read_text().splitlines() if line.strip()][:args.items]
    trained_on = [heldout_record(r) for r in records][:args.items]
    t_data = time.perf_counter() - t0
    tok = make_tokenizer(records, args.vocab, args.digits, work / "tokenizer.json")
    vocab = 64 * math.ceil(tok.get_vocab_size() / 64)
    longest = max(len(encode_chat(tok, r["messages"]).ids) for r in records)
    seq_len = 64 * math.ceil(longest / 64)
    tr, res, t_train = train(merged, work / "train", args, seed, seq_len, work / "tokenizer.json", vocab)
    answer_max = max(len(tok.encode(h["reference"]).ids) for h in held_rows)
    budget = args.max_tokens or answer_max + 16
    files = {"heldout": write_items(held_rows, work / "heldout.jsonl"),
             "train": write_items(trained_on, work / "train.jsonl")}
    tokenizer = Tokenizer.from_file(str(work / "train" / "trained" / "tokenizer.json"))
    fig: dict[str, Any] = {"seed": seed, "samples": len(records), "heldout_items": len(held_rows), "seq_len": seq_len,
                           "vocab": vocab, "budget": budget, "final_loss": res.loss, "data_s": round(t_data, 1),
                           "train_s": round(t_train, 1)}
    t1 = time.perf_counter()
    fig["oracle"] = pass_at_1(files["heldout"], OracleModel(tokenizer, budget), work / "eval-oracle")
    fig["control"] = pass_at_1(files["heldout"], OracleModel(answers=control_answers(held_rows, trained_on)),
                               work / "eval-control")
    for name, export, which in (("untrained", "untrained", "heldout"), ("trained/train", "trained", "train"),
                                ("trained/heldout", "trained", "heldout")):
        model = TransformersModel(work / "train" / export, max_new_tokens=budget, device="cpu",
                                  temperature=args.temperature, seed=seed)
        fig[name] = pass_at_1(files[which], model, work / f"eval-{name.replace('/', '-')}")
    fig["eval_s"] = round(time.perf_counter() - t1, 1)
    probe = [_sft_of(h) for h in held_rows[:args.probe]]
    fig.update({f"heldout_{k}": round(v, 4) for k, v in teacher_forced(tr.model, tok, probe).items()})
    fig["rollout_vs_export"] = round(generation_paths(tr.model, tok, work / "train" / "trained", probe, budget), 4)
    return fig


def _sft_of(item: dict[str, Any]) -> dict[str, Any]:
    """The SFT record (prompt contract messages) of a held-out item."""
    from trex.prompt_contract import training_messages

    return {"messages": training_messages(item["question"], item["reference"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="learn", help="model overrides on the preset")
    ap.add_argument("--families", default="knapsack")
    ap.add_argument("--count", type=int, default=240)
    ap.add_argument("--items", type=int, default=12, help="items scored per split")
    ap.add_argument("--max-tokens", type=int, default=0, help="generation budget (0: longest held-out answer + 16)")
    ap.add_argument("--layout", choices=("data", "inline"), default="data", help="reference answers' layout")
    ap.add_argument("--digits", type=int, default=3, help="digits per number pre-token (3 as DeepSeek's, 1)")
    ap.add_argument("--vocab", type=int, default=2048, help="BPE vocabulary (the model's embedding follows it)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step")
    ap.add_argument("--lr-scale", type=float, default=1.0, help="factor on both optimizers' default peak LRs")
    ap.add_argument("--temperature", type=float, default=0.0, help="decoding temperature (0: greedy)")
    ap.add_argument("--probe", type=int, default=2, help="held-out items of the teacher-forced and path checks")
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
    print(f"(Pass@1, strict protocol; {args.steps} SFT steps x {args.batch} of preset {args.preset} ({args.shape}) on "
          f"{','.join(args.families)}, layout {args.layout}, {args.digits}-digit groups, LR x{args.lr_scale}, "
          f"temperature {args.temperature}; work folder {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
