"""The split strategy for a data plane that fixes each request's member as it arrives.

llm-d's endpoint picker rewrites a request's model on arrival, so a pod's queue is committed: a
switch to a faster mix serves only what arrives after it, and that waits behind the slower
requests already queued. Split's limits assume a switch reaches the queue (the Triton routers
deal a mix as each request is taken up). ``CommittedSplit`` keeps Split's decision but caps its
mix so that the queue (each request at the slower of the mix in force, which it was drawn
under, and the new one) and a busy interval's arrivals (the SLO's percentile of the recent ones)
commit at most the plan's slack buffer of work beyond what the fastest member would, and to the
fastest alone while the arrivals are over its rate limit. Where Split's cooldowns keep it below
the next front member, it serves up to that member as long as the same work stays within
``FLOOR_SHARE`` of the buffer and the arrivals' upper bound within the mix's rate limit
(docs/serving.md, "Through llm-d's gateway instead of the routers").
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from compass.domain.elastico import (
    DEFAULT_INTERVAL_S,
    ENTER_CONFIDENCE,
    LEAVE_CONFIDENCE,
    ElasticoSettings,
    rate_lower_bound,
    rate_upper_bound,
    steady_window,
)
from compass.domain.planner import Plan
from compass.domain.policy import Action, Decision, Observation, PolicyState
from compass.domain.split import Split

# The share of the slack buffer a mix up to the next front member may commit when served past
# Split's hysteresis (bench/serving_default.py --set tuning: 0.25-0.35 keep the compliance floor).
FLOOR_SHARE = 0.3


@dataclass(frozen=True)
class CommittedSplit:
    """Split over one plan, its mix capped by the work a draw at arrival commits."""

    plan: Plan
    settings: ElasticoSettings = field(default_factory=ElasticoSettings)
    interval_s: float = DEFAULT_INTERVAL_S
    inner: Split = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s: {self.interval_s!r} is not > 0; give the period")
        object.__setattr__(self, "inner", Split(self.plan, self.settings))

    def initial_state(self, now: float) -> PolicyState:
        """A fresh policy starts on the fastest eligible member alone."""
        return self.inner.initial_state(now)

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        """Split's mix after this observation, capped by the work it would commit (and raised
        toward the next front member where that work stays within the floor's share)."""
        decision, decided = self.inner.decide(observation, state, now)
        mixes = self.inner.mixes
        chosen = mixes.index(decision.mix)
        if chosen is None or observation is None or decision.action is Action.FALLBACK:
            return decision, decided
        burst = busy_interval(decided.arrivals, self.interval_s, self.plan.slo.percentile)
        queued = observation.queue_depth
        previous = state.mix(self.plan.index)
        was = None if previous is None else mixes.index(previous)
        # Over even the fastest's rate limit the queue does not drain: whatever a mix commits
        # delays every request after it, so nothing beyond the fastest's work is committed.
        pods = max(observation.pods, 1)
        steady = steady_window(decided.arrivals, observation.time, pods)
        overloaded = self._overloaded(steady, pods)
        allowed = 0 if overloaded else self.committed_cap(queued, burst, was, chosen)
        floor = None if overloaded else self._floor(steady, pods, queued, burst, was, allowed)
        if floor is not None:
            allowed = floor
        if allowed == chosen:
            return decision, decided
        budget = self.plan.slack_buffer_ms
        if overloaded:
            reason = "arrivals over the fastest's rate limit: nothing committed beyond its work"
        elif floor is not None:
            reason = (
                f"{queued:.0f} queued and {burst:.0f} arriving requests commit at most "
                f"{FLOOR_SHARE * budget:g} ms beyond the fastest's work, the arrivals under the "
                "mix's rate limit"
            )
        else:
            reason = (
                f"{queued:.0f} queued and {burst:.0f} arriving requests drawn at arrival would "
                f"commit over {budget:g} ms beyond the fastest's work"
            )
        return self._capped(state, decided, was, allowed, reason, now)

    def _overloaded(self, steady: tuple[float, float] | None, pods: int) -> bool:
        """Whether the arrivals over their steadiest recent window are, with the leave
        confidence, above the fastest eligible member's rate limit (per pod)."""
        limit = self.plan.thresholds[self.plan.eligible[0]].stay_max_qps
        if limit is None or steady is None:
            return False
        return rate_lower_bound(steady[0], steady[1], LEAVE_CONFIDENCE) / pods > limit

    def _extra_ms(self, index: int) -> float:
        """How much longer a request of mix ``index`` takes than one of the fastest, on average."""
        thresholds = self.inner.mixes.plan.thresholds
        return thresholds[index].profile.mean_ms - thresholds[0].profile.mean_ms

    def committed_ms(self, queued: float, burst: float, was: int | None, index: int) -> float:
        """The work beyond the fastest's that ``queued`` requests, drawn under mix ``was`` (None:
        unknown), and ``burst`` arrivals commit under mix ``index``: a queued request counts at
        the slower of the two (a switch down leaves it on the mix it was drawn under)."""
        extra = self._extra_ms(index)
        held = extra if was is None else max(self._extra_ms(was), extra)
        return queued * held + burst * extra

    def committed_cap(self, queued: float, burst: float, was: int | None, chosen: int) -> int:
        """The most accurate mix up to ``chosen`` (an index into the mix plan) under which the
        queue and a busy interval's arrivals commit at most the slack buffer beyond the
        fastest's work."""
        allowed = chosen
        while (
            allowed > 0
            and self.committed_ms(queued, burst, was, allowed) > self.plan.slack_buffer_ms
        ):
            allowed -= 1
        return allowed

    def _floor(
        self,
        steady: tuple[float, float] | None,
        pods: int,
        queued: float,
        burst: float,
        was: int | None,
        allowed: int,
    ) -> int | None:
        """The most accurate mix above ``allowed`` and up to the next front member alone under
        which the queue and a busy interval's arrivals commit at most ``FLOOR_SHARE`` of the
        slack buffer, and whose rate limit the arrivals stay under (their upper bound at the
        enter confidence over their steadiest window); None if none, or no steady window yet."""
        mixes = self.inner.mixes
        if steady is None:
            return None
        rate = rate_upper_bound(steady[0], steady[1], ENTER_CONFIDENCE) / pods
        first = mixes.mixes[0].base
        top = next(
            (i for i, mix in enumerate(mixes.mixes) if mix.base != first), len(mixes.mixes) - 1
        )
        budget = FLOOR_SHARE * self.plan.slack_buffer_ms
        for index in range(top, allowed, -1):
            limit = mixes.plan.thresholds[index].stay_max_qps
            within = limit is None or rate <= limit
            if within and self.committed_ms(queued, burst, was, index) <= budget:
                return index
        return None

    def _capped(
        self,
        before: PolicyState,
        decided: PolicyState,
        was: int | None,
        allowed: int,
        reason: str,
        now: float,
    ) -> tuple[Decision, PolicyState]:
        """The decision and state with the mix at ``allowed`` in place of Split's."""
        mix = self.inner.mixes.mixes[allowed]
        switched = was != allowed
        # A capped climb or the floor can still be a step up; else the cap is a step down.
        upward = was is not None and allowed > was
        action = (
            Action.HOLD if not switched else (Action.MORE_ACCURATE if upward else Action.FASTER)
        )
        decision = Decision.routing(mix, self.plan.names, action, reason)
        if not switched:
            # Split would have moved up: stay where it was, with what Split took from this
            # observation (the arrivals, and its entry evidence, which starts again).
            return decision, replace(
                before,
                downscale_since=decided.downscale_since,
                entry_levels=decided.entry_levels,
                arrivals=decided.arrivals,
                observed_at=decided.observed_at,
            )
        reset = replace(decided, switches=before.switches, downscale_since=None, entry_levels=())
        return decision, reset.switched(decision, now)


def busy_interval(
    samples: Sequence[tuple[float, float]], interval_s: float, percentile: float
) -> float:
    """The arrivals (per pod) of one decision interval that the counter's samples (time, total)
    exceeded in only ``100 - percentile`` % of their gaps, each gap scaled to one interval: the
    burst the next interval may bring, at the SLO's percentile."""
    counts = [
        (later[1] - earlier[1]) * interval_s / (later[0] - earlier[0])
        for earlier, later in itertools.pairwise(samples)
        if later[0] > earlier[0]
    ]
    return float(np.percentile(counts, percentile)) if counts else 0.0
