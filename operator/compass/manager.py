"""The operator process (`compass operator`): kopf in-process, a liveness endpoint, and the
operator's own Prometheus metrics.

Exactly one operator must act on a cluster: two would both switch the same routers. kopf runs
in standalone mode (no peering objects), and the Helm chart's Deployment has one replica with
the Recreate strategy, so the old pod is gone before the new one starts: that is the
documented way to have a single actor. A restarted operator loses nothing: every policy's
state is in its status.
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Any

from pydantic import ValidationError

from compass.domain.space import explain_validation_error
from compass.settings import OperatorSettings
from compass.usage import fail

logger = logging.getLogger(__name__)


def register(commands: Any) -> None:
    """Add `compass operator` to the `compass` parser (kopf is imported when it runs)."""
    command = commands.add_parser(
        "operator",
        help="run the operator: the ParetoPolicy and CompoundWorkflow controllers (kopf)",
        description="Run the kopf operator in this process: one Elastico timer per ParetoPolicy "
        "and the CompoundWorkflow handlers, kopf's liveness endpoint on COMPASS_HEALTH_PORT "
        "(/healthz) and the operator's Prometheus metrics on COMPASS_METRICS_PORT (/metrics). "
        "Run one replica only (standalone: no peering).",
    )
    command.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="watch this namespace (repeatable; default: COMPASS_NAMESPACES, else the cluster)",
    )
    command.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch the whole cluster"
    )
    command.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    command.set_defaults(handler=operator_command)


def operator_command(args: argparse.Namespace) -> int:
    """`compass operator`: load the settings (COMPASS_*) and run until stopped."""
    try:
        settings = OperatorSettings()
    except ValidationError as error:
        fail("COMPASS_*", explain_validation_error(error), "fix that environment variable")
    try:
        return run(
            settings,
            namespaces=args.namespaces,
            all_namespaces=bool(args.all_namespaces),
            verbose=bool(args.verbose),
        )
    except ValueError as error:
        fail("--namespace", str(error), "see 'compass operator --help'")


def liveness_endpoint(settings: OperatorSettings) -> str:
    """kopf's liveness endpoint URL (the equivalent of `kopf run --liveness`)."""
    return f"http://0.0.0.0:{settings.health_port}/healthz"


def scope(
    settings: OperatorSettings, namespaces: list[str] | None, all_namespaces: bool
) -> tuple[bool, list[str]]:
    """(cluster-wide, namespaces): the command line wins over COMPASS_NAMESPACES; none given
    means the whole cluster."""
    chosen = list(namespaces or settings.namespaces)
    if all_namespaces and namespaces:
        raise ValueError("--all-namespaces and --namespace exclude each other; pass one")
    if all_namespaces or not chosen:
        return True, []
    return False, chosen


def kopf_settings() -> Any:
    """kopf's settings (a kopf.OperatorSettings) for this operator: standalone, no peering."""
    import kopf

    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    # Events are posted where the code asks (switches, transitions), not from kopf's log lines.
    settings.posting.loggers = False
    return settings


def _quiet_timer_successes(record: logging.LogRecord) -> bool:
    """Drop kopf's "Timer '...' succeeded." lines: one a second per policy says nothing."""
    return not (
        record.levelno == logging.INFO
        and record.getMessage().endswith("' succeeded.")
        and record.getMessage().startswith("Timer '")
    )


def run(
    settings: OperatorSettings,
    *,
    namespaces: list[str] | None = None,
    all_namespaces: bool = False,
    verbose: bool = False,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
) -> int:
    """Run the operator until SIGINT/SIGTERM (or ``stop_flag``); the exit code."""
    clusterwide, watched = scope(settings, namespaces, all_namespaces)
    # Imported here so that `compass --help` and the other commands do not load kopf.
    # Importing compass.handlers registers every handler with kopf's default registry.
    import kopf
    from prometheus_client import start_http_server

    import compass.handlers  # noqa: F401
    from compass.handlers.runtime import RUNTIME_KEY, OperatorMetrics, Runtime

    kopf.configure(verbose=verbose)
    if not verbose:
        logging.getLogger("kopf.objects").addFilter(_quiet_timer_successes)

    metrics = OperatorMetrics()
    server, thread = start_http_server(settings.metrics_port, registry=metrics.registry)
    where = "the whole cluster" if clusterwide else ", ".join(watched)
    logger.info(
        "compass operator: watching %s; metrics on :%d/metrics, liveness on :%d/healthz",
        where,
        settings.metrics_port,
        settings.health_port,
    )
    memo: Any = kopf.Memo()
    memo[RUNTIME_KEY] = Runtime(settings=settings, metrics=metrics)
    try:
        kopf.run(
            settings=kopf_settings(),
            standalone=True,
            clusterwide=clusterwide,
            namespaces=watched,
            liveness_endpoint=liveness_endpoint(settings),
            memo=memo,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        server.shutdown()
        thread.join(timeout=5)
    return 0
