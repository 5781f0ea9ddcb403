"""On-policy distillation end to end on tiny models: a student distilled toward a fixed teacher (another
seed) on its own samples loses at least half of its reverse KL, measured with full logits of both models in
float64; the teacher pass (lazy loads, one trunk per batch, teacher-sorted heads, prefetch, cache spill);
batch packing masks the prompts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trex.runtime.copy_engine import ThreadCopyEngine
from trex.trainer.distill.cache import HiddenStateCache
from trex.trainer.distill.opd import opd_backward, opd_step, pack
from trex.trainer.distill.teacher import TeacherPool, resolve_teacher_dir, teacher_groups
from trex.trainer.hf import save_hf
from trex.trainer.model import DeepSeekModel, ModelArgs, build_model_from_args
from trex.trainer.rollout import Rollout, SamplingParams, generate

V = 64
ARGS = dict(vocab_size=V, hidden_size=32, num_layers=1, num_heads=2, kv_lora_rank=16, qk_nope_head_dim=8,
            qk_rope_head_dim=8, v_head_dim=8, intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4,
            experts_per_token=2, n_dense_layers=1, mtp_depth=0, max_seq_len=64, init_std=0.3)
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=12)


def _model(seed: int, **extra: object) -> DeepSeekModel:
    return build_model_from_args(ModelArgs(**{**ARGS, **extra}), seed=seed)  # type: ignore[arg-type]


def _teacher(root: Path, seed: int, **extra: object) -> tuple[DeepSeekModel, Path]:
    model = _model(seed, **extra)
    save_hf(model, root / f"teacher-{seed}")
    return model, root / f"teacher-{seed}"


def _pool(teachers: list[tuple[str, float, Path]], root: Path, limit: int = 1 << 30,
          prefetch: bool = True) -> TeacherPool:
    return TeacherPool(teachers, torch.device("cpu"), HiddenStateCache(limit, root / "cache"), ThreadCopyEngine(),
                       vocab_size=V, prefetch=prefetch)


def _prompts(n: int, seed: int = 5) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (4,), generator=g).tolist() for _ in range(n)]


@torch.no_grad()
def measured_kl(student: DeepSeekModel, teacher: DeepSeekModel, prompts: list[list[int]]) -> float:
    """Mean KL(p_s || p_t) over the response tokens of the student's samples (fixed seed), from both models'
    full logits in float64: independent of the fused loss."""
    rollouts = generate(student, [p for p in prompts for _ in range(4)], PARAMS, seed=999)
    batch = pack(rollouts, [[] for _ in rollouts])
    ls = torch.log_softmax(student.eval()(batch.input_ids).logits.double(), -1)  # type: ignore[union-attr]
    lt = torch.log_softmax(teacher.eval()(batch.input_ids).logits.double(), -1)  # type: ignore[union-attr]
    student.train()
    kl = (ls.exp() * (ls - lt)).sum(-1)
    return float(kl[batch.mask].mean())


def test_distilling_toward_a_fixed_teacher_halves_the_kl(tmp_path: Path) -> None:
    teacher, path = _teacher(tmp_path, seed=1)
    student = _model(seed=0)
    prompts = _prompts(8)
    before = measured_kl(student, teacher, prompts)
    pool = _pool([("t", 1.0, path)], tmp_path)
    opt = torch.optim.Adam(student.parameters(), lr=1e-2)
    for step in range(60):
        opd_step(student, prompts, [["t"]] * len(prompts), pool, PARAMS, samples_per_prompt=2, seed=11, step=step,
                 estimator="full-vocab", chunk_size=64)
        opt.step()
        opt.zero_grad()
    after = measured_kl(student, teacher, prompts)
    assert after <= 0.5 * before, (before, after)
    assert pool.take_stats().trunk_loads == 1  # read once, on first use


def test_fused_loss_equals_full_logits_reference_with_two_teachers(tmp_path: Path) -> None:
    """One backward through the teacher pass + fused KL equals autograd over full logits in float64 of
    sum_i w_i KL_i / tokens, with the teachers assigned per sample (one of them by both)."""
    torch.set_default_dtype(torch.float64)
    try:
        t1, p1 = _teacher(tmp_path, seed=1)
        t2, p2 = _teacher(tmp_path, seed=2, hc_mult=1)
        student = _model(seed=0)
    finally:
        torch.set_default_dtype(torch.float32)
    student, t1, t2 = student.double(), t1.double(), t2.double()
    rollouts = generate(student, _prompts(5), PARAMS, seed=3)
    assigned = [["a"], ["b"], ["a", "b"], ["b"], ["a"]]
    batch = pack(rollouts, assigned)
    pool = TeacherPool([("a", 0.7, p1), ("b", 1.5, p2)], torch.device("cpu"), HiddenStateCache(0, tmp_path / "c"),
                       ThreadCopyEngine(), vocab_size=V, dtype=torch.float64)
    stats = opd_backward(student, batch, pool, estimator="full-vocab", chunk_size=7)
    got = {n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None}
    student.zero_grad()
    ls = torch.log_softmax(student(batch.input_ids).logits, -1)  # type: ignore[union-attr]
    total = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        lts = {name: torch.log_softmax(t(batch.input_ids).logits, -1) for name, t in (("a", t1), ("b", t2))}  # type: ignore[union-attr]
    for b, names in enumerate(assigned):
        for name, w in (("a", 0.7), ("b", 1.5)):
            if name in names:
                m = batch.mask[b]
                total = total + w * (ls[b].exp() * (ls[b] - lts[name][b])).sum(-1)[m].sum()
    total = total / batch.tokens
    total.backward()
    assert stats.loss == pytest.approx(float(total), rel=1e-9)
    for n, p in student.named_parameters():
        if p.grad is not None and p.grad.abs().max() > 0:
            torch.testing.assert_close(got[n], p.grad, rtol=1e-7, atol=1e-10, msg=n)
    teachers = pool.take_stats()
    assert teachers.head_loads == 2 and teachers.switches == 1  # each head once although samples interleave
    assert pool.cache.take_stats().spilled_bytes > 0  # a zero-byte cache spills everything to disk


def test_mixed_batch_streams_one_head_per_teacher(tmp_path: Path) -> None:
    _, p1 = _teacher(tmp_path, seed=1)
    _, p2 = _teacher(tmp_path, seed=2)
    student = _model(seed=0)
    prompts = _prompts(6)
    assigned = [["a"], ["b"], ["a"], ["b"], ["a"], ["b"]]
    for prefetch, on_device in ((True, 2), (False, 1)):
        pool = _pool([("a", 1.0, p1), ("b", 1.0, p2)], tmp_path, prefetch=prefetch)
        stats = opd_step(student, prompts, assigned, pool, PARAMS, samples_per_prompt=2, seed=1, step=0,
                         estimator="full-vocab", chunk_size=16)
        t = pool.take_stats()
        assert (t.trunk_loads, t.head_loads, t.switches, t.max_heads_on_device) == (2, 2, 1, on_device)
        assert set(stats.kl) == {"a", "b"} and all(v > 0 for v in stats.kl.values())
        c = pool.cache.take_stats()
        assert c.hit_bytes > 0 and c.spilled_bytes == 0
        student.zero_grad()


def test_pack_masks_prompt_and_padding() -> None:
    rs = [Rollout(0, [5, 6, 7], tokens=[1, 2], logprobs=[-1.0] * 2, versions=[0] * 2),
          Rollout(1, [9], tokens=[3, 4, 8], logprobs=[-1.0] * 3, versions=[0] * 3)]
    b = pack(rs, [["t"], ["t"]])
    assert b.input_ids.tolist() == [[5, 6, 7, 1, 2], [9, 3, 4, 8, 0]]
    assert b.mask.tolist() == [[False, False, True, True, False], [True, True, True, False, False]]
    assert b.targets[b.mask].tolist() == [1, 2, 3, 4, 8]
    groups = teacher_groups(["t", "u"], b.teachers, b.mask, {"t": 1.0, "u": 2.0})
    assert [g.label for g in groups] == ["t"] and groups[0].positions.tolist() == [2, 3, 5, 6, 7]


def test_cache_spills_beyond_its_limit(tmp_path: Path) -> None:
    cache = HiddenStateCache(100, tmp_path)
    small, big = torch.ones(5, 4), torch.arange(40.0).reshape(10, 4)
    cache.put("a", small)
    cache.put("b", big)
    assert torch.equal(cache.get("a"), small) and torch.equal(cache.get("b"), big)
    s = cache.take_stats()
    assert (s.hit_bytes, s.spilled_bytes, s.spill_read_bytes) == (80, 160, 160)
    cache.clear()
    assert "b" not in cache and not cache.dir.exists()


def test_teacher_folder_resolution(tmp_path: Path) -> None:
    _, hf = _teacher(tmp_path, seed=1)
    assert resolve_teacher_dir(hf) == hf
    ckpt = tmp_path / "run"
    for step, done in ((10, True), (20, False)):
        d = ckpt / f"step-{step:08d}" / "hf"
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
        if done:
            (d.parent / "manifest.json").write_text("{}")
    assert resolve_teacher_dir(ckpt) == ckpt / "step-00000010" / "hf"
    with pytest.raises(FileNotFoundError, match="incomplete"):
        resolve_teacher_dir(tmp_path / "run" / "step-00000020")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no Hugging Face export"):
        resolve_teacher_dir(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="not a directory"):
        resolve_teacher_dir(tmp_path / "missing")
