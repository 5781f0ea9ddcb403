"""`trex demo`: the most complete local run available without a cluster.

Stage 1 (always): validate every example manifest offline, show that every invalid one is
rejected with a precise message, and print how the valid ones would look in `kubectl get`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _examples_root() -> Path:
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "examples").is_dir() and (parent / "pyproject.toml").exists():
            return parent / "examples"
    return Path.cwd() / "examples"


def run_manifest_stage(examples: Path) -> bool:
    """Validate examples/ (must pass) and examples/invalid/ (must all fail); print `kubectl get` tables."""
    from trex_operator.validate import format_tables, get_rows, iter_documents

    valid_files = sorted([*examples.glob("*.yaml"), *examples.glob("quickstart/*.yaml")])
    invalid_files = sorted(examples.glob("invalid/*.yaml"))
    good = list(iter_documents([str(p) for p in valid_files]))
    bad = list(iter_documents([str(p) for p in invalid_files]))
    print(f"== trex demo: validated {len(good)} example manifests offline")
    problems = [p for c in good for p in c.problems]
    for p in problems:
        print("  unexpected problem:", p.line())
    print(format_tables(get_rows(good)))
    print(f"\n== {len(bad)} manifests in examples/invalid/ are rejected, one line per problem:")
    accepted = [c.file for c in bad if not c.problems]
    for c in bad:
        for p in c.problems:
            print("  " + p.line())
    for f in accepted:
        print(f"  NOT rejected: {f}")
    return not problems and not accepted


def main(argv: list[str]) -> int:
    """Run the demo; exit 0 when every stage succeeded."""
    ap = argparse.ArgumentParser(prog="trex demo", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--examples", type=Path, default=None, help="examples directory (default: the repository's)")
    args = ap.parse_args(argv)
    examples = args.examples or _examples_root()
    try:
        examples = examples.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    if not examples.is_dir():
        print(f"trex demo: examples directory {examples} not found", file=sys.stderr)
        return 2
    ok = run_manifest_stage(examples)
    print("\n== demo ran: offline validation of every example and `kubectl get`-style listing"
          f" -> {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1
