"""A ParetoPolicy's status and gauges, and the merge patch that writes the status."""

from __future__ import annotations

import math
import threading
import weakref
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from compass.api.paretopolicy_status import (
    ActiveConfiguration,
    BlendStatus,
    ConditionType,
    ParetoPolicyStatus,
    RoutingStatus,
    ServedConfiguration,
    ServedStatus,
)
from compass.api.schema import without_empty_strings
from compass.controllers.conditions import find_condition, one_line, parse_conditions
from compass.conversion import threshold_statuses
from compass.domain.elastico import capacity_pressure
from compass.domain.evaluation import ParamValue
from compass.domain.planner import Plan
from compass.domain.policy import Observation, PolicyState
from compass.domain.profiles import shown
from compass.domain.served import ServedCounts, served_view

# A status whose only change is the observation time is written at most this often: an idle
# policy should not write to etcd every second.
STATUS_HEARTBEAT_S = 10.0
# How wide each policy's slot of the heartbeat is (a tick: it is seen at one tick of each).
HEARTBEAT_SLOT_S = 1.0


def rfc3339(seconds: float) -> str:
    """Epoch seconds as RFC 3339 UTC with milliseconds."""
    stamp = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def parse_rfc3339(value: object) -> float | None:
    """RFC 3339 back to epoch seconds; None if absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def active_configuration(
    plan: Plan, name: str | None, blend: str | None = None, weight: float = 0.0
) -> ActiveConfiguration | None:
    """The front member with this name as the status shows it, with its blend if any."""
    index = None if name is None else plan.index(name)
    if index is None:
        return None
    # Rounded for people (kubectl's printer columns print every digit); the spec keeps them all.
    # Names and values cut (shown): the status must fit whatever the spec holds.
    blend_index = None if blend is None else plan.index(blend)
    blended = (
        None
        if blend is None or blend_index is None or not 0 < weight < 1
        else BlendStatus(name=shown(blend), index=blend_index, weight=round(weight, 4))
    )
    profile = plan.thresholds[index].profile
    return ActiveConfiguration(
        name=shown(profile.name),
        config=shown_config(profile.config),
        index=index,
        accuracy=round(profile.accuracy, 4),
        latency_mean_ms=round(profile.mean_ms, 1),
        latency_p95_ms=round(profile.p95_ms, 1),
        blend=blended,
    )


def shown_config(config: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """A configuration as the status shows it: long names and string values cut (shown)."""
    return {shown(k): shown(v) if isinstance(v, str) else v for k, v in config.items()}


def shown_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """PolicyState.to_dict, names cut (shown; align_state maps them back), the reason one line."""
    out = dict(state)
    for key in ("active", "blend"):
        if isinstance(out.get(key), str):
            out[key] = shown(out[key])
    out["entry_levels"] = [[t, shown(n)] for t, n in out.get("entry_levels") or []]
    if isinstance(out.get("last_reason"), str):
        out["last_reason"] = one_line(out["last_reason"])
    return out


@dataclass(frozen=True)
class PolicyGauges:
    """The per-policy gauges after a tick (None keeps a series, or removes an optional one)."""

    ready: bool
    paused: bool | None = None
    metrics_available: bool | None = None
    queue_depth: float | None = None
    # The active entry: position, name, accuracy served, queue thresholds; None: none known.
    active_index: int | None = None
    active_name: str | None = None
    at_fastest: bool | None = None
    served_accuracy: float | None = None
    stay_queue_threshold: float | None = None
    enter_queue_threshold: float | None = None
    # None while the queue is not known fresh: no figure, so that an autoscaler holds its
    # replicas (its query errs) instead of acting on a stale one.
    capacity_pressure: float | None = None
    # status.served's stream times (s); None, as for the pressure: no series (no router streams).
    served_ttft_seconds: float | None = None
    served_stream_seconds: float | None = None


def policy_gauges(
    plan: Plan,
    state: PolicyState,
    observation: Observation | None,
    conditions: Sequence[Mapping[str, Any]],
    paused: bool,
) -> PolicyGauges:
    """The policy's gauges after a decision (the capacity pressure only on a fresh queue)."""
    parsed = parse_conditions(conditions)  # once (is_ready would parse them again)
    metrics = find_condition(parsed, ConditionType.METRICS_AVAILABLE)
    ready = find_condition(parsed, ConditionType.READY)
    fresh = metrics is not None and metrics.status == "True"
    index = None if state.active is None else plan.index(state.active)
    depth = None if observation is None else observation.queue_depth
    pressure = None
    if fresh and depth is not None:
        pressure = capacity_pressure(plan, state.active, depth)
    gauges = PolicyGauges(
        ready=ready is not None and ready.status == "True",
        paused=paused,
        metrics_available=None if metrics is None else fresh,
        queue_depth=depth,
        capacity_pressure=pressure,
    )
    if index is None:
        return gauges
    threshold = plan.thresholds[index]
    accuracy = threshold.profile.accuracy
    blend = None if state.blend is None else plan.index(state.blend)
    if blend is not None and 0 < state.weight < 1:
        share = state.weight
        accuracy = (1 - share) * accuracy + share * plan.thresholds[blend].profile.accuracy
    eligible = plan.eligible
    return replace(
        gauges,
        active_index=index,
        active_name=threshold.profile.name,
        at_fastest=bool(eligible) and index == eligible[0],
        served_accuracy=accuracy,
        stay_queue_threshold=_limit(threshold.stay_max_queue),
        enter_queue_threshold=_limit(threshold.enter_max_queue),
    )


