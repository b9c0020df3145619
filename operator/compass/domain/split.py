"""The split strategy: Elastico over the mixes of neighbouring front members, capacity and
accuracy in 5% steps instead of one member. Why: docs/method.md, "Split"."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from compass.domain.elastico import Elastico, ElasticoSettings
from compass.domain.planner import MixPlan, Plan, plan_mixes
from compass.domain.policy import Decision, Observation, PolicyState


@dataclass(frozen=True)
class Split:
    """The split strategy over one plan: Elastico on the grid of mixes of its neighbours."""

    plan: Plan
    settings: ElasticoSettings = field(default_factory=ElasticoSettings)
    mixes: MixPlan = field(init=False, repr=False, compare=False)
    inner: Elastico = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        mixes = plan_mixes(self.plan)
        object.__setattr__(self, "mixes", mixes)
        settings = replace(self.settings, adaptive_rate=True)
        object.__setattr__(self, "inner", Elastico(mixes.plan, settings))

    def initial_state(self, now: float) -> PolicyState:
        """A fresh policy starts on the fastest eligible member alone."""
        return self._outer(self.inner.initial_state(now))

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        """The mix to serve after this observation, and the policy's new state."""
        decision, inner = self.inner.decide(observation, self._inner(state), now)
        mix = self.mixes.mixes[decision.index]
        routed = Decision.routing(mix, self.plan.names, decision.action, decision.reason)
        return routed, self._outer(inner)

    def _inner(self, state: PolicyState) -> PolicyState:
        """The state as Elastico over the mixes knows it: the active mix by its member name."""
        mix = state.mix(self.plan.index)
        active = None if mix is None else self.mixes.index(mix)
        name = None if active is None else self.mixes.plan.names[active]
        if name is None and state.active is not None:
            # Not a mix of this plan (the front changed): Elastico falls back and says so.
            name = f"{state.active} + {state.weight:.0%} {state.blend}"
        return replace(state, active=name, blend=None, weight=0.0)

    def _outer(self, state: PolicyState) -> PolicyState:
        """The state with the active mix as the routers serve it: base, blend and weight."""
        index = None if state.active is None else self.mixes.plan.index(state.active)
        if index is None:
            return state
        mix = self.mixes.mixes[index]
        names = self.plan.names
        blend = None if mix.blend is None else names[mix.blend]
        return replace(state, active=names[mix.base], blend=blend, weight=mix.weight)
