"""`compass operator`: the command line of the operator process (compass.controllers.manager)."""

from __future__ import annotations

import argparse
from typing import Any, get_args

from pydantic import ValidationError

from compass.console import fail
from compass.controllers import kubeapi
from compass.controllers.finalizers import (
    KOPF_FINALIZER,
    OperatorStillRunningError,
    release_finalizers,
    wait_for_pods_gone,
)
from compass.controllers.logs import LogFormat, LogLevel
from compass.controllers.manager import PEERING_FIX, PeeringError, run
from compass.controllers.settings import OperatorSettings
from compass.domain.space import explain_validation_error


def register(commands: Any, summary: str) -> None:
    """Add `compass operator` to the `compass` parser (kopf is imported when it runs)."""
    command = commands.add_parser(
        "operator",
        help=summary,
        description="Run the kopf operator in this process: the ParetoPolicy controller (one "
        "scheduler ticks every policy each second on a pool of threads: it reads the router's "
        "queue, decides with the policy's strategy and switches the routers) and the "
        "CompoundWorkflow controller (its search and profiling Jobs, then its ParetoPolicy), "
        "kopf's liveness endpoint on COMPASS_HEALTH_PORT (/healthz) and the operator's "
        "Prometheus metrics on COMPASS_METRICS_PORT (/metrics). Settings come from COMPASS_* "
        "environment variables (the Helm chart sets them from its values); these flags "
        "override them. "
        "Without --peering it runs standalone: run one process only. With --peering NAME "
        "(COMPASS_PEERING) any number may run: only the one with the highest priority acts.",
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
    peering = command.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering",
        metavar="NAME",
        help="join kopf's peering object NAME (ClusterKopfPeering, or a KopfPeering in each "
        "watched namespace; it must exist): only the highest-priority live operator acts "
        "(default: COMPASS_PEERING, else standalone)",
    )
    peering.add_argument(
        "--standalone",
        action="store_true",
        help="no peering even if COMPASS_PEERING is set: the only operator of its namespaces",
    )
    command.add_argument(
        "--priority",
        type=int,
        metavar="N",
        help="peering priority (default: COMPASS_PEERING_PRIORITY, else from the start time, "
        "negative, so the oldest acts and any N >= 0 takes over from it); equal priorities "
        "pause every peer that has them",
    )
    command.add_argument(
        "--log-level",
        choices=get_args(LogLevel),
        help="the lowest level logged (default: COMPASS_LOG_LEVEL, else info)",
    )
    command.add_argument(
        "--log-format",
        choices=get_args(LogFormat),
        help="text lines, or one JSON object a line for a log collector (default: "
        "COMPASS_LOG_FORMAT, else text)",
    )
    command.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging (--log-level debug)"
    )
    command.set_defaults(handler=operator_command)
    actions = command.add_subparsers(dest="action", metavar="ACTION", required=False)
    release = actions.add_parser(
        "release-finalizers",
        help="after an uninstall: take kopf's finalizer off every CompoundWorkflow and "
        "ParetoPolicy, so that deleting them or their namespace does not wait for an operator",
        description=f"Take kopf's finalizer ({KOPF_FINALIZER}) off every CompoundWorkflow and "
        "ParetoPolicy of the namespaces given (-n, COMPASS_NAMESPACES, else the cluster). Run it "
        "only once no operator runs (the chart's uninstall hook runs it after the operator's "
        "pods are gone: --wait-for-pods): a running operator puts the finalizer back.",
    )
    release.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="release_namespaces",
        metavar="NS",
        help="release in this namespace (repeatable; default: COMPASS_NAMESPACES, else all)",
    )
    release.add_argument(
        "--wait-for-pods",
        metavar="SELECTOR",
        help="first wait until no pod matching this label selector (the operator's) is left in "
        "--pods-namespace",
    )
    release.add_argument(
        "--pods-namespace", metavar="NS", help="the namespace of --wait-for-pods's pods"
    )
    release.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for those pods to go (default: 120)",
    )
    release.set_defaults(handler=release_command)


def operator_command(args: argparse.Namespace) -> int:
    """`compass operator`: load the settings (COMPASS_*) and run until stopped."""

    try:
        settings = OperatorSettings()
    except ValidationError as error:
        fail("COMPASS_*", explain_validation_error(error), "fix that environment variable")
    settings = with_command_line(settings, args)
    try:
        return run(
            settings,
            namespaces=args.namespaces,
            all_namespaces=bool(args.all_namespaces),
        )
    except ValueError as error:
        fail("--namespace", str(error), "see 'compass operator --help'")
    except PeeringError as error:
        fail("--peering", str(error), PEERING_FIX)


def release_command(args: argparse.Namespace) -> int:
    """`compass operator release-finalizers`: wait for the operator's pods to go, if asked, then
    take kopf's finalizer off every workflow and policy it served."""
    if args.wait_for_pods and not args.pods_namespace:
        fail("--pods-namespace", "missing", "name the namespace of the --wait-for-pods pods")
    if args.timeout <= 0:
        fail("--timeout", f"{args.timeout:g} is not positive", "give seconds above 0")
    try:
        settings = OperatorSettings()
    except ValidationError as error:
        fail("COMPASS_*", explain_validation_error(error), "fix that environment variable")
    namespaces = args.release_namespaces or settings.namespaces or None
    api = kubeapi.load_client()
    if args.wait_for_pods:
        try:
            wait_for_pods_gone(api, args.pods_namespace, args.wait_for_pods, args.timeout)
        except OperatorStillRunningError as error:
            print(f"compass operator release-finalizers: {error}; nothing released")
            return 1
    released = release_finalizers(api, namespaces)
    for item in released:
        print(f"released {item.plural} {item.namespace}/{item.name}")
    where = ", ".join(namespaces) if namespaces else "the cluster"
    print(f"kopf's finalizer taken off {len(released)} object(s) in {where}")
    return 0


def with_command_line(settings: OperatorSettings, args: argparse.Namespace) -> OperatorSettings:
    """The settings with the command line's peering and log options applied (they win over
    COMPASS_*)."""
    update: dict[str, Any] = {}
    if getattr(args, "verbose", False):
        update["log_level"] = "debug"
    elif getattr(args, "log_level", None):
        update["log_level"] = args.log_level
    if getattr(args, "log_format", None):
        update["log_format"] = args.log_format
    if getattr(args, "standalone", False):
        update["peering"] = None
    elif getattr(args, "peering", None):
        update["peering"] = args.peering
    if getattr(args, "priority", None) is not None:
        update["peering_priority"] = args.priority
    return settings.model_copy(update=update)
