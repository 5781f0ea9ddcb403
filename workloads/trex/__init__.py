"""trex: Kubernetes-native MoE training, kernel tuning, OR data and OR evaluation workloads.

Importing this package is cheap on purpose: heavy modules (torch, kopf, gurobipy) are imported
only by the subpackages that need them.
"""

__version__ = "0.1.0"
