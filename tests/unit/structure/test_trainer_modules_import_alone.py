"""Every trex.trainer module imports on its own, first, in a fresh interpreter (an import cycle that works only in
one import order fails here), and the config and its rules import without torch (`trex validate`, the operator
and admission read them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3] / "workloads"

_EACH_ALONE = """
import importlib, json, sys
failures = []
for name in json.loads(sys.argv[1]):
    for loaded in [m for m in sys.modules if m == "trex" or m.startswith("trex.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as e:
        failures.append(f"{name}: {type(e).__name__}: {e}")
print(json.dumps(failures))
"""


def _run(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def trainer_modules() -> list[str]:
    """Dotted names of every module under trex/trainer."""
    out = []
    for p in sorted((ROOT / "trex" / "trainer").rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


def test_each_trainer_module_imports_alone() -> None:
    names = trainer_modules()
    assert {"trex.trainer.loop", "trex.trainer.rules", "trex.trainer.objective", "trex.trainer.modes"} <= set(names)
    failures = json.loads(_run(_EACH_ALONE, json.dumps(names)))
    assert failures == [], "\n".join(failures)


def test_config_and_rules_import_without_torch() -> None:
    code = ("import sys, trex.trainer.config, trex.trainer.rules; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'kopf')))")
    assert _run(code) == "[]"
