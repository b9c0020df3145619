"""The operator process (`compass operator`): kopf, liveness, metrics, peering and its fence."""

from __future__ import annotations

import getpass
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import client
from prometheus_client import start_http_server

from compass.api.crds import RESOURCES
from compass.api.meta import GROUP, VERSION
from compass.controllers import fencing, kubeapi
from compass.controllers.fencing import Fence
from compass.controllers.logs import configure_logging
from compass.controllers.runtime import RUNTIME_KEY, OperatorMetrics, Runtime
from compass.controllers.settings import OperatorSettings

logger = logging.getLogger(__name__)

PEERING_GROUP, PEERING_VERSION = "kopf.dev", "v1"
# Helm creates custom resources (the peering objects) after the Deployment: give them a moment.
PEERING_WAIT_S = 30.0


# How often a running operator re-checks for missing compass.io CRDs (and says so in its log).
CRD_RECHECK_S = 10.0
CRD_FIX = (
    "kubectl apply -f crds/ (with --validate=false before Kubernetes 1.28), or helm upgrade the "
    "chart with crds.install=true"
)


class PeeringError(Exception):
    """The peering CRD or object this operator must join is not there."""


@dataclass(frozen=True)
class Peering:
    """How this process joins kopf's peering: the object's name, its priority, the lifetime."""

    name: str
    priority: int
    lifetime_seconds: int


