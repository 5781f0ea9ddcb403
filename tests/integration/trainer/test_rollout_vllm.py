"""Rollouts through a real vLLM server (CPU build, from .venv-vllm) on 127.0.0.1, started once, in one test (under
xdist a module fixture would start one server per worker, and the agreement check needs the weights as loaded).

The server starts on the learnable task's SFT export (test_grpo_learns, on tiny-vllm). References are independent
of vLLM: trex's own forward of the same weights. After a push of the same weights, vLLM's greedy responses are trex's.
Then the trainer's side of pushes: version tags, stale marking of a push during a rollout (between two samples and
between two segments of one), a kill -9 of the server mid-rollout (the rollout continues from its token log on the
restarted server and equals an uninterrupted run), GRPO and OPD steps rolled out on the server with a push before
each (OPD's rollouts logged with each token's version, as GRPO's), and test_grpo_learns's task learnt through the
server. Last, on servers of their own started one at a time after the first stops: a MoE model's experts after pushes,
and rollout.spawnLocal: the server the engine spawned is killed mid-rollout and the engine restarts it. ``make test`` sets
TREX_REQUIRE_VLLM=1: a missing vLLM environment then fails this test instead of skipping it.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from helpers.vllm_env import vllm_venv
from test_grpo_learns import GRPO_STEPS, NUMBERS, SFT_STEPS, PrintsTheNumber, _question
from tokenizers import Tokenizer, models, pre_tokenizers
from trex.config_base import load_section
from trex.prompt_contract import BOS, END, EOS, PAD, prompt_messages, training_messages
from trex.text.chat import encode_prompt
from trex.trainer.config import RolloutConfig, TrainerConfig
from trex.trainer.export import export_hf
from trex.trainer.hf import load_hf
from trex.trainer.loop import Trainer
from trex.trainer.model import build_model
from trex.trainer.model.model import DeepSeekModel
from trex.trainer.objective import Series
from trex.trainer.rollout.engine import Rollout, generate
from trex.trainer.rollout.sampling import SamplingParams
from trex.trainer.rollout.vllm_engine import VLLMEngine, VLLMRollouts, rollout_outcome
from trex.trainer.rollout.vllm_server import VLLMServer
from trex.trainer.rollout.wal import RECORD_SIZE, RolloutLog, group_records, read_log

REPO = Path(__file__).resolve().parents[3]
BASE = {"model": {"preset": "tiny-vllm"}, "device": "cpu", "stability": {"enabled": False}}




def _tokenizer() -> Tokenizer:
    vocab = {f"t{i}": i for i in range(508)}
    for j, t in enumerate((BOS, EOS, END, PAD)):
        vocab[t] = 508 + j
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def _model(seed: int, head_scale: float = 1.0) -> DeepSeekModel:
    """A tiny-vllm model; head_scale sharpens its next-token distributions (a spread of log-probs to correlate)."""
    cfg = load_section(TrainerConfig, {"model": {"preset": "tiny-vllm"}, "device": "cpu"})
    m = build_model(cfg.model, device="cpu", dtype=torch.float32, seed=seed)
    with torch.no_grad():
        m.lm_head.weight.mul_(head_scale)
    return m.eval()


def _sft(root: Path) -> Path:
    """The learnable task's SFT run (test_grpo_learns) on tiny-vllm; returns its export."""
    rng = random.Random(0)
    sft_data = root / "sft.jsonl"
    with sft_data.open("w") as f:  # the format, with a digit unrelated to the prompt's
        for _ in range(400):
            messages = training_messages(_question(rng.randrange(10)), f"```python\nprint({rng.randrange(10)})\n```")
            f.write(json.dumps({"messages": messages}) + "\n")
    cfg = load_section(TrainerConfig, {
        **BASE, "mode": "sft", "maxSteps": SFT_STEPS,
        "optimizer": {"schedule": {"warmupSteps": 0, "decay": "none"}},
        "data": {"train": str(sft_data), "seqLen": 256, "microBatchSize": 16, "globalBatchSize": 16,
                 "tokenizer": {"vocabSize": 512}},
        "checkpoint": {"dir": str(root / "sft"), "intervalSteps": 1000}})
    trainer = Trainer(cfg, root, measure_peak=False, log=lambda _m: None)
    trainer.run()
    return export_hf(trainer.model, trainer.tokenizer, root / "sft" / "hf")


