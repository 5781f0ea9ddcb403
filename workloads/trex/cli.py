"""`trex <command> ...`: a table of commands, each implemented by a module imported only when run.

Each command module exposes ``main(argv: list[str]) -> int`` and parses its own arguments, so
`trex --help` imports nothing heavy (no torch, kopf or gurobipy).
"""

from __future__ import annotations

import importlib
import sys

# command -> (module with main(argv), one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("trex_operator.validate", "Validate job manifests offline (exit 1 with one line per problem)."),
    "crds": ("trex_operator.crdgen", "Generate the CustomResourceDefinitions from the API models."),
    "get": ("trex_operator.validate", "Show manifests as `kubectl get` would list them (offline)."),
    "operator": ("trex_operator.cli", "Run the operator (`trex operator run`)."),
    "train": ("trex.trainer.cli", "Train a model from a TrainerConfig YAML on the local device."),
    "data": ("trex.trainer.data.cli", "Prepare training data once: `trex data prepare --config FILE`."),
    "plan": ("trex_operator.plan_cli", "Memory plan of a TrainJob or trainer config: device, and host and disk per phase."),
    "mfu": ("trex.trainer.mfu_cli", "Parameters, FLOPs per token and MFU for a preset."),
    "kernels": ("trex_operator.kernel_shapes", "AuraKernel: tune kernels (`tune`) and report (`report`)."),
    "ordata": ("trex.ordata.cli", "OR data pipeline: `generate`, `merge`, `show`."),
    "eval": ("trex.evaluation.cli", "Evaluate a model on OR benchmarks; `eval report DIR`."),
    "demo": ("trex_operator.demo", "Run the local end-to-end demo."),
}


def _usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = ["usage: trex <command> [options]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `trex <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the command's module; unknown commands exit 2 with the list."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        from trex import __version__

        print(f"trex {__version__}")
        return 0
    cmd = args[0]
    if cmd not in COMMANDS:
        print(f"trex: unknown command {cmd!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[cmd][0])
    rc: int = module.main(args if cmd == "get" else args[1:])
    return rc


if __name__ == "__main__":
    sys.exit(main())
