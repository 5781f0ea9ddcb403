"""Rollouts on vLLM servers fed with the trainer's weights (``rollout.engine: vllm``).

Sampling: one ``/v1/completions`` request per sample with the prompt as token ids, the sample's seed
(:func:`~trex.trainer.rollout.external.request_seed`), ``logprobs`` and ``return_tokens_as_token_ids``, so every
token comes back as an id with its behaviour log-prob; requests go round-robin over the servers. The servers run
with ``--logprobs-mode processed_logprobs``: the log-prob after temperature, log_softmax(logits / T), which is what
trex's in-process engine records and the loss recomputes (vLLM's default raw_logprobs ignore the temperature).

Weights: :meth:`VLLMEngine.push` pauses every server (``/pause?mode=wait``: in-flight requests finish under the old
weights), has the trainer write its sharded Hugging Face export into a step folder the servers can read, reloads it
on every server (``/collective_rpc`` ``reload_weights``), tags the version (``/update_weight_version``) and resumes.
Each request is tagged with the version the servers held when it was sent; a rollout's policy version is the newest
version among its samples, so a sample drawn before a push that happened during the rollout is marked stale.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trex.trainer.config import RolloutConfig
from trex.trainer.rollout.engine import Rollout, finish_reason
from trex.trainer.rollout.external import request_seed, token_ids
from trex.trainer.rollout.sampling import SamplingParams
from trex.trainer.rollout.vllm_server import VLLMServer, post_json
from trex.trainer.rollout.weight_transfer import TransferPush, WeightsSource

if TYPE_CHECKING:
    from trex.trainer.objective import RunContext

STEP_PREFIX = "policy-"


@dataclass(frozen=True)
class PushStats:
    """One weight push: the version, the export's size and where the time went."""

    version: int
    bytes: int
    export_seconds: float
    reload_seconds: float


def folder_bytes(path: Path) -> int:
    """Bytes of the safetensors files under ``path``."""
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


