"""Elastico: the runtime policy that switches the active configuration as the load changes.

It leaves for a faster configuration at once and enters a more accurate one only after its entry
condition held for its whole cooldown. The rules: docs/method.md, "Elastico"."""

from __future__ import annotations

import functools
import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from scipy.special import bdtr, bdtrc, gammaincinv

from compass.domain.planner import Plan
from compass.domain.policy import Action, Decision, Observation, PolicyState

DEFAULT_DOWNSCALE_COOLDOWN_S = 5.0
DEFAULT_COOLDOWN_EXPONENT = 4.0
DEFAULT_STALE_AFTER_S = 5.0
DEFAULT_INTERVAL_S = 1.0
# Windows (s) over which a rise in the arrival rate is looked for: short enough to see a burst
# within a second or two, long enough to see a sustained overload of a few percent.
LEAVE_WINDOWS_S = (1.0, 2.0, 5.0)
# Leave when the arrivals exceed the limit with this confidence; enter when they stay below it
# with that one: a false leave is rarer than hourly, a 5x burst shows in 1-2 s.
LEAVE_CONFIDENCE = 0.8
ENTER_CONFIDENCE = 0.7
# steady_window's: a rise is believed sooner than a fall, the hysteresis' asymmetry.
STEADY_WINDOWS_S = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
RISE_SIGNIFICANCE = 0.05
FALL_SIGNIFICANCE = 0.01
# Counter samples older than the longest window needed are dropped; this caps the state.
MAX_HISTORY_S = 600.0
# The longest burst memory a policy may ask for (its looks stay well within the history).
MAX_BURST_MEMORY_S = 300.0
# The settings' bounds: a cooldown past the history could never be proven, an exponent of 8
# already makes twice as slow 256 times the base, and past an hour a metric is no reading of now.
MAX_COOLDOWN_S = MAX_HISTORY_S
MAX_COOLDOWN_EXPONENT = 8.0
MAX_STALE_AFTER_S = 3600.0
MAX_INTERVAL_S = 3600.0


class MetricsLoss(StrEnum):
    """What the policy does once the queue depth has been missing or stale for stale_after_s."""

    HOLD = "hold"
    FASTEST = "fastest"


@dataclass(frozen=True)
class ElasticoSettings:
    """The policy's knobs; defaults are the ParetoPolicy spec's defaults."""

    upscale_cooldown_s: float = 0.0
    downscale_cooldown_s: float = DEFAULT_DOWNSCALE_COOLDOWN_S
    cooldown_exponent: float = DEFAULT_COOLDOWN_EXPONENT
    on_metrics_loss: MetricsLoss = MetricsLoss.FASTEST
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    paused: bool = False
    # Rate evidence from steady_window instead of fixed windows: close enough to sit at a limit.
    adaptive_rate: bool = False
    # No entry while the last this many seconds showed a rate above its stay limit (0: none).
    burst_memory_s: float = 0.0


def rate_lower_bound(count: float, window_s: float, confidence: float) -> float:
    """A lower confidence bound on a Poisson rate from ``count`` arrivals in ``window_s``."""
    if count <= 0 or window_s <= 0:
        return 0.0
    # As a float: a count made of integer counters may exceed what the ufunc takes as an int.
    return float(gammaincinv(float(count), 1 - confidence)) / window_s


def rate_upper_bound(count: float, window_s: float, confidence: float) -> float:
    """An upper confidence bound on a Poisson rate from ``count`` arrivals in ``window_s``."""
    if window_s <= 0:
        return math.inf
    return float(gammaincinv(float(max(count, 0.0)) + 1, confidence)) / window_s


def steady_window(
    samples: Sequence[tuple[float, float]], now: float, pods: int = 1, dispersion: float = 1.0
) -> tuple[float, float] | None:
    """(arrivals of all pods, seconds) over the longest recent window in which they look steady:
    windows double while the older half agrees with the newer, clumps counting as fewer."""
    best: tuple[float, float] | None = None
    for window in STEADY_WINDOWS_S:
        measured = _arrivals_in(samples, now, window)
        if measured is None:
            break
        count, seconds = round(measured[0] * pods / dispersion), measured[1]
        if best is not None and seconds > best[1]:
            newer, newer_s = best
            share = newer_s / seconds
            # P(newer count this low) and P(this high) if the rate had not changed.
            fell = float(bdtr(newer, count, share))
            rose = float(bdtrc(newer - 1, count, share)) if newer >= 1 else 1.0
            if rose < RISE_SIGNIFICANCE or fell < FALL_SIGNIFICANCE:
                break
        best = (count, seconds)
    return best


