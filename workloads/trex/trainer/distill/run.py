"""What `trex train` needs for mode opd: the prompt file, the teacher pool and one step's OPD pass.

Step s takes the next ``promptsPerStep`` prompts of the file (cycled in order) and samples with
sample ids s * N + i under the run's seed, so a resumed run draws exactly what an uninterrupted one drew.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trex.runtime.copy_engine import make_copy_engine
from trex.trainer.config import OPDConfig, TrainerConfig
from trex.trainer.distill.cache import HiddenStateCache
from trex.trainer.distill.opd import OPDStats, opd_step
from trex.trainer.distill.teacher import TeacherPool, resolve_teacher_dir
from trex.trainer.hf import args_from_hf_dir
from trex.trainer.rollout import SamplingParams


@dataclass(frozen=True)
class Prompt:
    """A tokenized prompt and the teachers that score its responses."""

    ids: list[int]
    teachers: list[str]


def opd_problems(cfg: OPDConfig) -> list[tuple[str, str]]:
    """Files mode opd reads that are missing: the prompt file and each teacher's model folder."""
    out: list[tuple[str, str]] = []
    if cfg.prompts is not None and not Path(cfg.prompts).is_file():
        out.append(("opd.prompts", f"{cfg.prompts} is not a file"))
    for i, t in enumerate(cfg.teachers):
        if t.path is None:
            out.append((f"opd.teachers.{i}.name", f"{t.name!r}: a TrainJob teacher gets its path from the operator; "
                        "outside a TrainJob give path (the teacher's model folder)"))
            continue
        try:
            resolve_teacher_dir(t.path)
        except FileNotFoundError as e:
            out.append((f"opd.teachers.{i}.path", str(e)))
    return out


def load_prompts(path: str | Path, tokenizer: Any, labels: list[str], max_len: int) -> list[Prompt]:
    """One {"prompt": text, "teacher"?: label} per line -> <|bos|> + the text's tokens; no "teacher" means
    every teacher. Errors name the line."""
    bos = tokenizer.token_to_id("<|bos|>")
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"opd.prompts: {path}: line {n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or not rec["prompt"]:
            raise ValueError(f'{where}: expected {{"prompt": "<non-empty text>"}}')
        teacher = rec.get("teacher")
        if teacher is not None and teacher not in labels:
            raise ValueError(f"{where}: teacher {teacher!r} is not one of {', '.join(labels)}")
        ids = ([] if bos is None else [int(bos)]) + tokenizer.encode(rec["prompt"], add_special_tokens=False).ids
        if len(ids) >= max_len:
            raise ValueError(f"{where}: {len(ids)} prompt tokens leave no room for a response (maxSeqLen {max_len})")
        out.append(Prompt(ids, [teacher] if teacher is not None else list(labels)))
    if not out:
        raise ValueError(f"opd.prompts: {path} holds no prompts")
    return out


class OPDRun:
    """The prompts, teachers and sampling of one opd run."""

    def __init__(self, cfg: TrainerConfig, device: torch.device, dtype: torch.dtype, tokenizer: Any,
                 ckpt_dir: Path, vocab_size: int, max_seq_len: int) -> None:
        o = cfg.opd
        assert o.prompts is not None, "the config validator requires opd.prompts with mode opd"
        self.cfg = o
        self.seed = cfg.seed
        labels = [t.label for t in o.teachers]
        for i, t in enumerate(o.teachers):
            teacher_vocab = args_from_hf_dir(resolve_teacher_dir(str(t.path))).vocab_size
            if teacher_vocab != vocab_size:
                raise ValueError(f"opd.teachers.{i}.path: the teacher's vocabulary is {teacher_vocab}, the student's "
                                 f"{vocab_size} (distillation compares distributions over one tokenizer)")
        self.prompts = load_prompts(o.prompts, tokenizer, labels, max_seq_len)
        eos = tokenizer.token_to_id("<|eos|>")
        stops = tuple(dict.fromkeys([*o.sampling.stop_tokens, *([] if eos is None else [int(eos)])]))
        s = o.sampling
        self.params = SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                     max_new_tokens=s.max_new_tokens, stop_tokens=stops)
        cache_dir = Path(o.cache_dir) if o.cache_dir else ckpt_dir / "teacher-cache"
        self.pool = TeacherPool([(t.label, t.weight, str(t.path)) for t in o.teachers], device,
                                HiddenStateCache(o.cache_bytes, cache_dir), make_copy_engine(device.type),
                                vocab_size=vocab_size, dtype=dtype)

    def batch_at(self, step: int) -> list[Prompt]:
        """The prompts of optimizer step ``step`` (the file cycled in order)."""
        n = self.cfg.prompts_per_step
        return [self.prompts[(step * n + i) % len(self.prompts)] for i in range(n)]

    def step(self, model: Any, step: int) -> OPDStats:
        """Rollouts, teacher pass and the student's backward for step ``step`` (gradients accumulate)."""
        batch = self.batch_at(step)
        return opd_step(model, [p.ids for p in batch], [p.teachers for p in batch], self.pool, self.params,
                        samples_per_prompt=self.cfg.samples_per_prompt, seed=self.seed, step=step,
                        estimator=self.cfg.estimator, chunk_size=self.cfg.chunk_size)

    def close(self) -> None:
        """Remove the cache's spill files and stop the copy engine."""
        self.pool.close()
        self.pool.engine.close()