class VLLMEngine:
    """The trainer's side of one or more vLLM servers (base URLs, e.g. http://127.0.0.1:8000)."""

    def __init__(self, servers: Sequence[str], weights_dir: Path, *, concurrency: int = 64,
                 timeout_s: float = 600.0, keep: int = 1) -> None:
        if not servers:
            raise ValueError("rollout.servers: at least one vLLM server URL is needed")
        self.servers = [s.rstrip("/") for s in servers]
        self.weights_dir, self.concurrency, self.timeout_s, self.keep = weights_dir, concurrency, timeout_s, keep
        self.version: int | None = None
        """The policy version every server holds (None before the first push)."""
        self._lock = threading.Lock()
        self.pushes: list[PushStats] = []

    def _all(self, path: str, body: dict[str, object] | None = None) -> None:
        for s in self.servers:
            post_json(s + path, body, self.timeout_s)

    def push(self, export: Callable[[Path], Path], version: int) -> PushStats:
        """Write the weights of ``version`` with ``export`` (the trainer's collective Hugging Face export into the
        given folder) and load them on every server, paused meanwhile; older step folders beyond ``keep`` go."""
        folder = self.weights_dir / f"{STEP_PREFIX}{version:08d}"
        t0 = time.perf_counter()
        export(folder)
        t1 = time.perf_counter()
        with self._lock:
            self._all("/pause?mode=wait")
            try:
                self._all("/collective_rpc", {"method": "reload_weights",
                                              "kwargs": {"weights_path": str(folder.resolve())}})
                self._all("/update_weight_version", {"new_version": str(version)})
                self.version = version
            finally:
                self._all("/resume")
        t2 = time.perf_counter()
        old = sorted(p for p in self.weights_dir.glob(f"{STEP_PREFIX}*") if p.is_dir() and p != folder)
        for p in old[:max(0, len(old) - (self.keep - 1))]:
            shutil.rmtree(p, ignore_errors=True)
        stats = PushStats(version, folder_bytes(folder), t1 - t0, t2 - t1)
        self.pushes.append(stats)
        return stats

    def _request(self, i: int, prompt: list[int], params: SamplingParams, seed: int, sid: int,
                 max_tokens: int) -> tuple[int, dict[str, object]]:
        body: dict[str, object] = {
            "model": "policy", "prompt": prompt, "max_tokens": max_tokens, "temperature": params.temperature,
            "top_p": params.top_p, "top_k": params.top_k if params.top_k > 0 else -1, "seed": request_seed(seed, sid),
            "logprobs": 0, "return_tokens_as_token_ids": True, "stop_token_ids": list(params.stop_tokens),
            "skip_special_tokens": False, "ignore_eos": not params.stop_tokens, "n": 1}
        with self._lock:  # no request is sent while a push holds the servers
            version = -1 if self.version is None else self.version
        answer = post_json(self.servers[i % len(self.servers)] + "/v1/completions", body, self.timeout_s)
        assert isinstance(answer, dict)
        return version, answer

    def score(self, prompt: Sequence[int], tokens: Sequence[int], server: int = 0) -> list[float]:
        """The server's log-probs of ``tokens`` after ``prompt`` (teacher-forced, temperature 1): what it would have
        recorded had it sampled them."""
        body = {"model": "policy", "prompt": list(prompt) + list(tokens), "max_tokens": 1, "echo": True,
                "logprobs": 0, "temperature": 1.0, "return_tokens_as_token_ids": True}
        answer = post_json(self.servers[server] + "/v1/completions", body, self.timeout_s)
        assert isinstance(answer, dict)
        lps = answer["choices"][0]["logprobs"]["token_logprobs"]
        return [float(x) for x in lps[len(prompt):len(prompt) + len(tokens)]]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int, *,
                 sample_ids: Sequence[int] | None = None, max_seq_len: int | None = None,
                 on_answer: Callable[[int], None] | None = None) -> list[Rollout]:
        """One response per prompt (repeat a prompt for G samples), in order, as the in-process engine returns them:
        tokens, behaviour log-probs from the server, and per token the policy version it was sampled under.
        on_answer(k) runs when prompt k's answer arrives (in a worker thread)."""
        ids = list(range(len(prompts))) if sample_ids is None else list(sample_ids)
        if len(ids) != len(prompts) or len(set(ids)) != len(ids):
            raise ValueError("sample_ids must be distinct, one per prompt")
        budgets = [params.max_new_tokens if max_seq_len is None else min(params.max_new_tokens, max_seq_len - len(p))
                   for p in prompts]
        def one(k: int) -> tuple[int, dict[str, object]]:
            answer = self._request(k, list(prompts[k]), params, seed, ids[k], budgets[k])
            if on_answer is not None:
                on_answer(k)
            return answer

        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(prompts)))) as pool:
            answers = list(pool.map(one, range(len(prompts))))
        newest = max(v for v, _ in answers)
        out = []
        for prompt, sid, budget, (version, answer) in zip(prompts, ids, budgets, answers, strict=True):
            choice = answer["choices"][0]  # type: ignore[index]
            lp = choice["logprobs"]
            tokens = token_ids(lp["tokens"])
            if tokens is None:
                raise RuntimeError("the vLLM server did not return token ids (return_tokens_as_token_ids)")
            r = Rollout(sample_id=sid, prompt=list(prompt), tokens=tokens,
                        logprobs=[float(x) for x in lp["token_logprobs"]], versions=[version] * len(tokens),
                        policy_version=newest)
            r.finish_reason = finish_reason(r.tokens, budget - len(r.tokens), params)
            out.append(r)
        return out


