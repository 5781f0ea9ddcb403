"""A local vLLM OpenAI-compatible server as a child process: start it from a virtual environment, wait until it
serves, stop it. vLLM pins its own torch and transformers, so it runs from its own environment (``.venv-vllm``,
made by scripts/vllm-venv.sh), never imported into the trainer's. Tests, the rollout benchmark and `trex train`
with ``rollout.spawnLocal`` use it; the server runs in dev mode (VLLM_SERVER_DEV_MODE=1) so that
``/collective_rpc`` (weight reloads), ``/pause`` and ``/resume`` exist."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from trex.vllm_cpu import MOE_REPACK, NATIVE_ROPE

DEFAULT_VENV = ".venv-vllm"
def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def venv_python(venv: str | os.PathLike[str]) -> Path:
    """The interpreter of the vLLM environment; FileNotFoundError naming the script that makes it."""
    py = Path(venv) / "bin" / "python"
    if not py.exists():
        raise FileNotFoundError(f"no vLLM environment at {venv} (create it with scripts/vllm-venv.sh)")
    return py


@dataclass
class VLLMServer:
    """One vLLM server process serving ``model`` (a Hugging Face folder) on 127.0.0.1:``port``."""

    model: Path
    venv: Path = Path(DEFAULT_VENV)
    port: int = 0
    max_model_len: int = 256
    dtype: str = "float32"
    kv_cache_gb: int = 1
    logprobs_mode: str = "processed_logprobs"
    """What the returned log-probs are: processed_logprobs are the log-probs after temperature (trex's
    behaviour log-probs, log_softmax(logits / T)); vLLM's default raw_logprobs ignore the temperature."""
    extra_args: list[str] = field(default_factory=list)
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    site_dir: Path | None = None
    """The folder of the server's ``sitecustomize`` (``MOE_REPACK``), removed by ``stop``."""

    @property
    def url(self) -> str:
        """The server's base URL (no trailing slash)."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The server's command line (RoPE in PyTorch: ``NATIVE_ROPE``; MoE experts re-prepacked: ``MOE_REPACK``)."""
        return [str(venv_python(self.venv)), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                "--host", "127.0.0.1", "--port", str(self.port), "--dtype", self.dtype, "--enforce-eager",
                "--max-model-len", str(self.max_model_len), "--logprobs-mode", self.logprobs_mode,
                "--served-model-name", "policy", "--compilation-config", NATIVE_ROPE, *self.extra_args]

    def start(self) -> VLLMServer:
        """Start the process (does not wait for it to serve)."""
        if self.port == 0:
            self.port = free_port()
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gb), "VLLM_SERVER_DEV_MODE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.site_dir = Path(tempfile.mkdtemp(prefix="trex-vllm-site-"))
        (self.site_dir / "sitecustomize.py").write_text(MOE_REPACK)
        env["PYTHONPATH"] = str(self.site_dir)  # that alone: the trainer's tree must not shadow the server's packages
        cmd = self.command()
        if self.log_path is None:
            self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        else:
            with open(self.log_path, "ab") as out:  # the child keeps its own copy of the descriptor
                self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)
        return self

    def wait_ready(self, timeout_s: float = 300.0) -> float:
        """Block until ``/health`` answers 200; returns the seconds waited. RuntimeError when the process exits
        first (with the end of its log) or the time runs out."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with code {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM server not ready after {timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the server's log (empty without one)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after ``timeout_s``; when the server's own process has
        exited already, SIGKILL what is left of its group (its engine-core workers); remove its ``sitecustomize``."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        elif self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.site_dir is not None:
            shutil.rmtree(self.site_dir, ignore_errors=True)
            self.site_dir = None

    def __enter__(self) -> VLLMServer:
        self.start().wait_ready()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def post_json(url: str, body: dict[str, object] | None = None, timeout_s: float = 600.0) -> object:
    """POST ``body`` as JSON and return the decoded answer (None for an empty one); RuntimeError with the server's
    message on an HTTP error."""
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"POST {url}: HTTP {e.code}: {e.read()[:500]!r}") from None
    return json.loads(raw) if raw.strip() else None
