"""trex_operator: the kopf operator reconciling TrainJob, KernelTuneJob, ORDataJob and EvalJob.

Importing the package is light; `kopf run -m trex_operator` loads the handlers through
:mod:`trex_operator.handlers` (imported lazily below so `import trex_operator.api` stays cheap).
"""

from __future__ import annotations

import importlib.util as _ilu

if _ilu.find_spec("trex_operator.handlers") is not None and __name__ == "__main__":  # pragma: no cover
    import trex_operator.handlers  # noqa: F401