def _agreement(engine: VLLMEngine, model: DeepSeekModel, prompts: list[list[int]]) -> tuple[float, float, float]:
    """(correlation, max |delta|, mean |delta|) of vLLM's log-probs of trex's greedy tokens against trex's own."""
    ref = generate(model, prompts, SamplingParams(temperature=0.0, max_new_tokens=16), 0)
    trex_lp = torch.tensor([x for r in ref for x in r.logprobs], dtype=torch.float64)
    vllm_lp = torch.tensor([x for p, r in zip(prompts, ref, strict=True) for x in engine.score(p, r.tokens)],
                           dtype=torch.float64)
    delta = (vllm_lp - trex_lp).abs()
    return float(torch.corrcoef(torch.stack([vllm_lp, trex_lp]))[0, 1]), float(delta.max()), float(delta.mean())


def _prompts(n: int, length: int = 8) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 508, (length,), generator=g).tolist() for _ in range(n)]


def _push(engine: VLLMEngine, model: DeepSeekModel, version: int) -> None:
    engine.push(lambda d: export_hf(model, _tokenizer(), d), version)


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=30) as r:
        out = json.loads(r.read())
    assert isinstance(out, dict)
    return out


@pytest.mark.timeout(1500)
def test_rollouts_on_a_real_vllm_server(tmp_path: Path) -> None:
    venv = vllm_venv()
    hf = _sft(tmp_path)
    server = VLLMServer(hf, venv=venv, max_model_len=256, log_path=tmp_path / "server.log").start()
    try:
        print(f"vLLM server ready in {server.wait_ready(600):.1f} s")
        _agreement_on_the_served_weights(server, hf, tmp_path)
        _pushes_tag_versions_and_mark_stale_samples(server, tmp_path)
        _a_push_between_segments_marks_the_earlier_tokens_stale(server, tmp_path)
        server = _a_killed_server_resumes_from_the_log(server, tmp_path)
        _grpo_steps_roll_out_on_the_server(server, hf, tmp_path)
        _opd_steps_roll_out_on_the_server(server, hf, tmp_path)
        _grpo_learns_through_the_server(server, hf, tmp_path)
    finally:
        server.stop()
    _moe_experts_follow_a_push(venv, tmp_path)
    _a_spawned_server_that_dies_is_restarted(venv, tmp_path)


def _moe_experts_follow_a_push(venv: Path, root: Path) -> None:
    """A MoE model (tiny-vllm with both layers MoE) served, then pushed other weights and pushed back: vLLM equals
    trex after each push as at load (its own server, started after the first stopped: one server at a time).
    Without the server's MOE_REPACK the pushed model's log-probs are off by 0.23 (the experts keep stale packing)."""
    cfg = load_section(TrainerConfig, {"model": {"preset": "tiny-vllm", "overrides": {"nDenseLayers": 0}},
                                       "device": "cpu"})
    a, b = (build_model(cfg.model, device="cpu", dtype=torch.float32, seed=s).eval() for s in (3, 4))
    with torch.no_grad():
        for m in (a, b):
            m.lm_head.weight.mul_(8.0)
    server = VLLMServer(export_hf(a, _tokenizer(), root / "moe"), venv=venv, max_model_len=256,
                        log_path=root / "moe-server.log").start()
    try:
        server.wait_ready(600)
        engine = VLLMEngine([server.url], root / "moe-weights")
        for version, model in enumerate((a, b, a)):
            if version:
                _push(engine, model, version)
            corr, dmax, _ = _agreement(engine, model, _prompts(8))
            print(f"MoE model, version {version}: vLLM vs trex corr {corr:.5f}, max |delta| {dmax:.3e}")
            assert corr >= 0.99
            assert dmax < 1e-3
    finally:
        server.stop()


