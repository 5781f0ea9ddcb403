"""Rollouts on vLLM servers fed with the trainer's weights (``rollout.engine: vllm``), preemptible through the token
log.

Sampling: each sample is generated in segments of ``segment`` tokens (rollout.segmentTokens; 0: one segment), one
streamed ``/v1/completions`` request per segment with prompt + the response so far as token ids, the remaining
budget of the segment as ``max_tokens``, a seed keyed by (seed, sample id, segment start) (:func:`segment_seed`),
``logprobs`` and ``return_tokens_as_token_ids``, so every token comes back as an id with its behaviour log-prob; the
samples go round-robin over the servers. The servers run with ``--logprobs-mode processed_logprobs``: the log-prob
after temperature, log_softmax(logits / T), which is what trex's in-process engine records and the loss recomputes
(vLLM's default raw_logprobs ignore the temperature).

Preemption: with a :class:`~trex.trainer.rollout.wal.RolloutLog` every token is logged as it streams in (sample id,
position, token, log-prob, policy version). A request that is cut (the server killed or restarted, the connection
lost, a timeout, a server error, a stream that ends early) is sent again once a server answers ``/health`` (within
``retry_s``, else a RuntimeError naming the server), and a rollout rerun on the same log (a restarted trainer) takes
the logged tokens as they are: a sample continues from what it holds (:func:`segment_request`), never from scratch.
What is exact: vLLM's seeded sampling draws one number per decode step from a generator seeded once per request, so
the draws depend on the request's seed and the step within the request, not on the position. Segments make the
seed a function of the position at which a request starts. At temperature 0 a continuation starts at the end of the
log and its tokens are an uninterrupted run's. At temperature > 0 a continuation restarts the cut segment at its
first position with that segment's seed; the server re-draws the logged tokens of that segment (at most segment - 1
per sample), they are checked against the log and not logged again, and from the end of the log on the draws are
the uninterrupted run's: the result equals an uninterrupted run's tokens whenever the server computes the same
logits for the same tokens (same weights; vLLM's CPU kernels gave equal logits across batch compositions here).
What is not exact: a replayed token that differs from the logged one (other weights after a push, or a near-tie
broken the other way by other numerics) ends the replay; the log's tokens stand and the sample continues from the
end of the log with a seed keyed by that position (a valid sample of the policy, counted as ``diverged``, not the
uninterrupted run's). In either case the tokens kept are those the log holds, so an interruption does not bias which
samples finish (the length bias a resend from scratch has).

Weights and versions: :meth:`VLLMEngine.push` writes the trainer's sharded Hugging Face export into a step folder the
servers can read, then, holding the engine's version gate exclusively (it waits for the segment requests in flight
and holds new ones back), pauses every server (``/pause?mode=wait``), reloads the folder on every server
(``/collective_rpc`` ``reload_weights``), tags the version (``/update_weight_version``) and resumes. Every request
holds the gate shared from before it is sent until its stream ends, so all the tokens of one request were sampled
under the version it is tagged with; a push between two segments of a sample tags the later tokens with the new
version. A rollout's policy version is the newest version among its tokens (logged ones included), so tokens drawn
before a push during the rollout, or logged before a restart that came back under a newer version, are stale (the
loss masks them).

A server the trainer spawned itself (rollout.spawnLocal) whose process has exited is restarted by the trainer while
the cut requests wait for it (:meth:`VLLMRollouts.revive`): from the newest pushed weights folder, tagged with the same
version, on the same port, so the requests continue from the log as after any cut. Servers the trainer does not own
(listed URLs, the operator's Deployments) are only waited for: Kubernetes restarts them.
"""

from __future__ import annotations

import http.client
import json
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from trex.trainer.config import RolloutConfig
from trex.trainer.objective import Series
from trex.trainer.rollout.engine import Rollout, finish_reason, log_header
from trex.trainer.rollout.external import token_ids
from trex.trainer.rollout.sampling import SamplingParams, uniform
from trex.trainer.rollout.vllm_server import VLLMServer, post_json
from trex.trainer.rollout.wal import LoggedSample, Record, RolloutLog
from trex.trainer.rollout.weight_transfer import PushStats, TransferPush, WeightsSource

if TYPE_CHECKING:
    from trex.trainer.objective import RunContext

STEP_PREFIX = "policy-"


