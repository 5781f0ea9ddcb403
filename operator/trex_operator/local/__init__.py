"""Local stand-ins for a cluster: the Kubernetes API emulator, a kubelet that runs pods as processes,
a Prometheus on loopback and the `kubectl get`-style job table used by `trex demo`.

Nothing here is imported by the operator itself; kmock (the `demo` extra) is only needed by
:mod:`trex_operator.local.emulator`.
"""