def _leave_rate(samples: Sequence[tuple[float, float]], now: float, pods: int) -> float | None:
    """The highest per-pod rate the arrivals up to ``now`` show with LEAVE_CONFIDENCE, if known."""
    bounds = [
        rate_lower_bound(count * pods, seconds, LEAVE_CONFIDENCE) / pods
        for window in LEAVE_WINDOWS_S
        if (measured := _arrivals_in(samples, now, window)) is not None
        for count, seconds in [measured]
    ]
    return max(bounds) if bounds else None


def _arrivals_in(
    samples: Sequence[tuple[float, float]], now: float, window_s: float
) -> tuple[float, float] | None:
    """(arrivals, seconds) over the last ``window_s``; None where the samples do not reach."""
    # Samples are in time order: a binary search, as every look reads several windows.
    before = bisect_right(samples, now - window_s + 1e-9, key=lambda sample: sample[0])
    if before == 0:
        return None
    t0, total0 = samples[before - 1]
    t1, total1 = samples[-1]
    return total1 - total0, t1 - t0


def record_arrivals(state: PolicyState, observation: Observation, keep_s: float) -> PolicyState:
    """The state with the counter sample added and those past ``keep_s`` dropped (a reset: anew)."""
    if observation.arrivals_total is None:
        return replace(state, arrivals=())
    samples = [s for s in state.arrivals if s[0] < observation.time]
    if samples and observation.arrivals_total < samples[-1][1]:
        samples = []
    samples.append((observation.time, observation.arrivals_total))
    keep_from = observation.time - keep_s
    older = [i for i, (t, _) in enumerate(samples) if t <= keep_from]
    return replace(state, arrivals=tuple(samples[older[-1] if older else 0 :]))


def capacity_pressure(plan: Plan, active: str | None, queue_depth: float | None) -> float:
    """(queue + 1) / (limit + 1) once the fastest eligible entry is over its stay limit, else 0:
    an autoscaler sizing replicas x pressure (target 1) brings each one's share back within it."""
    if active is None or queue_depth is None or not math.isfinite(queue_depth):
        return 0.0
    eligible = plan.eligible
    if not eligible or plan.index(active) != eligible[0]:
        return 0.0
    limit = plan.thresholds[eligible[0]].stay_max_queue or 0
    if queue_depth <= limit:
        return 0.0
    return (queue_depth + 1) / (limit + 1)


