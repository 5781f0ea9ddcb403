"""Context parallelism (parallelism.cp) against one process, float64, spawn + gloo.

- The trainer: losses and every parameter after 3 optimizer steps equal the single-process run to 1e-10 at
  cp2 (also with full recompute, which gathers the keys again in the backward), cp2 x ep2, cp2 x tp2 and cp4,
  on an MLA model (a dense and an MoE layer, MTP, sequence-balance loss and aux-free bias updates on) trained on
  packed short documents, so document boundaries fall inside chunks and documents run across chunk
  boundaries (checked on the batches). The plan's per-rank state bytes match each layout's shards.
- One forward and backward with hand-placed document boundaries (on a chunk edge, inside a chunk, a document
  from the head chunk into the tail chunk): trunk and MTP outputs and every parameter gradient equal one
  process to 1e-12 (the MTP module reads tokens of the next chunk, held by another rank).
- The plan's activation term against the storages autograd saves on each cp2 rank.
- Validate/train agreement: at world 2 and 4, every cp x tp x ep layout and sequence length that `trex validate`
  accepts trains a step with the single-process loss; every rejected one is one line naming the field, and the
  trainer's own check agrees; at micro-batch 1 the fit message suggests cp only where the job can run it.
"""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from trex.config_base import load_section
from trex.trainer.config import TrainerConfig
from trex.trainer.loop import Trainer
from trex.trainer.rules import job_problems

STEPS = 3
WORLD2 = {"cp2": {"cp": 2}, "cp2-recompute": {"cp": 2, "recompute": "full"}}
WORLD4 = {"cp2xep2": {"cp": 2, "ep": 2}, "cp2xtp2": {"cp": 2, "tp": 2}, "cp4": {"cp": 4}}
SEQ = 32


def _corpus(path: Path) -> Path:
    """Short documents of 2 to 14 words: several per 32-token row, so boundaries land anywhere."""
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
    lines = [json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(2, 14)))})
             for _ in range(400)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _raw(ckpt: Path, layout: dict[str, Any], data: Path | None, steps: int = STEPS, seq: int = SEQ) -> dict[str, Any]:
    layout = dict(layout)
    recompute = layout.pop("recompute", "none")
    return {
        "recompute": recompute,
        "model": {"preset": "tiny", "dtype": "fp64", "overrides": {
            "mtpDepth": 1, "numLayers": 2, "nDenseLayers": 1, "qLoraRank": 16}},
        "maxSteps": steps, "parallelism": layout,
        "data": {"seqLen": seq, "microBatchSize": 2, "globalBatchSize": 8,
                 **({"train": str(data), "tokenizer": {"vocabSize": 300}} if data is not None else {})},
        "optimizer": {"schedule": {"warmupSteps": 1}, "adamw": {"eps": 1e-8}},
        "routing": {"biasUpdateSpeed": 0.01, "sequenceBalanceWeight": 0.01},
        "stability": {"enabled": False},
        "checkpoint": {"dir": str(ckpt), "intervalSteps": 100, "exportHf": False},
    }


def _cfg(ckpt: Path, layout: dict[str, Any], data: Path | None, steps: int = STEPS, seq: int = SEQ) -> TrainerConfig:
    return load_section(TrainerConfig, _raw(ckpt, layout, data, steps, seq))


def _run(cfg: TrainerConfig, out: Path, group: Any, steps: int = STEPS) -> tuple[list[float], dict[str, torch.Tensor]]:
    tr = Trainer(cfg, out, group=group, measure_peak=False, log=lambda _m: None)
    res = tr.run(steps)
    if group is not None:  # the plan's per-rank state bytes against this rank's shards
        from trex.trainer.mfu import DEVICES
        from trex.trainer.plan import measured_state_bytes, plan_memory

        plan = plan_memory(cfg, dist.get_world_size(group), DEVICES["cpu"], capacity=1 << 40)
        got = measured_state_bytes(tr.model, tr.opts)
        keys = ("params", "muon_state", "adamw_state")
        (out / f"bytes-{cfg.checkpoint.dir.rsplit('/', 1)[-1]}-{dist.get_rank(group)}.json").write_text(json.dumps(
            {"measured": {k: got[k] for k in keys}, "plan": {k: int(getattr(plan, k)) for k in keys}}))
    return [r.loss for r in res.history], tr.full_state_dict()