def _agreement_on_the_served_weights(server: VLLMServer, hf: Path, root: Path) -> None:
    """Same weights, fp32 on both sides: vLLM's log-probs of trex's greedy tokens, on the SFT weights the server
    loaded (long prompts, position-dependent attention: the case vLLM's CPU RoPE kernel gets wrong without the
    server's NATIVE_ROPE, docs/ARCHITECTURE.md "Rollouts") and on random weights with a sharpened head after a
    push."""
    engine = VLLMEngine([server.url], root / "weights")
    trained = load_hf(hf, device="cpu")
    trained.eval()
    tok = Tokenizer.from_file(str(hf / "tokenizer.json"))
    prompts = [[int(t) for t in encode_prompt(tok, prompt_messages(_question(n)), None, None)] for n in range(16)]
    corr, dmax, dmean = _agreement(engine, trained, prompts)
    print(f"SFT weights as loaded: vLLM vs trex log-probs of trex's greedy tokens: corr {corr:.5f}, "
          f"max |delta| {dmax:.3e}, mean |delta| {dmean:.3e}")
    assert corr >= 0.99
    assert dmax < 1e-3
    model = _model(3, head_scale=8.0)
    _push(engine, model, 1)
    corr, dmax, dmean = _agreement(engine, model, _prompts(16))
    print(f"random weights after a push: vLLM vs trex log-probs of trex's greedy tokens: corr {corr:.5f}, "
          f"max |delta| {dmax:.3e}, mean |delta| {dmean:.3e}")
    assert corr >= 0.99
    assert dmax < 0.2
    _push(engine, trained, 2)
    _greedy_tokens_equal_trex(engine, trained, prompts)


def _greedy_tokens_equal_trex(engine: VLLMEngine, model: DeepSeekModel, prompts: list[list[int]]) -> None:
    """After a push of the SFT weights, vLLM's greedy responses are trex's token for token. A prompt whose greedy path
    in trex's own forward has a top-2 logit gap under 1e-4 (a near-tie fp32 rounding may break either way) is
    excluded, and the exclusions must stay few."""
    params = SamplingParams(temperature=0.0, max_new_tokens=16)
    ref = generate(model, prompts, params, 0)
    got = engine.generate(prompts, params, 0)
    ties = 0
    for p, r, g in zip(prompts, ref, got, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([p + r.tokens])).logits[0, len(p) - 1:-1].double()
        top2 = logits.topk(2, dim=-1).values
        if float((top2[:, 0] - top2[:, 1]).min()) < 1e-4:
            ties += 1
            continue
        assert g.tokens == r.tokens, (p, r.tokens, g.tokens)
    print(f"greedy after a push: vLLM = trex on {len(prompts) - ties}/{len(prompts)} prompts ({ties} near-ties out)")
    assert ties <= 2


def _pushes_tag_versions_and_mark_stale_samples(server: VLLMServer, root: Path) -> None:
    """Every sample carries the version the server held when it was sent; a push in the middle of a rollout (one
    request at a time, in order) leaves the earlier samples stale; the server reports each pushed version."""
    eng = VLLMEngine([server.url], root / "weights", concurrency=1)
    _push(eng, _model(21), 7)
    assert _get(server.url + "/weight_info")["weight_version"] == "7"
    newer = _model(22)

    def push_after_third(k: int) -> None:
        if k == 2:
            _push(eng, newer, 8)

    got = eng.generate(_prompts(6), SamplingParams(temperature=1.0, max_new_tokens=4), 0, on_answer=push_after_third)
    assert [r.versions[0] for r in got] == [7, 7, 7, 8, 8, 8]
    assert all(r.policy_version == 8 for r in got)
    assert [all(r.stale) for r in got] == [True, True, True, False, False, False]
    assert _get(server.url + "/weight_info")["weight_version"] == "8"
    after = eng.generate(_prompts(4), SamplingParams(temperature=1.0, max_new_tokens=4), 0)
    assert all(r.versions == [8] * len(r.tokens) and not any(r.stale) for r in after)  # the server was resumed


