"""Rollout decode throughput on CPU: KV-cache decoding against recompute-everything, and the WAL's cost.

For each attention kind (mla, and V4's csa / hca / sliding stack) a small fp32 model decodes
``--new-tokens`` tokens for ``--batch`` prompts:

* cache: ``trex.trainer.rollout.generate`` (one prefill, then one cached token per row per step);
* recompute: the same sampler, but every step runs the full forward over prompt + response so far.

Goals: cache / recompute >= 5x at 512 new tokens; decoding with a RolloutLog (fsync every
``--fsync-every`` tokens) within 5 % of decoding without one. Timings on a shared host are noisy:
runs with and without the log alternate (ABBA) and each figure is the median of ``--repeats`` runs;
``time_in_wal_pct`` is the share of a logged run's wall time spent inside the log's writes and
fsyncs, a direct measure that host load cannot inflate the way it can the end-to-end ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from trex.trainer.model import DeepSeekModel, ModelArgs, build_model_from_args
from trex.trainer.rollout import RolloutLog, SamplingParams, generate
from trex.trainer.rollout.sampling import sample, uniform

KINDS: dict[str, dict[str, Any]] = {
    "mla": dict(attention="mla", q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                v_head_dim=32),
    "csa": dict(attention="csa", q_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=48,
                csa_window=64, csa_compress_every=4, hca_compress_every=16, csa_top_k=16, csa_indexer_dim=32,
                o_lora_rank=32, layer_types=["hca", "csa", "sliding", "csa"]),
}


def build(kind: str) -> DeepSeekModel:
    """The benchmark model: 4 layers, hidden 128, 8 experts (2 per token), one MTP module, fp32."""
    args = ModelArgs(**KINDS[kind], vocab_size=2048, hidden_size=128, num_layers=4, num_heads=4,
                     intermediate_size=256, moe_intermediate_size=64, max_seq_len=2048, mtp_depth=1)
    return build_model_from_args(args, dtype=torch.float32, seed=0).eval()


@torch.no_grad()
def recompute(model: DeepSeekModel, prompts: list[list[int]], params: SamplingParams, seed: int) -> list[list[int]]:
    """Decode without a cache: a full forward over every row's whole context at each step."""
    ctx = torch.tensor(prompts)
    out: list[list[int]] = [[] for _ in prompts]
    for pos in range(params.max_new_tokens):
        result = model(ctx, logits=True)
        assert result.logits is not None
        tokens, _ = sample(result.logits[:, -1], params, [uniform(seed, i, pos) for i in range(len(prompts))])
        for row, tok in zip(out, tokens.tolist(), strict=True):
            row.append(tok)
        ctx = torch.cat([ctx, tokens[:, None]], dim=1)
    return out


class TimedLog(RolloutLog):
    """A RolloutLog that adds up the seconds spent writing and fsyncing."""

    def __init__(self, path: Path, fsync_every: int) -> None:
        super().__init__(path, fsync_every=fsync_every)
        self.seconds = 0.0

    def append(self, records: Any) -> None:
        start = time.perf_counter()
        super().append(records)
        self.seconds += time.perf_counter() - start

    def close(self) -> None:
        start = time.perf_counter()
        super().close()
        self.seconds += time.perf_counter() - start


def timed(fn: Any) -> tuple[float, Any]:
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def run(kind: str, batch: int, prompt_len: int, new_tokens: int, repeats: int, fsync_every: int) -> dict[str, Any]:
    """One attention kind's figures."""
    model = build(kind)
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, model.args.vocab_size, (batch, prompt_len), generator=gen).tolist()
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=new_tokens)
    n_tokens = batch * new_tokens
    generate(model, prompts, SamplingParams(max_new_tokens=8), seed=0)  # warm-up
    plain, logged, in_log = [], [], []
    ref = generate(model, prompts, params, seed=7)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):  # ABBA order: drift on a shared host hits both sides alike
            for with_wal in (False, True) if i % 2 == 0 else (True, False):
                if not with_wal:
                    plain.append(timed(lambda: generate(model, prompts, params, seed=7))[0])
                    continue
                log = TimedLog(Path(tmp) / f"r{i}.wal", fsync_every=fsync_every)
                t, with_log = timed(lambda log=log: generate(model, prompts, params, seed=7, wal=log))
                logged.append(t)
                in_log.append(log.seconds / t)
                assert [r.tokens for r in with_log] == [r.tokens for r in ref]
    t_recompute, tokens = timed(lambda: recompute(model, prompts, params, seed=7))
    agree = sum(a == b for r, row in zip(ref, tokens, strict=True) for a, b in zip(r.tokens, row, strict=True))
    cache_tps = n_tokens / statistics.median(plain)
    log_tps = n_tokens / statistics.median(logged)
    recompute_tps = n_tokens / t_recompute
    return {
        "kind": kind, "batch": batch, "prompt": prompt_len, "new_tokens": new_tokens,
        "cache_tok_s": round(cache_tps, 1), "recompute_tok_s": round(recompute_tps, 1),
        "speedup": round(cache_tps / recompute_tps, 2),
        "wal_tok_s": round(log_tps, 1), "wal_overhead_pct": round(100 * (cache_tps / log_tps - 1), 2),
        "time_in_wal_pct": round(100 * statistics.median(in_log), 3),
        "fsync_every": fsync_every,
        "tokens_agree_with_recompute": round(agree / n_tokens, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="mla,csa")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--fsync-every", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for kind in args.kinds.split(","):
        result = run(kind, args.batch, args.prompt, args.new_tokens, args.repeats, args.fsync_every)
        ok = result["speedup"] >= 5 and min(result["wal_overhead_pct"], result["time_in_wal_pct"]) <= 5
        print(json.dumps({**result, "goals_met": ok}), flush=True)


if __name__ == "__main__":
    main()
