"""What every runtime policy shares: its observation, decision and state, and its protocol."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from compass.domain.mix import Mix


class Action(StrEnum):
    """What a decision does to the active configuration."""

    HOLD = "hold"
    FASTER = "faster"
    MORE_ACCURATE = "more-accurate"
    FALLBACK = "fallback"


@dataclass(frozen=True)
class Observation:
    """What the metrics said, when (the policy's clock), per pod as the planner's thresholds are;
    ``arrival_rate_qps`` serves where there is no ``arrivals_total`` counter."""

    time: float
    queue_depth: float
    arrivals_total: float | None = None
    arrival_rate_qps: float | None = None
    pods: int = 1


@dataclass(frozen=True)
class Decision:
    """The configuration to serve from now on, and why (a split: ``blend`` at ``weight``)."""

    target: str
    index: int
    action: Action
    reason: str
    blend: str | None = None
    blend_index: int | None = None
    weight: float = 0.0

    @staticmethod
    def routing(mix: Mix, names: Sequence[str], action: Action, reason: str) -> Decision:
        """The decision to route ``mix`` of the front named ``names``."""
        blend = None if mix.blend is None else names[mix.blend]
        return Decision(names[mix.base], mix.base, action, reason, blend, mix.blend, mix.weight)

    @property
    def switched(self) -> bool:
        """Whether the routing changes."""
        return self.action is not Action.HOLD

    @property
    def mix(self) -> Mix:
        """The routing as front indices and the blend's share."""
        return Mix(self.index, self.blend_index, self.weight)


@dataclass(frozen=True)
class PolicyState:
    """Everything the policy remembers between decisions; plain data, JSON-serialisable."""

    active: str | None = None
    # The split strategy's blend: the member serving a share `weight` of the requests.
    blend: str | None = None
    weight: float = 0.0
    active_since: float | None = None
    last_switch_at: float | None = None
    last_reason: str = ""
    switches: int = 0
    # Since when a more accurate configuration's condition held, and the highest at each look.
    downscale_since: float | None = None
    entry_levels: tuple[tuple[float, str], ...] = ()
    # Recent (time, arrivals counter) samples.
    arrivals: tuple[tuple[float, float], ...] = ()
    # When the samples of the newest fresh observation were taken.
    observed_at: float | None = None

    def mix(self, index: Callable[[str], int | None]) -> Mix | None:
        """The routing as front indices (``index``: a member's by name); None if one is unknown."""
        base = None if self.active is None else index(self.active)
        blend = None if self.blend is None else index(self.blend)
        if base is None or (self.blend is not None and blend is None):
            return None
        return Mix(base, blend, self.weight)

    def switched(self, decision: Decision, now: float) -> PolicyState:
        """The state routing ``decision`` from ``now`` on, for its reason: one switch more."""
        return replace(
            self,
            active=decision.target,
            blend=decision.blend,
            weight=decision.weight,
            active_since=now,
            last_switch_at=now,
            last_reason=decision.reason,
            switches=self.switches + 1,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping (what a Kubernetes status would hold)."""
        # Not asdict: its deep copy of every arrivals sample was most of a steady tick's CPU.
        data = {name: getattr(self, name) for name in PolicyState.__dataclass_fields__}
        data["entry_levels"] = [list(entry) for entry in self.entry_levels]
        data["arrivals"] = [list(sample) for sample in self.arrivals]
        return data

    @staticmethod
    def from_dict(data: dict[str, Any]) -> PolicyState:
        """The state back from ``to_dict``; anyone who can write the status may have edited it."""
        known = {name: data[name] for name in PolicyState.__dataclass_fields__ if name in data}
        for name in ("active", "blend"):
            _text(known, name, nullable=True)
        _text(known, "last_reason", nullable=False)
        for name in ("active_since", "last_switch_at", "downscale_since", "observed_at"):
            if known.get(name) is not None:
                known[name] = _saved_number(known[name], name, MAX_SAVED_TIME_S)
        if "weight" in known:
            known["weight"] = _saved_number(known["weight"], "weight", 1.0)
        if "switches" in known:
            switches = known["switches"]
            if isinstance(switches, bool) or not isinstance(switches, int):
                raise ValueError(f"switches: {switches!r} is not a whole number")
            known["switches"] = round(_saved_number(switches, "switches", MAX_SAVED_COUNT))
        known["entry_levels"] = tuple(
            (_saved_number(time, "entry_levels", MAX_SAVED_TIME_S), _name(name, "entry_levels"))
            for time, name in _pairs(known.get("entry_levels", ()), "entry_levels")
        )
        known["arrivals"] = tuple(
            (
                _saved_number(time, "arrivals", MAX_SAVED_TIME_S),
                _saved_number(total, "arrivals", MAX_SAVED_COUNT),
            )
            for time, total in _pairs(known.get("arrivals", ()), "arrivals")
        )
        return PolicyState(**known)


# What a saved state may hold: epoch seconds up to the year 2286, counts where a float still
# counts by one, names and reasons of a status's size, this many samples.
MAX_SAVED_TIME_S = 1e10
MAX_SAVED_COUNT = 2.0**53
MAX_SAVED_TEXT = 4096
MAX_SAVED_SAMPLES = 100_000


def _saved_number(value: object, field: str, high: float) -> float:
    """A finite number in [0, high] from a saved state; ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field}: {value!r} is not a number")
    if not 0 <= value <= high:  # NaN fails too
        raise ValueError(f"{field}: {value!r} is outside [0, {high:g}]")
    return float(value)


def _name(value: object, field: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_SAVED_TEXT:
        raise ValueError(f"{field}: {value!r:.80} is not a name")
    return value


def _text(known: dict[str, Any], field: str, *, nullable: bool) -> None:
    if field in known and not (nullable and known[field] is None):
        _name(known[field], field)


def _pairs(value: object, field: str) -> list[tuple[object, object]]:
    """A saved list of two-element lists."""
    if not isinstance(value, list | tuple) or len(value) > MAX_SAVED_SAMPLES:
        raise ValueError(f"{field}: not a list of at most {MAX_SAVED_SAMPLES} pairs")
    if not all(isinstance(pair, list | tuple) and len(pair) == 2 for pair in value):
        raise ValueError(f"{field}: not a list of [time, value] pairs")
    return [(pair[0], pair[1]) for pair in value]


class Policy(Protocol):
    """A runtime policy: pure ``decide(observation, state, now) -> (decision, state)``."""

    def initial_state(self, now: float) -> PolicyState:
        """The state before the first decision."""
        ...

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        """The routing after this observation (None: none came) and the new state."""
        ...