def _a_push_between_segments_marks_the_earlier_tokens_stale(server: VLLMServer, root: Path) -> None:
    """Segments of 4 tokens, a push of other weights after sample 0's first segment: sample 0's first 4 tokens carry
    the old version and are stale, the rest the new one; in every sample the versions only rise, and each token's
    behaviour log-prob is that of the weights its version names (trex's forward of each, the nearer of the two)."""
    old, new = _model(31, head_scale=8.0), _model(32, head_scale=8.0)
    eng = VLLMEngine([server.url], root / "segment-weights", concurrency=2, segment=4)
    _push(eng, old, 20)
    pushed: list[int] = []

    def push_once(k: int, held: int) -> None:
        if k == 0 and held == 4 and not pushed:
            pushed.append(held)
            _push(eng, new, 21)

    prompts = _prompts(2)
    got = eng.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=12), 3, on_segment=push_once)
    assert pushed and got[0].versions == [20] * 4 + [21] * 8, got[0].versions
    for r in got:
        assert r.policy_version == 21 and r.versions == sorted(r.versions)
        assert r.stale == [v == 20 for v in r.versions]
        with torch.no_grad():
            ref = {v: torch.log_softmax(m(torch.tensor([r.prompt + r.tokens])).logits[0].double(), -1)
                   for v, m in ((20, old), (21, new))}
        for j, (tok, lp, v) in enumerate(zip(r.tokens, r.logprobs, r.versions, strict=True)):
            here = {u: float(ref[u][len(r.prompt) - 1 + j, tok]) for u in ref}
            assert abs(lp - here[v]) < abs(lp - here[41 - v]), (j, lp, here, v)
    print(f"push between segments: versions of sample 0 {got[0].versions}, sample 1 {got[1].versions}")


def _logged(path: Path) -> dict[int, list[int]]:
    """The tokens a rollout log holds per sample id (read with the log's own parser, as a restarted run would)."""
    _, records, _ = read_log(path.read_bytes(), path)
    return {sid: s.tokens for sid, s in group_records(records, path).items()}


def _mid_segment(log: Path, n: int, seg: int) -> bool:
    """Whether each of the n samples has logged more than one segment and one of them is inside a segment."""
    if not log.exists() or log.stat().st_size < n * seg * RECORD_SIZE:
        return False
    held = [len(t) for t in _logged(log).values()]
    return len(held) == n and min(held) > seg and any(k % seg for k in held)