@dataclass
class RolloutStats:
    """What one :meth:`VLLMEngine.generate` call sent and kept."""

    requests: int = 0
    """Completion requests sent (segments, continuations and retries)."""
    cuts: int = 0
    """Requests cut (connection lost, server error, stream ended early) and sent again."""
    resumed: int = 0
    """Tokens read from the log when the rollout opened it (an earlier run's)."""
    kept: int = 0
    """Tokens a continuation kept instead of sampling them again: those logged before a cut or read from the log."""
    prefix_tokens: int = 0
    """Response tokens sent back as prompt prefix by requests that continue a cut or logged sample."""
    replayed: int = 0
    """Logged tokens the server drew again to realign a cut segment's seed stream (temperature > 0), found equal."""
    diverged: int = 0
    """Samples whose replay drew another token than the log (continued from the log's end, not exactly)."""


class Cut(Exception):
    """A completion request that ended before its answer did (the server went away, failed or timed out)."""


def folder_bytes(path: Path) -> int:
    """Bytes of the safetensors files under ``path``."""
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def segment_seed(seed: int, sample_id: int, start: int) -> int:
    """The server seed (31 bits) of the request that samples a response from position ``start``; position 0's is
    :func:`~trex.trainer.rollout.external.request_seed`."""
    return int(uniform(seed, sample_id, -1 - start) * 2**31)


