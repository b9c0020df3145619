"""What a ParetoPolicy tick decides from: whether one is due, the pause, the state (resumed from
the status, so a restarted operator never flips the configuration on start)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from compass.api.meta import GROUP
from compass.api.paretopolicy import ParetoPolicySpec
from compass.controllers.endpoints import SliceEntry, admitted
from compass.controllers.settings import OperatorSettings
from compass.controllers.targets import (
    TargetAccess,
    TargetRefusedError,
    endpoint_target,
    resolve_host,
)
from compass.dataplane.triton import RoutingError, parse_routing_key, routing_key
from compass.domain.evaluation import Config
from compass.domain.planner import Plan
from compass.domain.policy import PolicyState
from compass.domain.profiles import shown

# The policy scheduler's tick (COMPASS_POLICY_TICK_SECONDS, 1 s by default); intervalSeconds
# below it decide at every tick.
TICK_S = OperatorSettings().policy_tick_seconds
# Retry delays while Triton is unreachable grow up to this, so a long outage costs few calls
# but a restarted Triton is found again within seconds.
MAX_RETRY_DELAY_S = 8.0
# A policy's gauges outlive this process's last tick by this long: several of its longest gaps
# (a retry), so they never lapse while it acts, and go soon after it is paused or fenced.
SERIES_TTL_S = max(30.0, 3 * MAX_RETRY_DELAY_S)


LOG = logging.getLogger(__name__)


def saved_state(status: Mapping[str, Any]) -> PolicyState | None:
    """The policy state saved in the status, if it reads as one (anyone may have edited it)."""
    saved = status.get("policyState")
    if saved is None:
        return None
    if not isinstance(saved, dict):
        LOG.warning("status.policyState is not an object, starting afresh")
        return None
    try:
        return PolicyState.from_dict(saved)
    except (TypeError, ValueError) as error:
        LOG.warning("status.policyState unreadable, starting afresh: %s", error)
        return None


def decision_due(last_tick: float | None, now: float, interval_s: float) -> bool:
    """Whether a decision is due: intervalSeconds since the last one, to half a tick."""
    return last_tick is None or now - last_tick >= interval_s - TICK_S / 2


def retry_delay(failures: int, interval_s: float) -> float:
    """Delay before retrying after ``failures`` failed ticks in a row: doubling, capped."""
    base = max(interval_s, TICK_S)
    return float(min(MAX_RETRY_DELAY_S, base * 2 ** max(failures - 1, 0)))


def align_state(
    saved: PolicyState | None,
    last_observed: float | None,
    router_key: str,
    plan: Plan,
    now: float,
    stale_after_s: float,
) -> tuple[PolicyState, str | None]:
    """The state to decide from: the saved one if the router serves it (its downscale evidence
    dropped after a gap), else the router's configuration adopted (none if not on the front)."""
    serving = routing_names(plan, router_key)
    if saved is not None:
        saved = full_names(not_after(saved, now), plan)
    if saved is not None and saved.active is not None and _routed(saved) == serving:
        if last_observed is not None and now - last_observed <= stale_after_s:
            return saved, None
        dropped = saved.downscale_since is not None
        state = replace(saved, downscale_since=None, entry_levels=())
        return state, (
            "no observation for a while: downscale evidence restarts" if dropped else None
        )
    # Counters and the last switch (its time gates the upscale cooldown) are kept.
    base = saved or PolicyState()
    reset = replace(base, downscale_since=None, entry_levels=(), active_since=now)
    if serving is None:
        note = f"the router serves {router_key}, which is not on the front"
        return replace(reset, active=None, blend=None, weight=0.0), note
    active, blend, weight = serving
    adopted = replace(reset, active=active, blend=blend, weight=weight)
    if saved is None or saved.active is None:
        return adopted, None
    note = (
        f"the router serves {routing_label(adopted)}, not {routing_label(saved)}: adopted "
        "(changed outside the policy)"
    )
    return adopted, note