def automatic_priority(started_ns: int) -> int:
    """Earlier start, higher priority: a later replica waits for the acting one. Negative (in
    µs, so no tie), so any explicit priority >= 0 wins (kopf's --dev: 666)."""
    return -(started_ns // 1000)


def peering_of(settings: OperatorSettings, started_ns: int) -> Peering | None:
    """This process's peering, or None when it runs standalone."""
    if settings.peering is None:
        return None
    priority = settings.peering_priority
    return Peering(
        name=settings.peering,
        priority=automatic_priority(started_ns) if priority is None else priority,
        lifetime_seconds=settings.peering_lifetime_seconds,
    )


PEERING_FIX = (
    "apply the chart's crds/kopf-peerings.yml and create the object (kind ClusterKopfPeering "
    "when watching the cluster, else a KopfPeering in each watched namespace; apiVersion "
    "kopf.dev/v1, no spec), or run without --peering"
)


def peering_kind(clusterwide: bool) -> tuple[str, str]:
    """(kind, plural) of the peering objects kopf uses in this mode."""
    if clusterwide:
        return "ClusterKopfPeering", "clusterkopfpeerings"
    return "KopfPeering", "kopfpeerings"


def missing_peering_objects(
    api: Any, name: str, clusterwide: bool, namespaces: list[str]
) -> list[str]:
    """Where the peering object is missing: [""] cluster-wide, else the namespaces. Listed by
    name (list is what kopf needs anyway, get is not granted). PeeringError without the CRD."""
    kind, plural = peering_kind(clusterwide)
    custom: Any = client.CustomObjectsApi(api)
    selector = f"metadata.name={name}"
    missing = []
    for namespace in [""] if clusterwide else namespaces:
        method = (
            custom.list_cluster_custom_object
            if clusterwide
            else custom.list_namespaced_custom_object
        )
        where = [] if clusterwide else [namespace]
        try:
            found = kubeapi.list_items(
                method, PEERING_GROUP, PEERING_VERSION, *where, plural, field_selector=selector
            )
        except kubeapi.NotFoundError as error:
            raise PeeringError(f"the {kind} CRD ({plural}.{PEERING_GROUP}) is missing") from error
        if not found:
            missing.append(namespace)
    return missing


def wait_for_peering_objects(
    api: Any, peering: Peering, clusterwide: bool, namespaces: list[str]
) -> None:
    """Wait up to PEERING_WAIT_S for the peering objects (kopf would stay paused, silently)."""
    kind, _ = peering_kind(clusterwide)
    deadline = time.monotonic() + PEERING_WAIT_S
    while missing := missing_peering_objects(api, peering.name, clusterwide, namespaces):
        where = "cluster-wide" if clusterwide else "in " + ", ".join(missing)
        if time.monotonic() >= deadline:
            raise PeeringError(f"no {kind} {peering.name!r} {where}")
        logger.warning("waiting for the %s %r %s", kind, peering.name, where)
        time.sleep(2.0)


def own_identity(started_ns: int) -> str:
    """The pod's name ($POD_ID), else user@host/start/pid: as kopf picks it, for the fence's use."""
    pod = os.environ.get("POD_ID")
    if pod:
        return pod
    return f"{getpass.getuser()}@{socket.gethostname()}/{started_ns // 1_000_000_000}/{os.getpid()}"


def keep_fence(
    api: Any,
    peering: Peering,
    identity: str,
    fence: Fence,
    namespaces: list[str],
    stop: threading.Event,
) -> None:
    """Until ``stop``: renew the keep-alives, opening the fence of each scope that accepted one."""
    _, plural = peering_kind(fence.clusterwide)
    custom: Any = client.CustomObjectsApi(api)
    # A keep-alive that takes longer than the renewal period is as good as lost.
    wait_s = min(fence.renew_every_s, kubeapi.REQUEST_TIMEOUT_S[1])
    timeout = (min(wait_s, kubeapi.REQUEST_TIMEOUT_S[0]), wait_s)
    scopes = [fencing.CLUSTER_SCOPE] if fence.clusterwide else namespaces
    while not stop.is_set():
        round_started = time.monotonic()
        accepted = 0
        for scope in scopes:
            sent_at = time.monotonic()
            patch = fencing.keepalive_patch(identity, peering.priority, datetime.now(UTC))
            where = [] if fence.clusterwide else [scope]
            method = (
                custom.patch_cluster_custom_object
                if fence.clusterwide
                else custom.patch_namespaced_custom_object
            )
            try:
                kubeapi.call(
                    method,
                    PEERING_GROUP,
                    PEERING_VERSION,
                    *where,
                    plural,
                    peering.name,
                    patch,
                    timeout=timeout,
                    _content_type=kubeapi.JSON_PATCH,
                )
            except kubeapi.ERRORS as error:
                # 422 until kopf has added this peer (its first keep-alive), and after it left.
                logger.debug(
                    "fence keep-alive in %r not accepted: %s", scope, kubeapi.describe(error)
                )
                continue
            fence.renewed(scope, sent_at)
            accepted += 1
        # Refused (kopf has not joined yet) or lost: try again soon rather than a period later.
        period = fence.renew_every_s if accepted == len(scopes) else min(1.0, fence.renew_every_s)
        stop.wait(max(0.0, period - (time.monotonic() - round_started)))


def required_crds() -> dict[str, str]:
    """plural -> CRD name of every compass.io resource the operator serves."""
    return {resource.plural: resource.name for resource in RESOURCES}


def missing_crds(served: set[str] | None) -> list[str]:
    """The CRD names the operator needs that are not served (None: the API group is absent)."""
    return sorted(name for plural, name in required_crds().items() if plural not in (served or ()))


def served_resources(api: Any) -> set[str] | None:
    """The plurals served in compass.io/v1alpha1 (discovery: no rights needed); None: not served."""
    custom: Any = client.CustomObjectsApi(api)
    found = kubeapi.read(custom.get_api_resources, GROUP, VERSION)
    if found is None:
        return None
    return {str(r["name"]) for r in found.get("resources") or [] if "/" not in r["name"]}


def missing_crds_message(missing: list[str]) -> str:
    """The one log line for missing CRDs: which, the fix, and what the operator does meanwhile."""
    return (
        f"compass operator: the compass.io CRD(s) {', '.join(missing)} are not installed; "
        f"install them: {CRD_FIX}. Running meanwhile (liveness up), re-checking every "
        f"{CRD_RECHECK_S:g} s; their resources are served once they exist"
    )


def startup_missing_crds(api: Any) -> list[str]:
    """The CRDs missing at start-up ([] when unknown: kopf then retries and says so itself)."""
    try:
        return missing_crds(served_resources(api))
    except kubeapi.ERRORS as error:  # e.g. the API server unreachable
        logger.warning("compass operator: cannot check the compass.io CRDs: %s", error)
        return []


def wait_for_crds(api: Any, stop: threading.Event, found: threading.Event) -> None:
    """Re-check every CRD_RECHECK_S until all are served (then set ``found``, ``stop``) or stop."""
    while not stop.wait(CRD_RECHECK_S):
        try:
            missing = missing_crds(served_resources(api))
        except kubeapi.ERRORS as error:  # a flaky API server must not end the re-checks
            logger.warning("compass operator: cannot check the compass.io CRDs: %s", error)
            continue
        if not missing:
            logger.info(
                "compass operator: the compass.io CRDs are installed now; restarting the "
                "controllers to serve them"
            )
            found.set()
            stop.set()
            return
        logger.warning(
            "compass operator: still missing the compass.io CRD(s) %s; install them: %s",
            ", ".join(missing),
            CRD_FIX,
        )


def liveness_endpoint(settings: OperatorSettings) -> str:
    """kopf's liveness endpoint URL (the equivalent of `kopf run --liveness`)."""
    return f"http://0.0.0.0:{settings.health_port}/healthz"


def scope(
    settings: OperatorSettings, namespaces: list[str] | None, all_namespaces: bool
) -> tuple[bool, list[str]]:
    """(cluster-wide, namespaces): the command line over COMPASS_NAMESPACES; none: the cluster."""
    chosen = list(namespaces or settings.namespaces)
    if all_namespaces and namespaces:
        raise ValueError("--all-namespaces and --namespace exclude each other; pass one")
    if all_namespaces or not chosen:
        return True, []
    return False, chosen


def kopf_settings(peering: Peering | None = None) -> Any:
    """kopf's settings: standalone, or peering mandatory (paused until the peers are known)."""
    settings = kopf.OperatorSettings()
    settings.peering.standalone = peering is None
    if peering is not None:
        settings.peering.mandatory = True
        settings.peering.name = peering.name
        settings.peering.priority = peering.priority
        settings.peering.lifetime = peering.lifetime_seconds
    # Events are posted where the code asks (switches, transitions), not from kopf's log lines.
    settings.posting.loggers = False
    # kopf's own calls (status patches, Events, peering) get the operator's timeouts, not its 300 s
    # and no connect timeout; its request_timeout bounds a whole short request, never a watch.
    connect_s, read_s = kubeapi.REQUEST_TIMEOUT_S
    settings.networking.connect_timeout = connect_s
    settings.networking.request_timeout = connect_s + read_s
    return settings


# Handlers run on every watch event of their resource (each status write): their "succeeded"
# lines would say nothing every second either.
_QUIET_HANDLERS = ("Handler 'forget-policy-series'", "Handler 'forget-workflow-series'")


def _quiet_timer_successes(record: logging.LogRecord) -> bool:
    """Drop kopf's "... succeeded." lines of timers and every-event handlers: they say nothing."""
    message = record.getMessage()
    return not (
        record.levelno == logging.INFO
        and message.endswith("' succeeded.")
        and (message.startswith("Timer '") or message.startswith(_QUIET_HANDLERS))
    )


def _serve_until_crds_appear(api: Any, missing: list[str], options: dict[str, Any]) -> bool:
    """Run kopf (liveness up) while polling for the missing CRDs; True once served, False if
    stopped. Polled: kopf may miss a CRD created after it started (discovery lags, no watch)."""
    logger.warning(missing_crds_message(missing))
    stop, found = threading.Event(), threading.Event()
    threading.Thread(
        target=wait_for_crds, args=(api, stop, found), name="compass-crds", daemon=True
    ).start()
    kopf.run(**options, stop_flag=stop)
    stop.set()  # kopf returned on its own (a signal): end the re-checks
    return found.is_set()


def run(
    settings: OperatorSettings,
    *,
    namespaces: list[str] | None = None,
    all_namespaces: bool = False,
) -> int:
    """Run the operator until SIGINT/SIGTERM; the exit code."""
    clusterwide, watched = scope(settings, namespaces, all_namespaces)
    started_ns = time.time_ns()
    peering = peering_of(settings, started_ns)
    identity = own_identity(started_ns)
    # Registers every handler with kopf's default registry, which only the running operator
    # wants (and after the settings are read: workflow_handlers reads one at import).
    import compass.controllers.handlers  # noqa: F401

    configure_logging(settings.log_level, settings.log_format)
    if settings.log_level != "debug":
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
    if peering is None:
        logger.info("compass operator: standalone (no peering): run no other operator here")
    else:
        kind, _ = peering_kind(clusterwide)
        logger.info(
            "compass operator: peering in %s %r as %s with priority %d, lifetime %d s: acts only "
            "while no live peer has a higher priority (paused until the peers are known) and the "
            "API server accepts its keep-alives",
            kind,
            peering.name,
            identity,
            peering.priority,
            peering.lifetime_seconds,
        )
    fence = None if peering is None else Fence(peering.lifetime_seconds, clusterwide)
    runtime = Runtime(settings=settings, metrics=metrics, fence=fence)
    memo: Any = kopf.Memo()
    memo[RUNTIME_KEY] = runtime
    options: dict[str, Any] = {
        "settings": kopf_settings(peering),
        "standalone": peering is None,
        "clusterwide": clusterwide,
        "namespaces": watched,
        "liveness_endpoint": liveness_endpoint(settings),
        "memo": memo,
        "identity": identity,
    }
    stop_fence = threading.Event()
    try:
        if peering is not None and fence is not None:
            wait_for_peering_objects(runtime.api(), peering, clusterwide, watched)
            threading.Thread(
                target=keep_fence,
                args=(runtime.api(), peering, identity, fence, watched, stop_fence),
                name="compass-fence",
                daemon=True,
            ).start()
        missing = startup_missing_crds(runtime.api())
        if missing and not _serve_until_crds_appear(runtime.api(), missing, options):
            return 0
        # Fresh settings: the first run's startup handlers changed its copy.
        kopf.run(**{**options, "settings": kopf_settings(peering)})
    finally:
        runtime.stop()
        stop_fence.set()
        server.shutdown()
        thread.join(timeout=5)
    return 0
