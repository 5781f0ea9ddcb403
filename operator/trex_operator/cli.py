"""`trex operator run`: start the kopf operator in this process."""

from __future__ import annotations

import argparse
import asyncio


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trex operator", description="Run the trex Kubernetes operator.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="Reconcile TrainJob, KernelTuneJob, ORDataJob and EvalJob objects.")
    run.add_argument("-n", "--namespace", action="append", default=[],
                     help="Namespace to watch (repeatable; glob patterns allowed). Default: all namespaces.")
    run.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG).")
    run.add_argument("--context", default=None, help="kubeconfig context.")
    run.add_argument("--interval", type=float, default=None,
                     help="Reconcile period per job in seconds (default: $TREX_OPERATOR_INTERVAL or 10).")
    run.add_argument("--metrics-port", type=int, default=None,
                     help="Port of the operator's /metrics (default: $TREX_OPERATOR_METRICS_PORT or 8080; -1 = off).")
    run.add_argument("--liveness", default="http://0.0.0.0:8081/healthz",
                     help="Liveness endpoint URL ('' = off).")
    run.add_argument("--peering", default=None,
                     help="kopf peering name for several operator replicas (default: standalone).")
    run.add_argument("--priority", type=int, default=0,
                     help="kopf peering priority: with several replicas the highest is active (default 0).")
    run.add_argument("-v", "--verbose", action="store_true", help="Debug logging.")
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the operator until interrupted; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.interval is not None and args.interval <= 0:
        _parser().error("--interval must be positive")
    import kopf

    from trex_operator.kube import Connection, Kube
    from trex_operator.reconciler import Reconciler, Settings

    try:
        settings = Settings.from_env()
        from trex_operator.handlers import register  # registers kopf's default handlers from the env too
    except ValueError as exc:  # a bad TREX_* variable: say which, no traceback
        import sys

        print(f"trex operator: {exc}", file=sys.stderr)
        return 2
    if args.interval is not None:
        settings.interval_s = args.interval
    if args.metrics_port is not None:
        settings.metrics_port = args.metrics_port
    conn = Connection.load(args.kubeconfig, args.context) if (args.kubeconfig or args.context) else Connection.load()
    registry = register(kopf.OperatorRegistry(), settings, Reconciler(Kube(conn), settings))
    kopf.configure(verbose=args.verbose)
    if not args.verbose:  # kopf logs every handler success per object at INFO: noise at thousands of pods
        import logging

        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    namespaces = args.namespace or []
    try:
        asyncio.run(kopf.operator(
            registry=registry, clusterwide=not namespaces, namespaces=namespaces,
            standalone=args.peering is None, peering_name=args.peering, priority=args.priority,
            liveness_endpoint=args.liveness or None,
        ))
    except KeyboardInterrupt:
        return 130
    return 0