def not_after(state: PolicyState, now: float) -> PolicyState:
    """The saved state with no time later than now (a status edited into the future would hold
    every cooldown and the metrics-loss fallback until then)."""

    def bounded(time: float | None) -> float | None:
        return None if time is None else min(time, now)

    times = (state.active_since, state.last_switch_at, state.downscale_since, state.observed_at)
    late_samples = any(t > now for t, _ in (*state.entry_levels, *state.arrivals))
    if all(t is None or t <= now for t in times) and not late_samples:
        return state
    return replace(
        state,
        active_since=bounded(state.active_since),
        last_switch_at=bounded(state.last_switch_at),
        downscale_since=bounded(state.downscale_since),
        observed_at=bounded(state.observed_at),
        # Samples from the future are no evidence of anything: the windows start afresh.
        entry_levels=tuple(level for level in state.entry_levels if level[0] <= now),
        arrivals=tuple(sample for sample in state.arrivals if sample[0] <= now),
    )


def full_names(state: PolicyState, plan: Plan) -> PolicyState:
    """A state read back from a status, its cut (shown) member names made the front's again."""
    names = {shown(t.profile.name): t.profile.name for t in plan.thresholds}

    def full(name: str | None) -> str | None:
        return None if name is None else names.get(name, name)

    levels = tuple((t, names.get(n, n)) for t, n in state.entry_levels)
    active, blend = full(state.active), full(state.blend)
    if active == state.active and blend == state.blend and levels == state.entry_levels:
        return state  # names already full (the state of the last tick): nothing to copy
    return replace(state, active=active, blend=blend, entry_levels=levels)


def routing_names(plan: Plan, router_key: str) -> tuple[str, str | None, float] | None:
    """What a router's routing key serves, as front member names; None if not on the front."""
    try:
        base, blend, weight = parse_routing_key(router_key)
    except RoutingError:
        return None
    names = {t.profile.key: t.profile.name for t in plan.thresholds}
    if base not in names or (blend is not None and blend not in names):
        return None
    return names[base], None if blend is None else names[blend], weight


def state_routing(plan: Plan, state: PolicyState) -> tuple[Config, Config | None, float] | None:
    """What a state routes, as a router switch takes it: (config, blend or None, weight)."""
    index = None if state.active is None else plan.index(state.active)
    if index is None:
        return None
    blend = None if state.blend is None else plan.index(state.blend)
    config = plan.thresholds[index].profile.config
    if blend is None:
        return config, None, 0.0
    return config, plan.thresholds[blend].profile.config, state.weight


def state_routing_key(plan: Plan, state: PolicyState) -> str | None:
    """The routing key of what a state routes (as the routers report it); None if unknown."""
    routing = state_routing(plan, state)
    return None if routing is None else routing_key(*routing)


def _routed(state: PolicyState) -> tuple[str | None, str | None, float]:
    return state.active, state.blend, state.weight if state.blend is not None else 0.0


# Holds a policy as spec.paused does, without touching the spec (KEDA's
# autoscaling.keda.sh/paused): a person or a tool pauses a policy that GitOps or a workflow owns.
PAUSE_ANNOTATION = f"{GROUP}/paused"
PAUSE_VALUES = ("true", "false")


@dataclass(frozen=True)
class Pause:
    """Whether a policy is held, why (a Paused condition reason), and a note for people."""

    paused: bool
    reason: str  # PausedBySpec, PausedByAnnotation, InvalidPauseAnnotation or Active
    message: str = ""


# What a tick that found no pause reports (Health's default).
NOT_PAUSED = Pause(False, "Active")


def pause_of(spec: ParetoPolicySpec, annotations: Mapping[str, str] | None) -> Pause:
    """Whether spec.paused or the PAUSE_ANNOTATION holds the policy (an invalid value: not)."""
    value = (annotations or {}).get(PAUSE_ANNOTATION)
    if spec.paused:
        return Pause(True, "PausedBySpec", "spec.paused")
    if value is None or value == "false":
        return Pause(False, "Active")
    if value == "true":
        return Pause(True, "PausedByAnnotation", f"annotation {PAUSE_ANNOTATION}")
    return Pause(
        False,
        "InvalidPauseAnnotation",
        f"annotation {PAUSE_ANNOTATION}: {value[:64]!r} is not one of "
        f"{', '.join(repr(v) for v in PAUSE_VALUES)}; the policy is not paused",
    )