def _a_killed_server_resumes_from_the_log(server: VLLMServer, root: Path) -> VLLMServer:
    """kill -9 of the server's process group mid-rollout (temperature 1, segments of 16 tokens, once every sample has
    logged more than one segment and one is inside a segment): while it is down a rollout that cannot wait fails naming the server; restarted from the same
    weights folder, the cut rollout goes on in the same call and its tokens equal an uninterrupted run's (made on the
    same server before the kill). A second run on the log as it was at the kill (a restarted trainer), after a push of
    the same weights as a newer version: it reads the logged tokens, sends each sample's prompt + its logged tokens
    up to the cut segment's start (never the prompt alone), re-draws the rest of that segment for the seed stream
    (checked, not logged again), equals the uninterrupted run, and marks the tokens logged under the older version
    stale. Returns the restarted server."""
    model, seg, n, budget, seed = _model(23), 16, 12, 96, 5
    eng = VLLMEngine([server.url], root / "kill-weights", segment=seg, retry_s=600)
    _push(eng, model, 11)
    folder = root / "kill-weights" / "policy-00000011"
    prompts, params = _prompts(n), SamplingParams(temperature=1.0, max_new_tokens=budget)
    t0 = time.monotonic()
    ref = eng.generate(prompts, params, seed)
    uninterrupted_s = time.monotonic() - t0
    log, out = root / "kill.wal", dict[str, list[Rollout]]()
    worker = threading.Thread(target=lambda: out.update(got=eng.generate(prompts, params, seed, wal=RolloutLog(log))))
    worker.start()
    while not _mid_segment(log, n, seg):
        assert worker.is_alive(), "the rollout ended before the kill"
        time.sleep(0.01)
    assert server.proc is not None
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    time.sleep(0.5)  # the cut streams' last tokens reach the log
    at_kill = log.read_bytes()
    held = _logged(log)
    logged = sum(len(t) for t in held.values())
    quick = VLLMEngine([server.url], root / "kill-weights", retry_s=1)
    with pytest.raises(RuntimeError, match=re.escape(f"vLLM server {server.url} did not come back within")):
        quick.generate(prompts[:1], params, seed)
    restarted = VLLMServer(folder, venv=server.venv, port=server.port, max_model_len=server.max_model_len,
                           log_path=root / "server-restarted.log").start()
    server.stop()
    try:
        restart_s = restarted.wait_ready(600)
        worker.join(600)
        got = out["got"]
        cut = eng.stats
        print(f"kill -9 after {logged}/{n * budget} tokens logged: restart {restart_s:.1f} s, {cut.cuts} requests cut, "
              f"{cut.kept} tokens kept, {cut.replayed} re-drawn (uninterrupted rollout {uninterrupted_s:.1f} s)")
        assert [r.tokens for r in got] == [r.tokens for r in ref]
        assert [x for r in got for x in r.logprobs] == pytest.approx([x for r in ref for x in r.logprobs], abs=1e-4)
        assert cut.cuts > 0 and cut.kept > 0 and cut.diverged == 0
        assert all(r.versions == [11] * budget and not any(r.stale) for r in got)
        assert all(len(t) > seg for t in held.values()) and len(held) == n
        _push(eng, model, 12)  # the same weights, tagged as a newer version
        again_log = root / "kill-restart.wal"
        _, _, end = read_log(at_kill, log)
        if not any(len(t) % seg for t in held.values()):
            # the cut streams' buffered tokens took every sample to a segment's end before the kill landed: the
            # restarted trainer reads the log one token shorter (as if killed a token earlier), so it re-draws part
            # of a segment
            end -= RECORD_SIZE
        again_log.write_bytes(at_kill[:end])
        held = _logged(again_log)
        logged = sum(len(t) for t in held.values())
        again = eng.generate(prompts, params, seed, wal=RolloutLog(again_log))
        st = eng.stats
        print(f"restarted run on the log: {st.resumed} tokens read back, {st.prefix_tokens} sent as prefix, "
              f"{st.replayed} re-drawn, {st.requests} requests")
        assert [r.tokens for r in again] == [r.tokens for r in ref]
        assert st.resumed == logged > 0 and st.diverged == 0
        # a sample the log already holds whole (it can finish before the kill) is sent nothing
        assert st.prefix_tokens == sum(len(t) - len(t) % seg for t in held.values() if len(t) < budget)
        assert st.replayed == sum(len(t) % seg for t in held.values()) > 0
        assert st.requests == sum(-(-(budget - len(t) + len(t) % seg) // seg) for t in held.values())
        for r in again:
            k = len(held[r.sample_id])
            assert r.versions == [11] * k + [12] * (budget - k) and r.policy_version == 12
            assert r.stale == [True] * k + [False] * (budget - k) and r.resumed == k
        assert _logged(again_log) == {r.sample_id: r.tokens for r in again}
    except BaseException:
        restarted.stop()
        raise
    return restarted


def _grpo_steps_roll_out_on_the_server(server: VLLMServer, hf: Path, root: Path) -> None:
    """mode grpo with rollout.engine vllm: a push of the trainer's weights before each step (policy version = step),
    rollouts from the server, the mismatch metrics and truncated importance sampling in the loss."""
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"n{n}", "question": _question(n), "answer": n}) + "\n"
                               for n in NUMBERS))
    cfg = load_section(TrainerConfig, {
        **BASE, "mode": "grpo", "maxSteps": 3,
        "optimizer": {"schedule": {"warmupSteps": 0, "decay": "none"}, "muon": {"lr": 0.001}, "adamw": {"lr": 0.002}},
        "data": {"train": str(prompts), "microBatchSize": 32, "tokenizer": {"path": str(hf / "tokenizer.json")}},
        "grpo": {"promptsPerStep": 2, "groupSize": 4, "maxNewTokens": 12, "klCoef": 0.0},
        "rollout": {"engine": "vllm", "servers": [server.url], "maxModelLen": 256, "tisCap": 2.0,
                    "weightsDir": str(root / "grpo-weights")},
        "checkpoint": {"dir": str(root / "grpo"), "intervalSteps": 1000, "initFromHf": str(hf), "exportHf": False}})
    grpo = Trainer(cfg, root, measure_peak=False, log=lambda _m: None, verifier=PrintsTheNumber())
    res = grpo.run()
    assert len(res.history) == 3
    for step, rec in enumerate(res.history):
        m = rec.metrics
        assert m["rollout_policy_version"] == step  # a push before every step's rollouts
        assert m["rollout_push_bytes"] > 0 and math.isfinite(m["rollout_logprob_mismatch_mean"])
        assert rec.stats.responses == 8  # type: ignore[union-attr]
        print(f"GRPO step {step} on vLLM: push {m['rollout_push_bytes'] / 1e6:.2f} MB, export "
              f"{m['rollout_push_export_seconds']:.2f} s, reload {m['rollout_push_reload_seconds']:.2f} s; mismatch "
              f"mean {m['rollout_logprob_mismatch_mean']:.3e} max {m['rollout_logprob_mismatch_max']:.3e} corr "
              f"{m['rollout_logprob_mismatch_corr']:.4f}")
    assert _get(server.url + "/weight_info")["weight_version"] == "2"
    assert sorted(p.name for p in (root / "grpo-weights").iterdir()) == ["policy-00000002"]  # keepWeights 1