@dataclass(frozen=True)
class Elastico:
    """The Elastico policy over one plan (front and thresholds)."""

    plan: Plan
    settings: ElasticoSettings = ElasticoSettings()

    @property
    def fastest(self) -> int:
        """Index of the fastest eligible configuration (the safe default)."""
        return self.plan.eligible[0]

    def cooldown_s(self, index: int) -> float:
        """How long ``index``'s entry condition must hold: the cooldown x slowdown ** exponent."""
        fastest = self.plan.thresholds[self.fastest].profile.mean_ms
        slowdown = max(1.0, self.plan.thresholds[index].profile.mean_ms / fastest)
        base = self.settings.downscale_cooldown_s
        if base <= 0:
            return 0.0
        # In logs first: settings past the schema's bounds cap it instead of overflowing.
        if self.settings.cooldown_exponent * math.log(slowdown) >= math.log(MAX_HISTORY_S / base):
            return MAX_HISTORY_S
        return float(min(base * slowdown**self.settings.cooldown_exponent, MAX_HISTORY_S))

    def initial_state(self, now: float) -> PolicyState:
        """A fresh policy starts on the fastest eligible configuration and climbs from there."""
        name = self.plan.names[self.fastest]
        return PolicyState(active=name, active_since=now, last_reason="initial: fastest")

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        """The configuration to serve after this observation, and the policy's new state."""
        if state.blend is not None:
            # Elastico serves members alone: a blend left by the split strategy ends here.
            state = replace(state, blend=None, weight=0.0)
        active = None if state.active is None else self.plan.index(state.active)
        if active is None or not self.plan.thresholds[active].eligible:
            # No state yet, or the front changed under it: restart from the safe end.
            unknown = "none" if state.active is None else f"{state.active} (not eligible)"
            return self._switch(state, self.fastest, Action.FALLBACK, f"active {unknown}", now)
        if self.settings.paused:
            return self._hold(state, active, "paused")
        if observation is None or now - observation.time > self.settings.stale_after_s:
            return self._metrics_lost(state, active, observation, now)
        keep = min(self._longest_window(), MAX_HISTORY_S)
        state = replace(record_arrivals(state, observation, keep), observed_at=observation.time)
        depth = observation.queue_depth
        rate, window_rate = self._rates(state, observation)
        if not self._can_stay(active, depth, rate) and not (
            # In an overload the fastest is over its limits too, but a queue peer may serve.
            active == self.fastest and self._overloaded(rate)
        ):
            return self._faster(state, active, depth, rate, now)
        # Read only when an entry gets as far as the burst memory (a look's worth of bounds).
        peak = functools.cache(lambda: self._peak_rate(state, observation))
        return self._maybe_more_accurate(state, active, depth, rate, window_rate, peak, now)

    def _metrics_lost(
        self, state: PolicyState, active: int, observation: Observation | None, now: float
    ) -> tuple[Decision, PolicyState]:
        """Hold while the newest sample is within stale_after_s, then on_metrics_loss."""
        what = "missing" if observation is None else f"stale ({now - observation.time:.1f} s)"
        state = replace(state, downscale_since=None, entry_levels=())
        since = state.active_since if state.observed_at is None else state.observed_at
        seen = [since, None if observation is None else observation.time]
        newest = max((t for t in seen if t is not None), default=None)
        if newest is not None and now - newest <= self.settings.stale_after_s:
            return self._hold(
                state, active, f"metrics {what}: hold, newest sample {now - newest:.1f} s old"
            )
        if self.settings.on_metrics_loss is MetricsLoss.FASTEST and active != self.fastest:
            return self._switch(
                state, self.fastest, Action.FALLBACK, f"metrics {what}: fastest", now
            )
        return self._hold(state, active, f"metrics {what}: hold")

    def _longest_window(self) -> float:
        adaptive = STEADY_WINDOWS_S if self.settings.adaptive_rate else ()
        cooldowns = [self.cooldown_s(i) for i in self.plan.eligible[1:]]
        memory = self.settings.burst_memory_s + max(LEAVE_WINDOWS_S)
        return float(max([*LEAVE_WINDOWS_S, *adaptive, *cooldowns, memory]))

    def _rates(
        self, state: PolicyState, observation: Observation
    ) -> tuple[float | None, Callable[[float], float | None]]:
        """The recent arrival rate to leave on, and the rate over a window to enter on."""
        if observation.arrivals_total is None:
            measured = observation.arrival_rate_qps
            return measured, lambda _window: measured
        pods = max(observation.pods, 1)
        if self.settings.adaptive_rate:
            steady = steady_window(state.arrivals, observation.time, pods)
            if steady is None:
                return None, lambda _window: math.inf if state.arrivals else None
            count, seconds = steady
            leave = rate_lower_bound(count, seconds, LEAVE_CONFIDENCE) / pods
            enter = rate_upper_bound(count, seconds, ENTER_CONFIDENCE) / pods
            return leave, lambda _window: enter
        return (
            _leave_rate(state.arrivals, observation.time, pods),
            lambda window: self._enter_rate(state, observation.time, window, pods),
        )

    def _enter_rate(
        self, state: PolicyState, now: float, window_s: float, pods: int
    ) -> float | None:
        """The per-pod rate over the window that the arrivals stay under with ENTER_CONFIDENCE."""
        if not state.arrivals:
            return None
        measured = _arrivals_in(state.arrivals, now, window_s)
        if measured is None:
            # The counter is younger than the window: it cannot vouch for all of it yet.
            return math.inf
        count, seconds = measured
        return rate_upper_bound(count * pods, seconds, ENTER_CONFIDENCE) / pods

    def _peak_rate(self, state: PolicyState, observation: Observation) -> float:
        """The highest leave rate (per pod) of any look within the burst memory (else 0)."""
        memory = self.settings.burst_memory_s
        if memory <= 0 or observation.arrivals_total is None:
            return 0.0
        pods = max(observation.pods, 1)
        samples = state.arrivals
        rates = [
            _leave_rate(samples[: end + 1], time, pods)
            for end, (time, _) in enumerate(samples)
            if time >= observation.time - memory
        ]
        return max((rate for rate in rates if rate is not None), default=0.0)

    def _overloaded(self, rate: float | None) -> bool:
        """Whether the arrivals are over even the fastest configuration's rate limit."""
        limit = self.plan.thresholds[self.fastest].stay_max_qps
        return rate is not None and limit is not None and rate > limit

    def _queue_peer(self, index: int) -> bool:
        """Whether a configuration other than the fastest tolerates as deep a queue as it."""
        fastest = self.plan.thresholds[self.fastest]
        threshold = self.plan.thresholds[index]
        return (
            index != self.fastest
            and threshold.eligible
            and threshold.stay_max_queue is not None
            and threshold.enter_max_queue is not None
            and threshold.stay_max_queue == fastest.stay_max_queue
            and threshold.enter_max_queue == fastest.enter_max_queue
        )

    def _can_stay(self, index: int, depth: float, rate: float | None) -> bool:
        threshold = self.plan.thresholds[index]
        if self._overloaded(rate) and self._queue_peer(index):
            # The rate only says every configuration is over: judge on the queue, with headroom.
            return threshold.stay_max_queue is not None and depth <= threshold.stay_max_queue // 2
        return threshold.can_stay(depth, rate)

    def _entry_holds(self, index: int, depth: float, rate: float | None) -> bool:
        """The entry condition at one observation during the cooldown."""
        threshold = self.plan.thresholds[index]
        if threshold.can_enter(depth, rate):
            return True
        # A queue peer within half its entry queue gathers evidence: its rate is judged at the end.
        limit = threshold.enter_max_queue
        return self._queue_peer(index) and limit is not None and depth <= limit // 2

    def _faster(
        self, state: PolicyState, active: int, depth: float, rate: float | None, now: float
    ) -> tuple[Decision, PolicyState]:
        faster = [i for i in self.plan.eligible if i < active]
        state = replace(state, downscale_since=None, entry_levels=())
        load = "" if rate is None else f", arrivals >= {rate:.2f}/s"
        what = f"queue {depth:g}{load}"
        if not faster:
            return self._hold(state, active, f"{what}: already on the fastest")
        since_switch = math.inf if state.last_switch_at is None else now - state.last_switch_at
        if since_switch < self.settings.upscale_cooldown_s:
            return self._hold(state, active, f"{what}: upscale cooldown")
        target = next((i for i in reversed(faster) if self._can_stay(i, depth, rate)), faster[0])
        reason = f"{what} over {self.plan.names[active]}'s limits"
        return self._switch(state, target, Action.FASTER, reason, now)

    def _maybe_more_accurate(
        self,
        state: PolicyState,
        active: int,
        depth: float,
        rate: float | None,
        window_rate: Callable[[float], float | None],
        peak: Callable[[], float],
        now: float,
    ) -> tuple[Decision, PolicyState]:
        above = [i for i in self.plan.eligible if i > active]
        # The highest configuration whose entry condition holds now, every step below included.
        level = active
        for index in above:
            if not self._entry_holds(index, depth, rate):
                break
            level = index
        if level == active:
            state = replace(state, downscale_since=None, entry_levels=())
            if self._overloaded(rate):
                what = f"queue {depth:g}, arrivals >= {rate:.2f}/s: overload"
                return self._hold(state, active, f"{what}, no queue peer fits")
            return self._hold(state, active, f"queue {depth:g}: steady")
        since = now if state.downscale_since is None else state.downscale_since
        levels = [*state.entry_levels, (now, self.plan.names[level])]
        # Keep what the longest cooldown needs, plus the entry in force at its start.
        start = now - self.cooldown_s(level)
        first = max((i for i, (t, _) in enumerate(levels) if t <= start), default=0)
        state = replace(state, downscale_since=since, entry_levels=tuple(levels[first:]))
        target = None
        for index in above:
            cooldown = self.cooldown_s(index)
            if index > level or now - since < cooldown:
                break
            if self._lowest_level_since(state.entry_levels, now - cooldown) < index:
                break
            # And its whole cooldown's arrivals fit its limit (an overload's queue peer: the queue).
            overload_peer = self._overloaded(rate) and self._queue_peer(index)
            threshold = self.plan.thresholds[index]
            if not overload_peer and not threshold.can_enter(depth, window_rate(cooldown)):
                break
            # Nor while a burst it could not have stayed through is remembered (it may return).
            if threshold.stay_max_qps is not None and peak() > threshold.stay_max_qps:
                break
            target = index
        if target is None:
            return self._hold(state, active, f"queue {depth:g}: downscale pending")
        reason = (
            f"queue and arrivals within {self.plan.names[target]}'s entry limits for "
            f"{self.cooldown_s(target):.1f} s"
        )
        return self._switch(state, target, Action.MORE_ACCURATE, reason, now)

    def _lowest_level_since(self, levels: Sequence[tuple[float, str]], start: float) -> int:
        """The lowest level (highest configuration whose entry condition held) since start."""
        relevant = [
            name
            for i, (t, name) in enumerate(levels)
            if t > start or (i + 1 < len(levels) and levels[i + 1][0] > start)
        ]
        indices = [self.plan.index(name) for name in relevant]
        return min((i for i in indices if i is not None), default=-1)

    def _hold(self, state: PolicyState, active: int, reason: str) -> tuple[Decision, PolicyState]:
        return Decision(self.plan.names[active], active, Action.HOLD, reason), state

    def _switch(
        self, state: PolicyState, target: int, action: Action, reason: str, now: float
    ) -> tuple[Decision, PolicyState]:
        name = self.plan.names[target]
        if state.active == name:
            return self._hold(state, target, reason)
        decision = Decision(name, target, action, reason)
        return decision, replace(
            state,
            active=name,
            active_since=now,
            last_switch_at=now,
            last_reason=reason,
            switches=state.switches + 1,
            downscale_since=None,
            entry_levels=(),
        )