def paused_state(state: PolicyState) -> PolicyState:
    """While paused nothing is decided: no downscale evidence accumulates."""
    return replace(state, downscale_since=None, entry_levels=())


def routing_label(state: PolicyState) -> str | None:
    """What a state routes, as people read it: a member, or a member with a share of another."""
    if state.active is None or state.blend is None:
        return state.active
    return f"{state.active} + {state.weight:.0%} {state.blend}"


# ---------------------------------------------------------------------------- one actor a target


@dataclass(frozen=True, order=True)
class Claim:
    """A policy's claim on its routing target: the oldest acts (creationTimestamp, then name)."""

    created: str
    name: str
    namespace: str = ""

    def shown(self, namespace: str) -> str:
        """The policy as one in ``namespace`` reads it: its name, with its namespace if other."""
        return self.name if self.namespace in ("", namespace) else f"{self.namespace}/{self.name}"


def target_key(
    namespace: str, spec: Mapping[str, Any], access: TargetAccess | None = None
) -> tuple[str, str, str] | None:
    """What a policy switches as one key however spelled: ("service", namespace, name), else the
    address and port reached (no namespace of its own: policies of two on one router share a key);
    None for neither, or a target the settings refuse (no squatting another namespace's router)."""
    routing = spec.get("routing") if isinstance(spec, Mapping) else None
    if not isinstance(routing, Mapping):
        return None
    if routing.get("service"):
        return ("service", namespace, str(routing["service"]).lower())
    if routing.get("grpcEndpoint"):
        endpoint, access = str(routing["grpcEndpoint"]), access or TargetAccess()
        try:
            resolve_host(
                endpoint.rpartition(":")[0], _ENDPOINT_FIELD, namespace, access, router=True
            )
        except TargetRefusedError:
            return None  # refused (TargetNotAllowed): it switches nothing, so it claims nothing
        return endpoint_target(endpoint, namespace, access)
    return None


_ENDPOINT_FIELD = "routing.grpcEndpoint"


TargetKey = tuple[str, str, str]


def claim_keys(
    key: TargetKey,
    slices: Mapping[tuple[str, str], Iterable[Iterable[SliceEntry]]],
    pods_at: Callable[[str, str], Collection[str]],
    access: TargetAccess,
) -> set[TargetKey]:
    """The keys one router is held under: ``key``, its Service's admitted Pods' addresses, or the
    Services whose admitted slices list the address (a hand-made slice aliases nothing)."""
    kind, first, second = key
    keys = {key}
    if kind == "service":
        kept, _ = admitted(slices.get((first, second), ()), first, partial(pods_at, first), access)
        keys |= {_entry_key(entry, port) for entry in kept for _, port in entry.ports}
        return keys
    for (namespace, service), stores in slices.items():
        kept, _ = admitted(stores, namespace, partial(pods_at, namespace), access)
        if any(_entry_key(entry, port) == key for entry in kept for _, port in entry.ports):
            keys.add(("service", namespace, service))
    return keys


def _entry_key(entry: SliceEntry, port: int) -> TargetKey:
    return endpoint_target(f"{entry.host}:{port}", "")


def claim_of(body: Mapping[str, Any]) -> Claim | None:
    """The policy's claim; None while it is being deleted (the next one takes over)."""
    metadata = body.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return None
    return Claim(
        str(metadata.get("creationTimestamp") or ""),
        str(metadata.get("name") or ""),
        str(metadata.get("namespace") or ""),
    )


def claimant(claims: Iterable[Claim], mine: Claim) -> Claim | None:
    """The older policy acting on the target; None if this one does (two never fight over one)."""
    first = min([*claims, mine])
    return None if first == mine else first