# --- one forward and backward with hand-placed document boundaries --------------------------------------------
def _model_args() -> Any:
    from trex.trainer.model.args import ModelArgs

    return ModelArgs(vocab_size=64, hidden_size=32, num_layers=2, n_dense_layers=1, num_heads=4, kv_lora_rank=16,
                     q_lora_rank=0, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, intermediate_size=64,
                     moe_intermediate_size=16, n_routed_experts=4, experts_per_token=2, n_shared_experts=1,
                     mtp_depth=1, max_seq_len=64)


def _hand_batch() -> dict[str, torch.Tensor]:
    """Two rows of 16 tokens (chunks of 4 at cp2: rank 0 holds 0-3 and 12-15, rank 1 holds 4-11)."""
    from trex.trainer.model.layers import positions_from_docs

    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (2, 16), generator=gen)
    doc_ids = torch.tensor([[0] * 4 + [1] * 6 + [2] * 6,  # boundary on a chunk edge (4) and inside one (10)
                            [0] * 2 + [1] * 13 + [2] * 1])  # doc 1 runs from the head chunk into the tail chunk
    return {"input_ids": ids, "doc_ids": doc_ids, "position_ids": positions_from_docs(doc_ids)}


def _forward(model: Any, batch: dict[str, torch.Tensor], probe: torch.Tensor) -> torch.Tensor:
    """Backward of a probe of the final and the MTP module's hidden states plus the balance loss; returns both
    hidden states, side by side."""
    out = model(batch["input_ids"], batch["position_ids"], batch["doc_ids"], logits=False)
    ((out.hidden * probe).sum() + (out.mtp_hidden[0] * probe.flip(-1)).sum() + 0.1 * out.balance_loss).backward()
    return torch.cat([out.hidden, out.mtp_hidden[0]], dim=-1).detach()


