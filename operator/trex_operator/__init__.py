"""trex_operator: the kopf operator reconciling TrainJob, KernelTuneJob, ORDataJob and EvalJob.

Importing the package is light (``import trex_operator.api`` pulls in no kopf). When kopf's own CLI
imports it (``kopf run -m trex_operator``), the handlers are registered by importing
:mod:`trex_operator.handlers`; ``trex operator run`` registers them explicitly.
"""

from __future__ import annotations

import sys as _sys

if "kopf.cli" in _sys.modules:  # loaded by `kopf run -m trex_operator`
    import trex_operator.handlers  # noqa: F401