class VLLMRollouts:
    """The vLLM engine of one training run (rollout.engine: vllm): the servers it connects to (or the one it spawns
    on 127.0.0.1, rollout.spawnLocal), and the push of the trainer's weights whenever a step's policy version is not
    the one the servers hold. Every rank exports its shards; rank 0 alone talks to the servers, the others wait."""

    def __init__(self, cfg: RolloutConfig, ckpt_dir: Path, rank: int = 0, world: int = 1) -> None:
        if cfg.spawn_local and world > 1:
            raise ValueError("rollout.spawnLocal: only a single-process run spawns its own server (list servers)")
        self.cfg, self.rank, self.world = cfg, rank, world
        weights = Path(cfg.weights_dir) if cfg.weights_dir else ckpt_dir / "rollout-weights"
        self.server: VLLMServer | None = None
        self.engine = VLLMEngine(cfg.servers or ["http://127.0.0.1:0"], weights, concurrency=cfg.concurrency,
                                 timeout_s=cfg.timeout_s, keep=cfg.keep_weights)
        self.transfer = None if cfg.weight_push == "disk" else TransferPush(
            self.engine, cfg.transfer_bucket_bytes, rank, world)
        """rollout.weightPush transfer: pushes through vLLM's weight-transfer API (trex.trainer.rollout.weight_transfer)."""
        self.start_seconds = 0.0
        self.max_seq_len = cfg.max_model_len
        """Prompt + response tokens the servers take (rollout.maxModelLen)."""

    def ensure(self, export: Callable[[Path], Path], version: int,
               weights: WeightsSource | None = None) -> PushStats | None:
        """Make the servers hold ``version`` (export + reload, a transfer of ``weights`` with rollout.weightPush
        transfer, or the first server start); None when they do."""
        if self.engine.version == version:
            return None
        if self.transfer is not None:  # rollout.weightPush: transfer (every rank; spawnLocal is refused with it)
            if weights is None:
                raise RuntimeError("rollout.weightPush transfer: the run context has no weights to send")
            return self.transfer.push(weights, version)
        if self.cfg.spawn_local and self.server is None:
            folder = self.engine.weights_dir / f"{STEP_PREFIX}{version:08d}"
            t0 = time.perf_counter()
            export(folder)
            t1 = time.perf_counter()
            self.server = VLLMServer(folder, venv=Path(self.cfg.vllm_venv), max_model_len=self.cfg.max_model_len,
                                     log_path=self.engine.weights_dir / "vllm-server.log").start()
            self.start_seconds = self.server.wait_ready()
            self.engine.servers = [self.server.url]
            self.engine.version = version
            post_json(self.server.url + "/update_weight_version", {"new_version": str(version)}, self.cfg.timeout_s)
            return PushStats(version, folder_bytes(folder), t1 - t0, self.start_seconds)
        if self.world > 1:
            import torch.distributed as dist

            stats = self.engine.push(export, version) if self.rank == 0 else None
            dist.barrier()
            self.engine.version = version
            return stats
        return self.engine.push(export, version)

    def close(self) -> None:
        """Stop the server this run spawned (connected servers stay up); leave the transfer group."""
        if self.transfer is not None:
            self.transfer.close()
        if self.server is not None:
            self.server.stop()
            self.server = None


def run_engine(ctx: RunContext) -> VLLMRollouts | None:
    """The run's vLLM engine when rollout.engine is vllm (modes grpo and opd), else None."""
    if ctx.cfg.rollout.engine != "vllm":
        return None
    world = ctx.dims.dp * ctx.dims.tp if ctx.meshes is not None else 1
    return VLLMRollouts(ctx.cfg.rollout, ctx.ckpt_dir, ctx.rank, world)


def push_for_step(engine: VLLMRollouts, ctx: RunContext, step: int) -> dict[str, float]:
    """The servers get the weights of policy version ``step`` (the model as it is now) unless they hold them; the
    push's size and seconds as step metrics (none when nothing moved)."""
    if ctx.export is None:
        raise RuntimeError("rollout.engine vllm: the run context has no export (the model is not built)")
    st = engine.ensure(ctx.export, step, ctx.weights)
    if st is None:
        return {}
    return {"rollout_push_bytes": float(st.bytes), "rollout_push_export_seconds": st.export_seconds,
            "rollout_push_reload_seconds": st.reload_seconds, "rollout_policy_version": float(step)}
