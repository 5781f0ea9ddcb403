"""Package wiring: `import trex_operator.api` stays light; `kopf run -m trex_operator` registers the handlers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "workloads")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_api_import_does_not_load_kopf() -> None:
    assert _run("import sys, trex_operator.api; print('kopf' in sys.modules, 'trex_operator.handlers' in sys.modules)") \
        == "False False"


def test_kopf_cli_import_registers_handlers() -> None:
    code = ("import kopf.cli, kopf, trex_operator\n"
            "r = kopf.get_default_registry()\n"
            "print(sorted(h.id for h in r._spawning.get_all_handlers()), sorted(h.id for h in r._indexing.get_all_handlers()))")
    assert _run(code) == ("['reconcile-evaljob', 'reconcile-kerneltunejob', 'reconcile-ordatajob', 'reconcile-trainjob'] "
                          "['trex_batch', 'trex_deploys', 'trex_pods']")