def _opd_steps_roll_out_on_the_server(server: VLLMServer, hf: Path, root: Path) -> None:
    """mode opd with rollout.engine vllm: the student's samples come from the server, pushed before each step; the
    SFT export is both the student's start and the teacher, so the reverse KL starts at 0 (up to vLLM's sampling
    being the student's: the KL is computed by trex on the sampled tokens)."""
    prompts = root / "opd-prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"n{n}", "question": _question(n), "answer": n}) + "\n"
                               for n in (1, 2)))
    cfg = load_section(TrainerConfig, {
        **BASE, "mode": "opd", "maxSteps": 2,
        "optimizer": {"schedule": {"warmupSteps": 0, "decay": "none"}, "adamw": {"lr": 0.001}},
        "data": {"train": str(prompts), "tokenizer": {"path": str(hf / "tokenizer.json")}},
        "opd": {"teachers": [{"path": str(hf)}], "promptsPerStep": 2, "samplesPerPrompt": 2,
                "sampling": {"maxNewTokens": 8}, "chunkSize": 64},
        "rollout": {"engine": "vllm", "servers": [server.url], "maxModelLen": 256,
                    "weightsDir": str(root / "opd-weights")},
        "checkpoint": {"dir": str(root / "opd"), "intervalSteps": 1000, "initFromHf": str(hf), "exportHf": False}})
    res = Trainer(cfg, root, measure_peak=False, log=lambda _m: None).run()
    assert [r.metrics["rollout_policy_version"] for r in res.history] == [0, 1]
    assert res.history[0].parts["opd"] == pytest.approx(0.0, abs=1e-6)  # student = teacher at step 0
    assert all(math.isfinite(r.loss) for r in res.history)
    assert _get(server.url + "/weight_info")["weight_version"] == "1"
    # the step's rollouts are logged as GRPO's: the last step's log alone is kept, every token tagged with version 1
    logs = sorted((root / "opd" / "rollouts").iterdir())
    assert [p.name for p in logs] == ["step-00000001-rank-00000.wal"]
    _, records, _ = read_log(logs[0].read_bytes(), logs[0])
    samples = group_records(records, logs[0])
    assert sorted(samples) == [4, 5, 6, 7]  # step 1's sample ids: 2 prompts x 2 samples after step 0's four
    assert {r.policy_version for r in records} == {1} and len(records) == sum(len(s.tokens) for s in samples.values())
    last = res.history[-1].metrics
    assert last["opd_response_length"] * 4 == len(records) > 0
    assert last["rollout_requests_cut"] == 0 and last["opd_resumed_tokens"] == 0