def segment_request(prompt: Sequence[int], tokens: Sequence[int], params: SamplingParams, seed: int, sample_id: int,
                    budget: int, segment: int, *, replay: bool = True) -> tuple[int, dict[str, object]]:
    """The next request of a sample that holds ``tokens`` (sampled or logged) of a ``budget``-token response:
    (the position it starts at, its body). It samples up to the end of the segment the start lies in (segments of
    ``segment`` tokens; 0: one), prompt + tokens before the start as the prompt, seeded by the start. At
    temperature 0, or with ``replay`` off, it starts at the end of ``tokens``; at temperature > 0 at the start of
    the segment (the server re-draws the tokens after it, for the caller to check against ``tokens``)."""
    done = len(tokens)
    if not 0 <= done < budget:
        raise ValueError(f"sample {sample_id}: {done} tokens held of a {budget}-token budget: nothing to request")
    if segment < 0:
        raise ValueError(f"segment must be >= 0 (0 = one segment per response), got {segment}")
    if params.temperature == 0 or not replay:
        start = done
    else:
        start = done - done % segment if segment else 0
    end = min(budget, (start // segment + 1) * segment) if segment else budget
    body: dict[str, object] = {
        "model": "policy", "prompt": [*prompt, *tokens[:start]], "max_tokens": end - start,
        "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k if params.top_k > 0 else -1,
        "seed": segment_seed(seed, sample_id, start), "logprobs": 0, "return_tokens_as_token_ids": True,
        "stop_token_ids": list(params.stop_tokens), "skip_special_tokens": False,
        "ignore_eos": not params.stop_tokens, "n": 1, "stream": True}
    return start, body


def stream_completion(url: str, body: dict[str, object],
                      timeout_s: float) -> Generator[tuple[int, float], None, None]:
    """(token id, log-prob) of a streamed completion as they arrive; Cut when the answer breaks off, RuntimeError
    naming the server for a request it refuses (HTTP 4xx)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        resp = urllib.request.urlopen(req, timeout=timeout_s)
    except urllib.error.HTTPError as e:
        if e.code < 500:
            raise RuntimeError(f"POST {url}: HTTP {e.code}: {e.read()[:500]!r}") from None
        raise Cut(f"POST {url}: HTTP {e.code}") from None
    except OSError as e:
        raise Cut(f"POST {url}: {e}") from None
    try:
        with resp:
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    raise Cut(f"POST {url}: {str(chunk['error'])[:300]}")
                lp = chunk["choices"][0].get("logprobs") or {}
                ids = token_ids(lp.get("tokens") or [])
                if ids is None:
                    raise RuntimeError(f"{url}: the vLLM server did not return token ids (return_tokens_as_token_ids)")
                yield from zip(ids, (float(x) for x in lp["token_logprobs"]), strict=True)
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:
        raise Cut(f"POST {url}: {type(e).__name__}: {e}") from None
    raise Cut(f"POST {url}: the stream ended before [DONE]")


def healthy(url: str) -> bool:
    """Whether the server at ``url`` answers ``/health`` with 200."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return bool(r.status == 200)
    except (OSError, http.client.HTTPException):
        return False


class VersionGate:
    """The pause/version protocol between pushes and requests: a request holds the gate shared from before it is
    sent until its answer ends and reads the version the servers hold; a push holds it exclusively (it waits for the
    requests in flight, and requests that come after it wait for it)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._waiting = 0
        self.version: int | None = None
        """The policy version every server holds (None before the first push)."""

    @contextmanager
    def reading(self) -> Iterator[int]:
        """Hold the gate for one request; yields the version its tokens are sampled under (-1 before any push)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._writing and not self._waiting)
            self._readers += 1
            version = -1 if self.version is None else self.version
        try:
            yield version
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the gate for a push (no request in flight meanwhile)."""
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._writing and self._readers == 0)
            self._waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class VLLMEngine:
    """The trainer's side of one or more vLLM servers (base URLs, e.g. http://127.0.0.1:8000)."""

    def __init__(self, servers: Sequence[str], weights_dir: Path, *, concurrency: int = 64,
                 timeout_s: float = 600.0, keep: int = 1, segment: int = 64, retry_s: float = 600.0) -> None:
        if not servers:
            raise ValueError("rollout.servers: at least one vLLM server URL is needed")
        if segment < 0:
            raise ValueError(f"rollout.segmentTokens must be >= 0 (0 = one request per response), got {segment}")
        self.servers = [s.rstrip("/") for s in servers]
        self.weights_dir, self.concurrency, self.timeout_s, self.keep = weights_dir, concurrency, timeout_s, keep
        self.segment, self.retry_s = segment, retry_s
        self.gate = VersionGate()
        self.pushes: list[PushStats] = []
        self.stats = RolloutStats()
        """The last generate call's requests, cuts and kept tokens."""
        self.revive: Callable[[float], None] | None = None
        """Called (with the wait's deadline, time.monotonic) while a cut request waits for a server: restarts a server
        the trainer owns whose process has exited (:meth:`VLLMRollouts.revive`; None: servers are only waited for)."""

    @property
    def version(self) -> int | None:
        """The policy version every server holds (None before the first push)."""
        return self.gate.version

    @version.setter
    def version(self, value: int | None) -> None:
        self.gate.version = value

    def _all(self, path: str, body: dict[str, object] | None = None) -> None:
        for s in self.servers:
            post_json(s + path, body, self.timeout_s)

    def push(self, export: Callable[[Path], Path], version: int) -> PushStats:
        """Write the weights of ``version`` with ``export`` (the trainer's collective Hugging Face export into the
        given folder) and load them on every server, paused and with no request in flight meanwhile; older step
        folders beyond ``keep`` go."""
        folder = self.weights_dir / f"{STEP_PREFIX}{version:08d}"
        t0 = time.perf_counter()
        export(folder)
        t1 = time.perf_counter()
        with self.gate.writing():
            self._all("/pause?mode=wait")
            try:
                self._all("/collective_rpc", {"method": "reload_weights",
                                              "kwargs": {"weights_path": str(folder.resolve())}})
                self._all("/update_weight_version", {"new_version": str(version)})
                self.gate.version = version
            finally:
                self._all("/resume")
        t2 = time.perf_counter()
        old = sorted(p for p in self.weights_dir.glob(f"{STEP_PREFIX}*") if p.is_dir() and p != folder)
        for p in old[:max(0, len(old) - (self.keep - 1))]:
            shutil.rmtree(p, ignore_errors=True)
        stats = PushStats(version, folder_bytes(folder), t1 - t0, t2 - t1)
        self.pushes.append(stats)
        return stats

    def score(self, prompt: Sequence[int], tokens: Sequence[int], server: int = 0) -> list[float]:
        """The server's log-probs of ``tokens`` after ``prompt`` (teacher-forced, temperature 1): what it would have
        recorded had it sampled them."""
        body = {"model": "policy", "prompt": list(prompt) + list(tokens), "max_tokens": 1, "echo": True,
                "logprobs": 0, "temperature": 1.0, "return_tokens_as_token_ids": True}
        answer = post_json(self.servers[server] + "/v1/completions", body, self.timeout_s)
        assert isinstance(answer, dict)
        lps = answer["choices"][0]["logprobs"]["token_logprobs"]
        return [float(x) for x in lps[len(prompt):len(prompt) + len(tokens)]]

    def _server_back(self, first: int, why: str, sample_id: int, held: int, deadline: float) -> int:
        """The index of a server that answers /health again, trying ``first`` first, by ``deadline`` (retry_s after
        the sample's first cut without progress); RuntimeError naming the server otherwise."""
        while True:
            if self.revive is not None:
                self.revive(deadline)
            up = next((i for i in ((first + k) % len(self.servers) for k in range(len(self.servers)))
                       if healthy(self.servers[i])), None)
            if time.monotonic() >= deadline:
                what = "did not come back" if up is None else "kept cutting requests"
                raise RuntimeError(f"vLLM server {self.servers[first]} {what} within rollout.retrySeconds="
                                   f"{self.retry_s:g} s after a cut request (sample {sample_id}, {held} tokens "
                                   f"logged): {why}")
            if up is not None:
                return up
            time.sleep(0.5)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seed: int, *,
                 sample_ids: Sequence[int] | None = None, max_seq_len: int | None = None,
                 wal: RolloutLog | None = None, on_answer: Callable[[int], None] | None = None,
                 on_segment: Callable[[int, int], None] | None = None) -> list[Rollout]:
        """One response per prompt (repeat a prompt for G samples), in order, as the in-process engine returns them:
        tokens, behaviour log-probs from the server, and per token the policy version it was sampled under. With
        ``wal`` every token is logged as it arrives and the tokens an earlier run logged are kept (the module's
        docstring says what is exact). on_segment(k, n) runs after each of prompt k's requests (n tokens held),
        on_answer(k) when prompt k's response is complete (both in a worker thread, the gate released)."""
        ids = list(range(len(prompts))) if sample_ids is None else list(sample_ids)
        if len(ids) != len(prompts) or len(set(ids)) != len(ids):
            raise ValueError("sample_ids must be distinct, one per prompt")
        budgets = [params.max_new_tokens if max_seq_len is None else min(params.max_new_tokens, max_seq_len - len(p))
                   for p in prompts]
        logged: dict[int, LoggedSample] = {}
        if wal is not None:
            logged = wal.open(log_header(prompts, ids, params, seed))
        self.stats = stats = RolloutStats()
        lock = threading.Lock()
        rollouts = []
        for prompt, sid, budget in zip(prompts, ids, budgets, strict=True):
            prior = logged.get(sid, LoggedSample())
            if len(prior.tokens) > budget:
                raise ValueError(f"the log holds {len(prior.tokens)} tokens for sample {sid}, over its {budget}-token "
                                 "budget")
            rollouts.append(Rollout(sample_id=sid, prompt=list(prompt), tokens=list(prior.tokens),
                                    logprobs=list(prior.logprobs), versions=list(prior.versions),
                                    resumed=len(prior.tokens)))
            stats.resumed += len(prior.tokens)

        def count(**added: int) -> None:
            with lock:
                for k, v in added.items():
                    setattr(stats, k, getattr(stats, k) + v)

        def one(k: int) -> None:
            r, budget, server = rollouts[k], budgets[k], k % len(self.servers)
            continued, replay, since = r.resumed > 0, True, None
            while finish_reason(r.tokens, budget - len(r.tokens), params) is None:
                start, body = segment_request(r.prompt, r.tokens, params, seed, r.sample_id, budget, self.segment,
                                              replay=replay)
                if continued:
                    count(prefix_tokens=start, kept=len(r.tokens))
                    continued = False
                pos, held, end = start, len(r.tokens), start + cast(int, body["max_tokens"])
                try:
                    with self.gate.reading() as version, closing(stream_completion(
                            self.servers[server] + "/v1/completions", body, self.timeout_s)) as stream:
                        count(requests=1)
                        for tok, lp in stream:
                            if pos < held:  # re-drawn to realign the seed stream: checked, not logged again
                                if tok != r.tokens[pos]:
                                    break
                                count(replayed=1)
                            else:
                                r.tokens.append(tok)
                                r.logprobs.append(lp)
                                r.versions.append(version)
                                if wal is not None:
                                    with lock:
                                        wal.append([Record(r.sample_id, version, pos, tok, lp)])
                            pos += 1
                except Cut as cut:
                    count(cuts=1)
                    continued = True
                    if since is None or len(r.tokens) > held:  # retry_s runs from the last cut that made progress
                        since = time.monotonic()
                    server = self._server_back(server, str(cut), r.sample_id, len(r.tokens), since + self.retry_s)
                    continue
                since = None
                ended = held <= pos < end  # the server ended the response early (an end-of-sequence token)
                if pos < held:  # the replay drew another token (or ended) before the end of the log
                    count(diverged=1)
                    replay = False
                if on_segment is not None:
                    on_segment(k, len(r.tokens))
                if ended:
                    break
            if on_answer is not None:
                on_answer(k)

        try:
            with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(prompts)))) as pool:
                list(pool.map(one, range(len(prompts))))
        finally:
            if wal is not None:
                wal.close()
        newest = max((v for r in rollouts for v in r.versions), default=-1 if self.version is None else self.version)
        for r, budget in zip(rollouts, budgets, strict=True):
            r.policy_version = newest
            r.finish_reason = finish_reason(r.tokens, budget - len(r.tokens), params)
        return rollouts


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
                                 timeout_s=cfg.timeout_s, keep=cfg.keep_weights, segment=cfg.segment_tokens,
                                 retry_s=cfg.retry_seconds)
        self.transfer = None if cfg.weight_push == "disk" else TransferPush(
            self.engine, cfg.transfer_bucket_bytes, rank, world)
        """rollout.weightPush transfer: pushes through vLLM's weight-transfer API (trex.trainer.rollout.weight_transfer)."""
        self.start_seconds = 0.0
        self.max_seq_len = cfg.max_model_len
        """Prompt + response tokens the servers take (rollout.maxModelLen)."""
        self.restarts = 0
        """Times this run restarted its spawnLocal server after its process exited."""
        self._reported_restarts = 0
        self._revive_lock = threading.Lock()
        if cfg.spawn_local:
            self.engine.revive = self.revive

    def take_restarts(self) -> int:
        """The spawnLocal server's restarts since the last call (a step's)."""
        n, self._reported_restarts = self.restarts - self._reported_restarts, self.restarts
        return n

    def revive(self, deadline: float) -> None:
        """Restart the spawnLocal server if its process has exited: its process group's remains killed, then a new
        server on the same port from the newest pushed weights folder (the version the engine holds), tagged with that
        version, ready by ``deadline`` (time.monotonic; else a RuntimeError naming rollout.retrySeconds). Holds the
        version gate exclusively meanwhile (no request in flight, none sent), and one restart at a time: a caller that
        waited for another's restart finds the server running and returns. Nothing for a running server."""
        with self._revive_lock:
            old = self.server
            if old is None or old.proc is None or old.proc.poll() is None:
                return
            with self.engine.gate.writing():
                code = old.proc.returncode
                old.stop()
                version = self.engine.version
                assert version is not None  # the server was started with a version (ensure)
                folder = self.engine.weights_dir / f"{STEP_PREFIX}{version:08d}"
                server = VLLMServer(folder, venv=old.venv, port=old.port, max_model_len=old.max_model_len,
                                    log_path=old.log_path).start()
                self.server = server
                try:
                    server.wait_ready(max(deadline - time.monotonic(), 1.0))
                except RuntimeError as e:
                    raise RuntimeError(f"rollout.spawnLocal: the vLLM server {server.url} exited (code {code}) and its "
                                       f"restart from {folder} did not serve within rollout.retrySeconds="
                                       f"{self.cfg.retry_seconds:g} s: {e}") from None
                post_json(server.url + "/update_weight_version", {"new_version": str(version)}, self.cfg.timeout_s)
                self.restarts += 1

    def ensure(self, export: Callable[[Path], Path], version: int,
               weights: WeightsSource | None = None) -> PushStats | None:
        """Make the servers hold ``version`` (export + reload, a transfer of ``weights`` with rollout.weightPush
        transfer, or the first server start); None when they do."""
        if self.server is not None:  # a spawned server that exited between steps comes back first
            self.revive(time.monotonic() + self.cfg.retry_seconds)
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


def rollout_outcome(engine: VLLMRollouts) -> tuple[dict[str, float], list[Series]]:
    """The last rollout's cut requests and the tokens its continuations kept from the log, and the spawnLocal server's
    restarts since the last call: as step metrics (JSONL) and Prometheus samples (the restarts a counter)."""
    st = engine.engine.stats
    restarts = engine.take_restarts()
    metrics = {"rollout_requests_cut": float(st.cuts), "rollout_tokens_kept": float(st.kept),
               "rollout_server_restarts": float(restarts)}
    series = [Series("rollout_requests_cut", metrics["rollout_requests_cut"]),
              Series("rollout_tokens_kept", metrics["rollout_tokens_kept"]),
              Series("rollout_server_restarts_total", float(restarts), counter=True)]
    return metrics, series