def _hand_forward(rank: int, out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from trex.trainer.model.model import build_model_from_args
    from trex.trainer.parallel.context import chunk_indices, install, split_batch

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
    model = build_model_from_args(_model_args(), dtype=torch.float64, seed=5)
    install(model, mesh.get_group(), 2, rank)
    batch = _hand_batch()
    probe = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    idx = chunk_indices(16, 2, rank)
    hidden = _forward(model, split_batch(batch, 2, rank), probe[:, idx])
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    for g in grads.values():
        dist.all_reduce(g)
    torch.save({"hidden": hidden, "idx": idx, "grads": grads}, out / f"hand-{rank}.pt")


# --- saved activations against the plan ------------------------------------------------------------------
ACT_SEQ = 256


def _act_cfg() -> TrainerConfig:
    return _cfg(Path("unused"), {}, None, 1, ACT_SEQ)


def saved_bytes(cfg: TrainerConfig, seq: int, batch: int, cp: int = 1, rank: int = 0, group: Any = None,
                backward: bool = False) -> int:
    """Bytes of the distinct storages autograd saves for one forward + loss of this rank's tokens (parameters
    excluded), with the cp rank's key gathering installed when cp > 1; ``backward``: plus the most that the
    backward's recomputations save at once (a DeepSeek-V4 layer recomputes its attention a block of query rows at
    a time)."""
    from trex.trainer.model import build_model, compute_loss
    from trex.trainer.parallel.context import install, split_batch

    model = build_model(cfg.model)
    if cp > 1:
        install(model, group, cp, rank)
    ids = torch.randint(0, 512, (batch, seq), generator=torch.Generator().manual_seed(0))
    docs = (torch.arange(seq) // 50).expand(batch, seq)
    from trex.trainer.model.layers import positions_from_docs

    b = {"ids": ids, "docs": docs, "pos": positions_from_docs(docs)}
    if cp > 1:
        b = split_batch(b, cp, rank)
    sizes: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        sizes[st.data_ptr()] = max(sizes.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(b["ids"], b["pos"], b["docs"], logits=False)
        loss, _ = compute_loss(out, b["ids"], torch.ones_like(b["ids"], dtype=torch.bool), cfg.routing, 0)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = sum(n for ptr, n in sizes.items() if ptr not in params)
    if not backward:
        return kept
    live: dict[int, list[int]] = {}
    now, peak = [0], [0]

    class Handle:
        def __init__(self, t: torch.Tensor) -> None:
            self.t, self.ptr = t.detach(), t.untyped_storage().data_ptr()  # detached: no cycle through grad_fn

        def __del__(self) -> None:
            ref = live[self.ptr]
            ref[1] -= 1
            if ref[1] == 0:
                now[0] -= ref[0]
                del live[self.ptr]

    def hold(t: torch.Tensor) -> Any:
        if t.untyped_storage().data_ptr() in params:
            return t
        ref = live.setdefault(t.untyped_storage().data_ptr(), [t.untyped_storage().nbytes(), 0])
        if ref[1] == 0:
            now[0] += ref[0]
            peak[0] = max(peak[0], now[0])
        ref[1] += 1
        return Handle(t)

    with torch.autograd.graph.saved_tensors_hooks(hold, lambda h: h.t if isinstance(h, Handle) else h):
        loss.backward()
    return kept + peak[0]


# --- workers -------------------------------------------------------------------------------------------------
def _sweep_layouts(world: int) -> list[tuple[dict[str, int], int]]:
    return [({"cp": cp, "tp": tp, "ep": ep}, seq) for cp, tp, ep, seq in itertools.product((2, 4), (1, 2), (1, 2),
                                                                                            (SEQ, 20))
            if ep <= world]


def _sweep_name(layout: dict[str, int], seq: int) -> str:
    return "-".join(f"{k}{v}" for k, v in layout.items()) + f"-s{seq}"


def _accepted(world: int) -> list[tuple[dict[str, int], int]]:
    return [(lay, seq) for lay, seq in _sweep_layouts(world)
            if not job_problems(_cfg(Path("unused"), lay, None, 1, seq), world)]


def _worker(rank: int, world: int, out: str, layouts: dict[str, dict[str, Any]]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous-{world}", rank=rank, world_size=world)
    try:
        root = Path(out)
        if world == 2:
            _hand_forward(rank, root)
            (root / f"saved-cp2-{rank}.json").write_text(json.dumps(
                saved_bytes(_act_cfg(), ACT_SEQ, 2, 2, rank, dist.group.WORLD)))
        for name, layout in layouts.items():
            losses, state = _run(_cfg(root / name, layout, root / "corpus.jsonl"), root, dist.group.WORLD)
            if rank == 0:
                (root / f"{name}.json").write_text(json.dumps(losses))
                torch.save(state, root / f"{name}.pt")
        results: dict[str, Any] = {}
        for layout, seq in _accepted(world):
            name = _sweep_name(layout, seq)
            tr = Trainer(_cfg(root / f"w{world}-{name}", layout, None, 1, seq), root, group=dist.group.WORLD,
                         measure_peak=False, log=lambda _m: None)
            results[name] = [r.loss for r in tr.run(1).history]
        if rank == 0:
            (root / f"sweep-{world}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cp")
    _corpus(out / "corpus.jsonl")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(2, str(out), WORLD2), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
    mp.spawn(_worker, args=(4, str(out), WORLD4), nprocs=4, join=True)  # type: ignore[attr-defined,no-untyped-call]
    return out


@pytest.fixture(scope="module")
def reference(runs: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("single")
    return _run(_cfg(tmp / "ckpt", {}, runs / "corpus.jsonl"), tmp, None)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [*WORLD2, *WORLD4])
def test_cp_layout_matches_single_process(layout: str, runs: Path,
                                          reference: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    ref_losses, ref_state = reference
    losses = json.loads((runs / f"{layout}.json").read_text())
    assert len(losses) == STEPS
    assert losses == pytest.approx(ref_losses, abs=1e-10, rel=0)
    state = torch.load(runs / f"{layout}.pt")
    assert sorted(state) == sorted(ref_state)
    for key, want in ref_state.items():
        assert float((state[key].double() - want.double()).abs().max()) < 1e-10, key
    biases = [k for k in ref_state if k.endswith("e_score_correction_bias")]
    assert biases and any(float(ref_state[k].abs().max()) > 0 for k in biases)  # the bias update ran


@pytest.mark.slow
@pytest.mark.parametrize("layout", [*WORLD2, *WORLD4])
def test_memory_plan_equals_the_state_bytes_a_cp_rank_holds(layout: str, runs: Path) -> None:
    """Parameters are sharded over dp x cp (cp counts as data): the plan's per-device parameters, Muon and
    AdamW state against rank 0's shards, within 5 %."""
    got = json.loads((runs / f"bytes-{layout}-0.json").read_text())
    for key, planned in got["plan"].items():
        measured = got["measured"][key]
        assert measured > 0 and abs(measured - planned) <= 0.05 * planned, (key, measured, planned)


def test_fit_message_at_micro_batch_one_suggests_cp_only_where_it_runs() -> None:
    from trex.trainer.mfu import DEVICES

    def advice(**overrides: Any) -> str:
        raw = _raw(Path("unused"), {}, None, 1, 1024)
        raw["data"] = {**raw["data"], "microBatchSize": 1, "globalBatchSize": 2}
        raw["model"]["overrides"].update(overrides)
        problems = job_problems(load_section(TrainerConfig, raw), 2, DEVICES["cpu"], capacity=64 << 20)
        assert len(problems) == 1 and problems[0][0] == "parallelism", problems
        return problems[0][1]

    mla = advice()
    assert "raise parallelism.cp (to 2" in mla and "raise tp" not in mla and "activations take the most" in mla
    v4 = advice(attention="csa", layerTypes=["csa", "hca"], vHeadDim=24)
    assert "raise parallelism.cp (to 2" in v4  # V4 attention runs under cp too


@pytest.mark.slow
def test_the_corpus_puts_document_boundaries_inside_and_across_chunks(runs: Path, tmp_path: Path) -> None:
    from trex.trainer.data.build import build_data

    cfg = _cfg(tmp_path, {}, runs / "corpus.jsonl")
    _, loader, _ = build_data(cfg.data, tmp_path / "tokenizer", cfg.model.args.vocab_size)
    docs = loader.next_batch(2, SEQ, 0, 1)["doc_ids"]
    chunk = SEQ // 4  # cp2: 4 chunks
    starts = (docs[:, 1:] != docs[:, :-1]).nonzero()[:, 1] + 1
    assert any(int(s) % chunk for s in starts)  # a boundary inside a chunk
    spans = [(docs[r] == d).nonzero().flatten() for r in range(2) for d in docs[r].unique()]
    assert any(int(s[0]) // chunk != int(s[-1]) // chunk for s in spans)  # a document across a chunk boundary


@pytest.mark.slow
def test_hand_placed_boundaries_forward_and_backward_match_one_process(runs: Path) -> None:
    from trex.trainer.model.model import build_model_from_args

    model = build_model_from_args(_model_args(), dtype=torch.float64, seed=5)
    batch = _hand_batch()
    probe = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    hidden = _forward(model, batch, probe)
    want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    for rank in (0, 1):
        got = torch.load(runs / f"hand-{rank}.pt")
        assert float((got["hidden"] - hidden[:, got["idx"]]).abs().max()) < 1e-12
        assert sorted(got["grads"]) == sorted(want)
        for name, g in want.items():
            assert float((got["grads"][name] - g).abs().max()) < 1e-12, name


@pytest.mark.slow
def test_activation_plan_tracks_what_a_cp_rank_saves(runs: Path) -> None:
    """The plan's activation term at cp 1 and cp 2 against the storages autograd saves (rank by rank at cp 2):
    within the same band as the single-process estimate, and cp 2 saves less per rank than cp 1."""
    from trex.trainer.config import resolved_model_values
    from trex.trainer.plan import Layout, context_activation_bytes

    torch.set_num_threads(1)
    cfg = _act_cfg()
    values, lay = resolved_model_values(cfg.model), Layout(1, 1, 1, 1, 1, 1)
    one = saved_bytes(cfg, ACT_SEQ, 2)
    plan_one = context_activation_bytes(values, lay, 2, ACT_SEQ, 8, attention_probs=True)
    assert 0.75 <= plan_one / one <= 1.33, (plan_one, one)
    plan_two = context_activation_bytes(values, lay, 2, ACT_SEQ, 8, attention_probs=True, cp=2)
    for rank in (0, 1):
        two = json.loads((runs / f"saved-cp2-{rank}.json").read_text())
        assert two < one
        assert 0.75 <= plan_two / two <= 1.33, (rank, plan_two, two)


@pytest.mark.slow
def test_every_accepted_cp_layout_trains_a_step_with_the_single_process_loss(runs: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    refs = {seq: Trainer(_cfg(tmp_path / f"single-{seq}", {}, None, 1, seq), tmp_path, measure_peak=False,
                         log=lambda _m: None).run(1).history[0].loss for seq in (SEQ, 20)}
    for world in (2, 4):
        results = json.loads((runs / f"sweep-{world}.json").read_text())
        assert sorted(results) == sorted(_sweep_name(lay, seq) for lay, seq in _accepted(world))
        for name, losses in results.items():
            assert losses == pytest.approx([refs[int(name.rsplit("-s", 1)[1])]], abs=1e-10, rel=0), (world, name)
    assert len(json.loads((runs / "sweep-4.json").read_text())) >= 5


@pytest.mark.parametrize("world", [2, 4])
def test_every_rejected_cp_layout_is_one_line_naming_the_field(world: int) -> None:
    rejected = 0
    for layout, seq in _sweep_layouts(world):
        problems = job_problems(_cfg(Path("unused"), layout, None, 1, seq), world)
        if not problems:
            continue
        rejected += 1
        field, message = problems[0]
        assert field.startswith(("parallelism.", "data.seqLen")) and message and "\n" not in message
        assert job_problems(_cfg(Path("unused"), layout, None, 1, seq), world, local=True)[0] == (field, message)
    assert rejected >= 4


def _problems(overrides: dict[str, Any], world: int = 2) -> list[tuple[str, str]]:
    base = _raw(Path("unused"), {"cp": 2}, None, 1)
    for path, value in overrides.items():
        node = base
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return job_problems(load_section(TrainerConfig, base), world)


@pytest.mark.parametrize(("overrides", "field", "words"), [
    ({"data.seqLen": 30}, "data.seqLen", "2 x parallelism.cp = 4"),
    ({"data.seqLenCurriculum": [{"step": 1, "seqLen": 18}]}, "data.seqLenCurriculum[0].seqLen", "not a multiple"),
    ({"mode": "grpo"}, "parallelism.cp", "mode grpo"),
    ({"parallelism.cp": 4, "parallelism.tp": 2}, "parallelism.cp", "does not divide world / (tp x pp) = 1"),
    ({"parallelism.dp": 1}, "parallelism.dp", "leave dp unset under cp > 1"),
])
def test_what_cp_does_not_run_is_refused_with_one_line(overrides: dict[str, Any], field: str, words: str) -> None:
    problems = _problems(overrides)
    hits = [p for p in problems if p[0] == field and words in p[1]]
    assert len(hits) == 1 and "\n" not in hits[0][1], problems