def _grpo_learns_through_the_server(server: VLLMServer, hf: Path, root: Path) -> None:
    """test_grpo_learns's task and GRPO settings with rollout.engine vllm: the mean reward rises from about one in
    ten to at least one half, the in-process test's criterion."""
    prompts = root / "learn-prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"n{n}", "question": _question(n), "answer": n}) + "\n"
                               for n in NUMBERS))
    cfg = load_section(TrainerConfig, {
        **BASE, "mode": "grpo", "maxSteps": GRPO_STEPS,
        "optimizer": {"schedule": {"warmupSteps": 5, "decay": "none"}, "muon": {"lr": 0.001}, "adamw": {"lr": 0.002}},
        "data": {"train": str(prompts), "microBatchSize": 32, "tokenizer": {"path": str(hf / "tokenizer.json")}},
        "grpo": {"promptsPerStep": 4, "groupSize": 8, "maxNewTokens": 12, "klCoef": 0.0},
        "rollout": {"engine": "vllm", "servers": [server.url], "maxModelLen": 256,
                    "weightsDir": str(root / "learn-weights")},
        "checkpoint": {"dir": str(root / "learn"), "intervalSteps": 1000, "initFromHf": str(hf), "exportHf": False}})
    res = Trainer(cfg, root, measure_peak=False, log=lambda _m: None, verifier=PrintsTheNumber()).run()
    rewards = [r.stats.reward_mean for r in res.history]  # type: ignore[union-attr]
    print("GRPO on vLLM, reward per step:", " ".join(f"{x:.2f}" for x in rewards))
    start, end = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    assert start < 0.25, rewards
    assert end >= 0.5, rewards


def _a_spawned_server_that_dies_is_restarted(venv: Path, root: Path) -> None:
    """rollout.spawnLocal: the engine starts its own server from the first push's export (policy version 3). kill -9 of
    that server's process group mid-rollout (temperature 1, segments of 16, once every sample has logged more than one
    segment and one is inside a segment): the engine restarts it on the same port from the newest pushed weights
    folder, tagged 3 again, and the rollout goes on from its log in the same call; its tokens equal an uninterrupted
    run's made on the first server before the kill, and the restart is counted once (rollout_server_restarts)."""
    model, seg, n, budget, seed = _model(23), 16, 8, 64, 5
    cfg = RolloutConfig(engine="vllm", spawn_local=True, vllm_venv=str(venv), max_model_len=256, segment_tokens=seg,
                        retry_seconds=900, weights_dir=str(root / "spawn-weights"))
    rollouts = VLLMRollouts(cfg, root / "spawn")
    try:
        t0 = time.monotonic()
        rollouts.ensure(lambda d: export_hf(model, _tokenizer(), d), 3)
        first = rollouts.server
        assert first is not None and first.proc is not None
        eng = rollouts.engine
        print(f"spawnLocal server ready in {time.monotonic() - t0:.1f} s")
        prompts, params = _prompts(n), SamplingParams(temperature=1.0, max_new_tokens=budget)
        ref = eng.generate(prompts, params, seed)
        log, out = root / "spawn.wal", dict[str, list[Rollout]]()
        worker = threading.Thread(
            target=lambda: out.update(got=eng.generate(prompts, params, seed, wal=RolloutLog(log))))
        worker.start()
        while not _mid_segment(log, n, seg):
            assert worker.is_alive(), "the rollout ended before the kill"
            time.sleep(0.01)
        os.killpg(first.proc.pid, signal.SIGKILL)
        t1 = time.monotonic()
        worker.join(900)
        got, st = out["got"], eng.stats
        print(f"spawnLocal kill -9: restarted and the rollout done in {time.monotonic() - t1:.1f} s, {st.cuts} requests "
              f"cut, {st.kept} tokens kept, {st.replayed} re-drawn")
        assert rollouts.restarts == 1 and rollouts.server is not first and rollouts.server is not None
        assert rollouts.server.port == first.port and first.proc.poll() is not None
        assert [r.tokens for r in got] == [r.tokens for r in ref]
        assert [x for r in got for x in r.logprobs] == pytest.approx([x for r in ref for x in r.logprobs], abs=1e-4)
        assert st.cuts > 0 and st.kept > 0 and st.diverged == 0
        assert all(r.versions == [3] * budget and not any(r.stale) for r in got)
        assert _logged(log) == {r.sample_id: r.tokens for r in got}
        assert _get(rollouts.server.url + "/weight_info")["weight_version"] == "3"
        metrics, series = rollout_outcome(rollouts)
        assert metrics["rollout_server_restarts"] == 1
        assert Series("rollout_server_restarts_total", 1.0, counter=True) in series
        assert rollout_outcome(rollouts)[0]["rollout_server_restarts"] == 0  # counted once
    finally:
        rollouts.close()