def with_stream_times(gauges: PolicyGauges, served: Mapping[str, Any] | None) -> PolicyGauges:
    """The gauges with status.served's stream times (ms there, s here); none where it has none."""
    ttft, stream = (
        (None, None) if served is None else (served.get("ttftMeanMs"), served.get("streamMeanMs"))
    )
    return replace(
        gauges,
        served_ttft_seconds=None if ttft is None else ttft / 1000,
        served_stream_seconds=None if stream is None else stream / 1000,
    )


def _limit(queue: int | None) -> float:
    """A queue limit as a gauge: none means no queue at all is allowed (0)."""
    return 0.0 if queue is None else float(queue)


def build_status(
    plan: Plan,
    state: PolicyState,
    observation: Observation | None,
    previous: Mapping[str, Any],
    decision: str,
    conditions: list[dict[str, Any]],
    generation: int | None,
    routing: RoutingStatus | None = None,
    served: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole status (camelCase, JSON-ready); what was not observed keeps its previous value."""
    depth = observation.queue_depth if observation is not None else previous.get("lastQueueDepth")
    observed = (
        rfc3339(observation.time)
        if observation is not None
        else previous.get("lastObservationTime")
    )
    status = ParetoPolicyStatus(
        active=active_configuration(plan, state.active, state.blend, state.weight),
        last_queue_depth=None if depth is None or not math.isfinite(depth) else float(depth),
        last_observation_time=observed,
        last_decision=one_line(decision),
        last_switch_time=None if state.last_switch_at is None else rfc3339(state.last_switch_at),
        last_switch_reason=one_line(state.last_reason)
        if state.last_switch_at is not None
        else None,
        switches=state.switches,
        routing=routing,
        policy_state=shown_state(state.to_dict()),
        observed_generation=generation,
    )
    data = status.model_dump(by_alias=True, mode="json")
    data["conditions"] = conditions
    # The arrivals samples (numbers only) and the plan's thresholds (made once) skip the walk.
    saved = data.get("policyState") or {}
    arrivals = saved.pop("arrivals", None)
    written = dict(without_empty_strings(data))
    if arrivals is not None:
        written["policyState"]["arrivals"] = arrivals
    written["thresholds"] = plan_thresholds(plan)
    shown_served = served if served is not None else previous.get("served")
    if shown_served is not None:
        written["served"] = shown_served
    return written


def served_status(counts: ServedCounts, plan: Plan, now: float) -> dict[str, Any]:
    """status.served from the routers' counts, named by the front (rounded: steady mix, steady)."""
    known = {t.profile.key: (t.profile.name, t.profile.accuracy) for t in plan.thresholds}
    view = served_view(counts, known)
    status = ServedStatus(
        observed_time=rfc3339(now),
        window_seconds=round(view.seconds),
        requests=view.answered,
        refused=view.refused,
        accuracy=None if view.accuracy is None else round(view.accuracy, 4),
        configurations=[
            ServedConfiguration(
                name=share.name,
                share=round(share.share, 3),
                accuracy=None if share.accuracy is None else round(share.accuracy, 4),
            )
            for share in view.shares
        ],
        ttft_mean_ms=_ms(view.ttft_mean_s),
        stream_mean_ms=_ms(view.stream_mean_s),
    )
    served = dict(without_empty_strings(status.model_dump(by_alias=True, mode="json")))
    # No stream times where no router streamed: a non-streaming router's view is as it was.
    for key in ("ttftMeanMs", "streamMeanMs"):
        if served.get(key) is None:
            served.pop(key, None)
    return served


def _ms(seconds: float | None) -> float | None:
    """A mean time in s as status.served shows it: ms, to a tenth (a steady stream, steady)."""
    return None if seconds is None else round(seconds * 1000, 1)


# The thresholds each plan shows in the status, made once (every tick, they were a third of a
# steady tick's CPU), by the plan's id (not hashable), dropped when the plan goes.
_THRESHOLDS: dict[int, list[dict[str, Any]]] = {}
_THRESHOLDS_LOCK = threading.Lock()


def plan_thresholds(plan: Plan) -> list[dict[str, Any]]:
    """status.thresholds of a plan, as written (shared: never change it in place)."""
    with _THRESHOLDS_LOCK:
        known = _THRESHOLDS.get(id(plan))
    if known is None:
        shown_thresholds = [
            t.model_copy(update={"config": shown(t.config)}) for t in threshold_statuses(plan)
        ]
        # No nulls: the API server keeps none of a merge patch's (owned_fields below).
        known = [
            without_empty_strings(t.model_dump(by_alias=True, mode="json", exclude_none=True))
            for t in shown_thresholds
        ]
        with _THRESHOLDS_LOCK:
            if id(plan) not in _THRESHOLDS:
                weakref.finalize(plan, _THRESHOLDS.pop, id(plan), None)
            _THRESHOLDS[id(plan)] = known
    return known


def error_status(
    previous: Mapping[str, Any], conditions: list[dict[str, Any]], generation: int | None
) -> dict[str, Any]:
    """The previous status with new conditions: what a tick that could not decide writes."""
    return dict(
        without_empty_strings(
            {**previous, "conditions": conditions, "observedGeneration": generation}
        )
    )


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new`` (empty: nothing changed)."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif (key not in old and value is not None) or (key in old and before != value):
            patch[key] = value
    return patch


def _condition_states(conditions: Any) -> list[tuple[Any, ...]] | None:
    """Each condition's type, status and reason: what a condition says, less its wording."""
    if not isinstance(conditions, list):
        return None
    return [
        (c.get("type"), c.get("status"), c.get("reason")) if isinstance(c, Mapping) else (c,)
        for c in conditions
    ]


# The status fields only the operator decides; the routine samples of the saved state are left
# out of the comparison (the object read may be a tick behind the operator's last write).
_OWNED = (
    "active",
    "switches",
    "lastSwitchTime",
    "lastSwitchReason",
    "routing",
    "thresholds",
    "policyState",
)
_ROUTINE_STATE = ("arrivals", "observed_at")
# The status fields a tick changes routinely (the saved state: only its routine samples).
_ROUTINE = frozenset(
    {"lastObservationTime", "lastQueueDepth", "lastDecision", "policyState", "conditions", "served"}
)


def owned_fields(status: Mapping[str, Any]) -> dict[str, Any]:
    """The status fields only the operator decides (less routine state), without nulls: the API
    server keeps none of a merge patch's, so a null written is a missing key, no one's edit."""

    def owned(key: str) -> Any:
        value = status.get(key)
        if key == "policyState" and isinstance(value, Mapping):
            return {k: v for k, v in value.items() if k not in _ROUTINE_STATE}
        return value

    return {key: _without_nulls(owned(key)) for key in _OWNED}


def _without_nulls(value: Any) -> Any:
    """``value`` with every null member of its objects dropped, at any depth."""
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _edited(
    written: Mapping[str, Any], live: Mapping[str, Any], recent: Sequence[Mapping[str, Any]]
) -> list[str]:
    """The operator's fields whose live value is none it wrote (last, ``recent``: a late watch)."""
    seen = [owned_fields(written), *recent]
    now = owned_fields(live)
    return [key for key in _OWNED if all(fields.get(key) != now[key] for fields in seen)]


def status_patch(
    previous: Mapping[str, Any],
    new: Mapping[str, Any],
    now: float,
    last_write: float | None,
    heartbeat_s: float = STATUS_HEARTBEAT_S,
    live: Mapping[str, Any] | None = None,
    recent: Sequence[Mapping[str, Any]] = (),
    phase_s: float | None = None,
) -> dict[str, Any]:
    """What to write: the changes, the routine ones (observation, queue, samples, served, wordings)
    only at the heartbeat, in the policy's ``phase_s`` slot; the operator's own fields that differ
    ``live`` from what it wrote (``previous``, ``recent``) put back at once."""
    patch = merge_patch(previous, new)
    for key in _edited(previous, live or previous, recent):
        if key in new:
            repair = merge_patch({key: live.get(key) if live else None}, {key: new[key]})
            if key in repair:
                patch[key] = repair[key]
    state = patch.get("policyState")
    quiet = (
        set(patch) <= _ROUTINE
        and (state is None or (isinstance(state, Mapping) and set(state) <= set(_ROUTINE_STATE)))
        and (
            "conditions" not in patch
            or _condition_states(previous.get("conditions"))
            == _condition_states(new.get("conditions"))
        )
    )
    if quiet and not heartbeat_due(now, last_write, heartbeat_s, phase_s):
        return {}
    return patch


def heartbeat_phase(uid: str) -> float:
    """A policy's slot in each heartbeat (a share, 0..1), spread by its uid: the same every run."""
    return (zlib.crc32(uid.encode()) % 1000) / 1000


def heartbeat_due(
    now: float,
    last_write: float | None,
    heartbeat_s: float,
    phase: float | None = None,
) -> bool:
    """Whether a routine write is due: a heartbeat after the last, or with ``phase`` in its slot,
    from half to one and a half heartbeats after the last (no write yet this run: its slot)."""
    if phase is None:
        return last_write is None or now - last_write >= heartbeat_s
    in_slot = (now - phase * heartbeat_s) % heartbeat_s < HEARTBEAT_SLOT_S
    if last_write is None:  # a restarted operator: the slot, so they do not all write at once
        return in_slot
    since = now - last_write
    return since >= 1.5 * heartbeat_s or (since >= heartbeat_s / 2 and in_slot)


# The answers of a status too large to store: 413 from the API server (request body), 422 from
# validation, 500 from etcd ("etcdserver: request is too large").
_SIZE_STATUSES = frozenset({413, 422, 500})
_SIZE_WORDS = ("too large", "too long", "exceeds", "request entity")
# What a status that could not be stored keeps: its conditions and generation; the rest goes.
_DROPPED_WHEN_TOO_LARGE = (
    "active",
    "routing",
    "thresholds",
    "policyState",
    "lastDecision",
    "lastSwitchReason",
)


def too_large(status: int | None, message: str) -> bool:
    """Whether a failed status write was refused for its size (413 always; 422 or 500 saying so)."""
    if status == 413:
        return True
    lowered = message.lower()
    return status in _SIZE_STATUSES and any(word in lowered for word in _SIZE_WORDS)


def too_large_patch(
    conditions: Sequence[Mapping[str, Any]], generation: int | None, why: str, now: float
) -> dict[str, Any]:
    """The small status written when the whole was too large: large fields gone, Ready False."""
    ready = {
        "type": ConditionType.READY.value,
        "status": "False",
        "reason": "StatusTooLarge",
        "message": one_line(f"the status could not be written: {why}"),
        "lastTransitionTime": rfc3339(now),
        "observedGeneration": generation,
    }
    kept = [dict(c) for c in conditions if c.get("type") != ConditionType.READY.value]
    return {
        **dict.fromkeys(_DROPPED_WHEN_TOO_LARGE),
        "conditions": [ready, *kept],
        "observedGeneration": generation,
    }
