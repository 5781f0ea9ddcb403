"""`trex train` writes a Hugging Face export that transformers loads and the eval harness evaluates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml


def _sft_corpus(path: Path, n: int = 40) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            msgs = [{"role": "system", "content": "You write optimisation models."},
                    {"role": "user", "content": f"Maximise {i + 2} x subject to x <= {i + 5}."},
                    {"role": "assistant", "content": f"x = {i + 5}; objective {(i + 2) * (i + 5)}"}]
            fh.write(json.dumps({"messages": msgs}) + "\n")


@pytest.mark.slow
def test_export_loads_in_transformers_and_matches(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trex.evaluation.models.checkpoint import find_hf_export
    from trex.text.chat import encode_chat
    from trex.trainer.hf import load_hf

    data = tmp_path / "sft.jsonl"
    _sft_corpus(data)
    cfg = {"mode": "sft", "maxSteps": 4, "model": {"preset": "tiny"},
           "data": {"train": str(data), "seqLen": 64, "microBatchSize": 2, "globalBatchSize": 2,
                    "tokenizer": {"vocabSize": 400}},
           "checkpoint": {"dir": str(tmp_path / "ckpt"), "intervalSteps": 2, "exportHfEvery": True},
           "optimizer": {"schedule": {"warmupSteps": 1}}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    run = subprocess.run([sys.executable, "-m", "trex", "train", "--config", str(tmp_path / "cfg.yaml"),
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=300,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                              "TREX_TERMINATION_PATH": str(tmp_path / "term.json")})
    assert run.returncode == 0, run.stderr[-2000:]
    export = find_hf_export(tmp_path / "ckpt")
    assert export == tmp_path / "ckpt" / "hf"
    summary = json.loads((tmp_path / "term.json").read_text())
    assert summary["hfExport"] == str(export)
    # exportHfEvery: each checkpoint carries its own export, hashed in its manifest (modelFrom.step).
    from safetensors.torch import load_file
    from trex.trainer.checkpoint import CheckpointManager

    mgr = CheckpointManager(tmp_path / "ckpt")
    weights = {}
    for step in (2, 4):
        step_dir = tmp_path / "ckpt" / f"step-{step:08d}"
        assert find_hf_export(step_dir) == step_dir / "hf"
        assert "hf/config.json" in mgr.verify(step_dir)["files"]
        weights[step] = {k: v for f in sorted((step_dir / "hf").glob("*.safetensors")) for k, v in load_file(f).items()}
    final = {k: v for f in sorted(export.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert weights[4].keys() == final.keys() and all(torch.equal(weights[4][k], final[k]) for k in final)
    assert any(not torch.equal(weights[2][k], final[k]) for k in final)  # step 2 is an earlier model

    tok = AutoTokenizer.from_pretrained(export)
    hf = AutoModelForCausalLM.from_pretrained(export, torch_dtype=torch.float32).eval()
    ours = load_hf(export).eval()
    msgs = [{"role": "user", "content": "Maximise 3 x subject to x <= 4."},
            {"role": "assistant", "content": "x = 4; objective 12"}]
    # The chat template reproduces the trainer's SFT packing token for token (up to the final <|eos|>).
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(export / "tokenizer.json"))
    packed = encode_chat(raw, msgs).ids.tolist()[:-1]
    templated = tok.apply_chat_template(msgs, tokenize=False)
    assert tok(templated, add_special_tokens=False)["input_ids"] == packed
    ids = torch.tensor([packed])
    with torch.no_grad():
        ref = hf(ids).logits
        got = ours(ids).logits
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    # Generation stops at <|end|>, the assistant's closing token the trainer teaches.
    assert tok.eos_token == "<|end|>"
