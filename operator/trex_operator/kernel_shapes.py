"""KernelTuneJob ``shapesFrom``: the shape classes a TrainJob's trainer calls, as the tuning config's ``shapes``.

Operator-side (like ``trex plan``'s TrainJob reader): the derivation is the trainer's own
(``trex.trainer.kernels.run_kernel_shapes``), which the kernel tuning workload may not import, so the operator
resolves ``shapesFrom`` before it renders the pod's config, and ``trex kernels tune --shapes-from FILE`` resolves
it here before handing the config to the tuner. Importing the trainer's kernel module imports torch: done only
when a ``shapesFrom`` is resolved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trex.kernels.config import KernelShape, KernelTuneConfig
from trex.trainer.config import TrainerConfig


def trainer_of(doc: Any) -> TrainerConfig:
    """The TrainerConfig of a TrainJob object (its spec.trainer), read without the world-size rules."""
    from trex.config_base import load_section

    if not isinstance(doc, dict) or not isinstance((doc.get("spec") or {}).get("trainer"), dict):
        raise ValueError("shapesFrom: the TrainJob has no spec.trainer")
    return load_section(TrainerConfig, doc["spec"]["trainer"])


def read_trainer(path: str) -> TrainerConfig:
    """The TrainerConfig a file holds: a TrainJob manifest's spec.trainer, a `trainer:` section or a top-level one."""
    from trex.config_base import config_data, load_section

    if not Path(path).is_file():
        raise ValueError(f"--shapes-from: {path} is not a file")
    return load_section(TrainerConfig, config_data(path, "TrainJob", "trainer"))


def with_shapes(kernels: KernelTuneConfig, trainer: TrainerConfig, source: str) -> KernelTuneConfig:
    """``kernels`` with ``shapes`` set to the run's shape classes for the kernels it tunes (``kernels``, else every
    one the run calls that the backend has a template for in each of ``dtypes``) and ``shapesFrom`` cleared;
    ValueError naming ``shapesFrom`` when none is left to tune."""
    from trex.kernels.backends import coverage
    from trex.trainer.kernels import device_for_backend, run_kernel_shapes

    have = coverage(kernels.backend)
    run = run_kernel_shapes(trainer, device_for_backend(kernels.backend))
    names: list[str] = list(kernels.kernels) or [k for k in dict.fromkeys(k for k, _ in run)
                                      if k in have and all(d in have[k] for d in kernels.dtypes)]
    shapes = [KernelShape.model_validate({"kernel": k, "dims": d}) for k, d in run if k in names]
    if not shapes:
        raise ValueError(f"shapesFrom: {source} calls none of the kernels this job tunes on {kernels.backend} "
                         f"(it calls {', '.join(dict.fromkeys(k for k, _ in run)) or 'none'})")
    data = kernels.model_dump(by_alias=True, exclude={"shapes_from"})
    data.update(suite="none", kernels=list(dict.fromkeys(s.kernel for s in shapes)),
                shapes=[s.model_dump(by_alias=True) for s in shapes])
    return KernelTuneConfig.model_validate(data)


def summary(cfg: KernelTuneConfig) -> str:
    """'N shape classes (kernel, ...)' of a resolved config, for the lineage."""
    return f"{len(cfg.shapes)} shape classes ({', '.join(cfg.kernels)})"


def shapes_cli_reader(kernels: KernelTuneConfig, path: str) -> KernelTuneConfig:
    """``trex kernels tune --shapes-from FILE``: the config with the shapes of the run FILE describes."""
    return with_shapes(kernels, read_trainer(path), path)


def main(argv: list[str]) -> int:
    """`trex kernels ...` with ``--shapes-from`` resolved by the trainer's derivation."""
    from trex.kernels.cli import main as kernels_main

    return kernels_main(argv, shapes_reader=shapes_cli_reader)




def planned_classes(kernels: KernelTuneConfig) -> set[tuple[str, str, str]]:
    """(kernel, dtype, shape class) a resolved tuning config tunes: its shapes, else the suite's defaults, for each
    kernel and dtype the backend has a template for."""
    from trex.kernels.backends import coverage
    from trex.kernels.suite import SUITE
    from trex.kernels.suite.base import shape_bucket

    have = coverage(kernels.backend)
    names = list(SUITE) if kernels.suite == "default" and not kernels.kernels else list(kernels.kernels)
    out: set[tuple[str, str, str]] = set()
    for name in names:
        shapes = [s.dims for s in kernels.shapes if s.kernel == name] or list(SUITE[name].default_shapes)
        out |= {(name, dt, shape_bucket(sh)) for sh in shapes for dt in kernels.dtypes if dt in have.get(name, ())}
    return out


def run_classes(trainer: TrainerConfig, backend: str) -> set[tuple[str, str, str]]:
    """(kernel, dtype, shape class) of every dispatched call of the run, on the backend's device."""
    from trex.kernels.suite.base import shape_bucket
    from trex.trainer.kernels import FP32_ONLY, device_for_backend, run_kernel_dtypes, run_kernel_shapes

    dtypes = run_kernel_dtypes(trainer)
    return {(k, dt, shape_bucket(d)) for k, d in run_kernel_shapes(trainer, device_for_backend(backend))
            for dt in (("fp32",) if k in FP32_ONLY else dtypes)}


def kernels_from_problems(checked: list[Any]) -> list[Any]:
    """`trex validate` across documents: a TrainJob whose kernelsFrom names a KernelTuneJob among the validated
    manifests that tunes none of the run's (kernel, dtype, shape class): one problem at spec.kernelsFrom."""
    from trex_operator.validate import Problem

    jobs = {(c.model.kind, c.model.metadata.name): c for c in checked if c.model is not None}
    out = []
    for c in checked:
        spec = c.model.spec if c.model is not None and c.model.kind == "TrainJob" else None
        ktj = jobs.get(("KernelTuneJob", spec.kernels_from.name)) if spec is not None and spec.kernels_from else None
        if spec is None or ktj is None:
            continue
        tune = ktj.model.spec.kernels
        if tune.shapes_from is not None:
            source = jobs.get(("TrainJob", tune.shapes_from.train_job))
            if source is None:
                continue
            try:
                tune = with_shapes(tune, source.model.spec.trainer, f"TrainJob {tune.shapes_from.train_job}")
            except ValueError:
                tune = tune.model_copy(update={"shapes": [], "kernels": [], "suite": "none", "shapes_from": None})
        run = run_classes(spec.trainer, tune.backend)
        if not planned_classes(tune) & run:
            out.append(Problem(c.file, f"{c.model.kind}/{c.model.metadata.name}", "spec.kernelsFrom",
                               f"KernelTuneJob {ktj.model.metadata.name} tunes none of this run's {len(run)} kernel "
                               "shape classes and dtypes (it would activate nothing): give it shapesFrom: "
                               f"{{trainJob: {c.model.metadata.name}}}"))
    return out
