"""Late binding (Aragog's per-request, per-stage routing): each request binds each stage's
parameters when it reaches that stage, from its own deadline and the components' queues.

A ``StagePlan`` lists the pipeline's stages (the parameters each binds, in the order the
pipeline reads them) and the configurations a request may end on, each with its accuracy and a
predicted service time per stage. ``bind_stage`` is the decision: among the allowed
configurations consistent with what the request has bound so far, the most accurate whose
predicted remaining time (each remaining component's queue and its own time there) fits what is
left of the request's deadline, and does not make a request waiting behind it late that would
otherwise be in time (``follower_spare_ms``); the fastest completion when none fits; refused
where admission's refuse rule applies and even the fastest is late. ``stage_plan`` derives
per-stage times from whole-pipeline profiles, split by each stage's measured component times
where profiling timed them; a stage may call several component models (qa-real's retrieval:
bm25, dense or both, then maybe the reranker), its time theirs together. Why: docs/method.md,
"Late binding".
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from scipy.special import gammaincinv

from compass.domain.errors import FieldError
from compass.domain.evaluation import ParamValue
from compass.domain.profiles import LatencyProfile
from compass.domain.space import config_key

# rag-sim's pipeline (model-images/rag-sim/models/router/1/pipeline.py): the parameters each
# component's time depends on, in the order a request reaches the components, and the models.
RAG_SIM_STAGE_PARAMS: tuple[tuple[str, ...], ...] = (
    ("retriever_k",),
    ("reranker_model", "reranker_k"),
    ("generator_model",),
)
RAG_SIM_COMPONENTS = ("retriever", "reranker", "generator")
# rag-sim's components' shares of a configuration's time as deployed (podmodel.RAG_SIM_STAGES,
# the components' `share` parameters): the split the per-stage fit leans to where the
# end-to-end profiles leave it open.
RAG_SIM_SHARES = (0.1, 0.2, 0.7)
# qa-real's pipeline (model-images/qa-real/models/router/1/pipeline.py) reads the retriever,
# top_k and rerank before it retrieves (how deep to retrieve depends on all three), and the
# reader only when it reads: two stages, the first calling whichever retrievers (and reranker)
# its configuration names.
QA_REAL_STAGE_PARAMS: tuple[tuple[str, ...], ...] = (
    ("retriever", "top_k", "rerank"),
    ("reader",),
)
QA_REAL_COMPONENTS: tuple[tuple[str, ...], ...] = (("bm25", "dense", "reranker"), ("reader",))
# The slow loop allows a front member while the pod's arrival rate is within its planner rate
# limit x this (bench/serving_sim.py --binding-only, 10 seeds, binding+adm: 1.5 wins 100% of
# the hindsight oracle's gain, at or above static fastest's compliance in 11/16 cells, the rest
# -0.0 to -0.4; 1.25: 91%, 13/16; 2 lost compliance in the overloads on 2 seeds).
RATE_HEADROOM = 1.5
# Behind the router's gate, a request that finds the pipeline free waits this long before it
# binds, so that the burst it may lead reaches the gate and is spared: requests sent together
# reach the router instances over a few ms, and without the wait the first bound blind (live
# on the Mooncake window, x0.2: 30% more of the slower members than its simulator, and its
# clumps late). It costs only a request with an idle pipeline, which has the most slack.
GATE_SETTLE_MS = 3.0
# The longest settle a table may ask (the router holds its tables to the same bound).
MAX_SETTLE_MS = 100.0
# A plan travels in a ParetoPolicy and to every router: bounded like a front's capacity curve.
MAX_BINDING_CONFIGS = 128
MAX_STAGES = 8
# No stage's share of a configuration's time is fitted below this: a stage is never free.
MIN_STAGE_SHARE = 0.02
# A follower whose deadline its work ahead meets within this, ms, counts as in time: the stage
# times are a least-squares fit whose last bits vary with the machine's LAPACK, and deadlines
# are differences of float seconds, so an exact tie must not turn on rounding.
ROUNDING_MS = 1e-6

# A stage's component model, or the several it may call (one of them, or some in turn).
StageComponents = str | Sequence[str]


class BindingError(FieldError):
    """A binding plan or input is unusable: one line, `<field>: <what is wrong>; <the fix>`."""


class BindingVerdict(StrEnum):
    """How a stage was bound."""

    # The most accurate consistent configuration that fits the deadline and spares followers.
    FITS = "fits"
    # None fits: the fastest completion.
    FASTEST = "fastest"
    # Late whatever serves it, and admission refuses such requests.
    REFUSED = "refused"


@dataclass(frozen=True)
class BindableConfig:
    """A configuration a request may end on: its parameters, accuracy and per-stage times."""

    config: Mapping[str, ParamValue]
    accuracy: float
    # Predicted service time at each stage, ms, in stage order (at the plan's quantile: what
    # must fit the deadline).
    stage_ms: tuple[float, ...]
    # The same at admission's quantile, for its refusal (None: ``stage_ms``); at the median
    # (admission's default) it refuses only what is more likely late than not.
    stage_admit_ms: tuple[float, ...] | None = None

    @property
    def total_ms(self) -> float:
        """Its predicted time through every stage alone, ms."""
        return sum(self.stage_ms)


@dataclass(frozen=True)
class StagePlan:
    """The stages (the parameters each binds, in order) and the configurations allowed."""

    stages: tuple[tuple[str, ...], ...]
    configs: tuple[BindableConfig, ...]

    def __post_init__(self) -> None:
        if not self.stages or len(self.stages) > MAX_STAGES:
            raise BindingError(
                "binding.stages",
                f"{len(self.stages)} stages",
                f"give 1 to {MAX_STAGES} stages, each the parameters it binds",
            )
        if not self.configs or len(self.configs) > MAX_BINDING_CONFIGS:
            raise BindingError(
                "binding.configs",
                f"{len(self.configs)} configurations",
                f"give 1 to {MAX_BINDING_CONFIGS} (the front and profiled configurations)",
            )
        names = [name for stage in self.stages for name in stage]
        if len(set(names)) != len(names):
            raise BindingError(
                "binding.stages", f"a parameter is bound twice in {names}", "bind each once"
            )
        for index, entry in enumerate(self.configs):
            where = f"binding.configs[{index}]"
            if set(entry.config) != set(names):
                raise BindingError(
                    where,
                    f"parameters {sorted(entry.config)} are not the stages' {sorted(names)}",
                    "give every configuration a value for each parameter the stages bind",
                )
            if len(entry.stage_ms) != len(self.stages):
                raise BindingError(
                    f"{where}.stage_ms",
                    f"{len(entry.stage_ms)} times for {len(self.stages)} stages",
                    "give one predicted time per stage",
                )
            for field, times in (
                ("stage_ms", entry.stage_ms),
                ("stage_admit_ms", entry.stage_admit_ms),
            ):
                if times is not None and (
                    len(times) != len(self.stages)
                    or not all(math.isfinite(t) and t >= 0 for t in times)
                ):
                    raise BindingError(
                        f"{where}.{field}",
                        f"{times} is not one time >= 0 per stage",
                        "give one predicted time in ms per stage",
                    )

    def consistent(self, bound: Mapping[str, ParamValue]) -> list[int]:
        """The configurations that agree with every parameter bound so far."""
        return [
            i
            for i, entry in enumerate(self.configs)
            if all(entry.config[name] == value for name, value in bound.items())
        ]

    def fastest(self) -> int:
        """The configuration with the least predicted time through every stage."""
        return min(range(len(self.configs)), key=lambda i: self.configs[i].total_ms)


@dataclass(frozen=True)
class Binding:
    """One stage's decision: the configuration the request now heads for (None: refused)."""

    config: int | None
    verdict: BindingVerdict
    # Its predicted time from this stage to the end (queues included), ms.
    remaining_ms: float


def remaining_ms(
    entry: BindableConfig, stage: int, backlog_ms: Sequence[float], *, admitting: bool = False
) -> float:
    """A configuration's predicted time from ``stage`` to the end: at each remaining
    component, the work queued ahead there plus its own time (at admission's quantile with
    ``admitting``)."""
    own = entry.stage_admit_ms if admitting and entry.stage_admit_ms is not None else entry.stage_ms
    return sum(backlog_ms[s] + own[s] for s in range(stage, len(own)))


def bind_stage(
    plan: StagePlan,
    stage: int,
    bound: Mapping[str, ParamValue],
    left_ms: float,
    backlog_ms: Sequence[float],
    *,
    spare_ms: float = math.inf,
    refuse: bool = False,
    allowed: Collection[int] | None = None,
    at: int | None = None,
    refuse_luck_ms: float = 0.0,
) -> Binding:
    """Bind ``stage``: the configuration (consistent with ``bound``) the request heads for.

    ``left_ms`` is what is left of its deadline; ``backlog_ms[s]`` the work queued ahead of it
    at component s (a stage's own queue included); ``spare_ms`` how much longer than the
    fastest completion it may take without making a waiting request late (``follower_spare_ms``);
    ``refuse``: admission refuses a request that is late whatever serves it; ``allowed``: the
    configurations the slow loop allows now (None: all), the fastest completion being the
    fallback whatever it allows; ``at``: the stage the request has reached (None: ``stage``),
    earlier than ``stage`` where a pipeline reads a later stage's parameters before it calls
    the earlier components (rag-sim reads them all at dispatch): their time counts too;
    ``refuse_luck_ms``: refuse only what is late even that much sooner than its likely time
    (``luck_ms``; static fastest serves such a request in time by luck often enough)."""
    if not 0 <= stage < len(plan.stages):
        raise BindingError("stage", f"{stage} is not a stage of {len(plan.stages)}", "give 0..n-1")
    at = stage if at is None else at
    if not 0 <= at <= stage:
        raise BindingError("at", f"{at} is not a stage up to {stage}", "give 0..stage")
    if len(backlog_ms) != len(plan.stages):
        raise BindingError(
            "backlog_ms",
            f"{len(backlog_ms)} backlogs for {len(plan.stages)} stages",
            "give one per stage (0 where nothing waits)",
        )
    candidates = plan.consistent(bound)
    if not candidates:
        raise BindingError(
            "bound",
            f"no allowed configuration has {dict(bound)}",
            "bind only values of the plan's configurations",
        )
    times = {i: remaining_ms(plan.configs[i], at, backlog_ms) for i in candidates}
    # Fastest completion; among equals the most accurate.
    fastest = min(candidates, key=lambda i: (times[i], -plan.configs[i].accuracy))
    quickest = times[fastest]
    fitting = [
        i
        for i in candidates
        if times[i] <= left_ms
        and times[i] - quickest <= max(spare_ms, 0.0)
        and (allowed is None or i in allowed or i == fastest)
    ]
    if fitting:
        # Most accurate; among equals the fastest.
        chosen = max(fitting, key=lambda i: (plan.configs[i].accuracy, -times[i]))
        return Binding(chosen, BindingVerdict.FITS, times[chosen])
    if refuse:
        likely = min(
            remaining_ms(plan.configs[i], at, backlog_ms, admitting=True) for i in candidates
        )
        if likely - max(refuse_luck_ms, 0.0) > left_ms:
            return Binding(None, BindingVerdict.REFUSED, likely)
    return Binding(fastest, BindingVerdict.FASTEST, quickest)


def follower_slacks_ms(
    own_fastest_ms: float,
    followers_left_ms: Sequence[float],
    follower_ms: float,
    servers: int = 1,
    *,
    likely: tuple[float, float] | None = None,
    luck_ms: float = 0.0,
) -> list[float | None]:
    """How much longer than its fastest completion a request may take without making each
    request waiting behind it (FIFO) late (None: a follower that does not count).

    Each follower, in order, starts once the work ahead of it is done: this request at its
    fastest and the followers before it at ``follower_ms`` each, shared by ``servers``; its
    slack is what is left of its deadline after it, and extra time e here delays it by about
    e / ``servers``. A follower counts where it would be in time with ``likely`` (this
    request's and each follower's time at admission's quantile; the same times without):
    followers late even so are left out (admission deals with them), and one that counts with
    no slack at the cautious times leaves none. With ``luck_ms`` (``luck_ms()``) a follower
    counts also where the services up to its end could end that much x the square root of
    their number sooner than their likely sum (the spread of a sum): the last of a clump that
    static fastest serves in time by luck, which a median alone counts out and the requests
    ahead of it then spend (docs/method.md, Late binding)."""
    if servers < 1:
        raise BindingError("servers", f"{servers} is not >= 1", "give the router instances")
    own_likely, follower_likely = likely or (own_fastest_ms, follower_ms)
    slacks: list[float | None] = []
    ahead, ahead_likely = own_fastest_ms, own_likely
    # A follower's end is the sum of ``place`` services: this request's and those up to it.
    for place, left in enumerate(followers_left_ms, start=2):
        lucky = max(luck_ms, 0.0) * math.sqrt(place) / servers
        if left + ROUNDING_MS >= ahead_likely / servers + follower_likely - lucky:
            slack = left - (ahead / servers + follower_ms)
            slacks.append(max(slack, 0.0) * servers)
        else:
            slacks.append(None)
        ahead += follower_ms
        ahead_likely += follower_likely
    return slacks


def follower_spare_ms(
    own_fastest_ms: float,
    followers_left_ms: Sequence[float],
    follower_ms: float,
    servers: int = 1,
    *,
    likely: tuple[float, float] | None = None,
    luck_ms: float = 0.0,
) -> float:
    """How much longer than its fastest completion a request may take without making a request
    waiting behind it late that would otherwise be in time: the least of
    ``follower_slacks_ms``' counted slacks, inf when no follower counts."""
    slacks = follower_slacks_ms(
        own_fastest_ms, followers_left_ms, follower_ms, servers, likely=likely, luck_ms=luck_ms
    )
    return min((s for s in slacks if s is not None), default=math.inf)


# The joint plan's grid: extra time in steps of at least this, ms, over at most JOINT_STEPS.
JOINT_STEP_MS = 1.0
JOINT_STEPS = 128
JOINT_STEP_COST = 1e-7


def joint_spare_ms(
    own_options: Sequence[tuple[float, float]],
    follower_options: Sequence[tuple[float, float]],
    slacks_ms: Sequence[float | None],
    servers: int = 1,
    budget_ms: float = math.inf,
) -> float:
    """How much longer than its fastest completion a request may take in the best plan for it
    and the requests waiting behind it together (Aragog's choice over the FIFO queue).

    ``own_options`` are the request's choices as (extra time over its fastest completion,
    accuracy), ``follower_options`` a waiting request's (extra time over the fastest
    configuration, accuracy), ``slacks_ms`` each follower's slack in order
    (``follower_slacks_ms``; None: it does not count, so takes the fastest). A plan gives
    each a choice such that every counted follower stays in time (the extra time ahead of it
    over ``servers``, plus its own, within its slack over ``servers``) and all the extra time
    together stays within ``budget_ms`` (the lag cap's spare: each extra ms is a lag for the
    rest of the busy period); the best has the most accuracy in all, and among equals the
    most for the request itself (its choice is sure, the followers' are not: each chooses
    again when it is bound, on what it sees then). This keeps
    the first request from spending the slack that several behind it could use better: one
    slow member against many a little slower. inf when no follower counts."""
    if servers < 1:
        raise BindingError("servers", f"{servers} is not >= 1", "give the router instances")
    counted = [s for s in slacks_ms if s is not None]
    if not counted:
        return math.inf
    if not own_options:
        # Nothing fits its deadline: its fastest completion, whatever the plan.
        return 0.0
    # The most extra time any plan can hold: no counted follower allows more than its slack.
    reach_ms = min(budget_ms, max(counted))
    step = max(JOINT_STEP_MS, reach_ms / JOINT_STEPS)
    size = math.floor(reach_ms / step + 1e-9) + 1
    # A follower's options on the grid (extra time rounds up), only those no other beats on
    # both counts (the plan's cost grows with their number): the most accurate at each step,
    # if more accurate than every quicker one. The fastest (0 steps) is always one.
    theirs = np.asarray(follower_options, dtype=float).reshape(-1, 2)
    their_steps = np.ceil(np.maximum(theirs[:, 0], 0.0) / step - 1e-9).astype(int)
    order = np.lexsort((-theirs[:, 1], their_steps))
    kept_steps, kept_gains = [0], [0.0]
    for k, gain in zip(their_steps[order].tolist(), theirs[order, 1].tolist(), strict=True):
        if gain > kept_gains[-1]:
            if k == kept_steps[-1]:
                kept_gains[-1] = gain
            else:
                kept_steps.append(k)
                kept_gains.append(gain)
    steps = np.array(kept_steps)
    # Among plans of equal accuracy the one with the least extra time in all (less lag for
    # the arrivals to come): a step's cost far below any accuracy a choice adds.
    gains = (np.array(kept_gains) - JOINT_STEP_COST * steps)[:, None]
    # Backwards over the followers: ahead[t], the most accuracy the followers from here on
    # can add where the extra time ahead of them is t steps (-inf: one of them late). Going
    # from t to t + k steps, a follower's limit holds t + k * servers (the extra ahead of it
    # and its own, x servers); an index past the grid is -inf (the pad).
    totals = np.arange(size)
    after = np.minimum(totals[None, :] + steps[:, None], size)
    ahead_and_own = totals[None, :] + steps[:, None] * servers
    ahead = np.zeros(size + 1)
    ahead[size] = -np.inf
    for slack in reversed(slacks_ms):
        if slack is None:
            # It takes the fastest: nothing changes for those behind it.
            continue
        value = ahead[after] + gains
        value[ahead_and_own > math.floor(slack / step + 1e-9)] = -np.inf
        ahead[:size] = value.max(axis=0)
    # The request's own choice: its accuracy and the best its followers can add after it;
    # the most in all, and among equals the most for itself (its choice is sure, theirs not).
    own = np.asarray(own_options, dtype=float).reshape(-1, 2)
    own_steps = np.minimum(np.ceil(own[:, 0] / step - 1e-9).astype(int), size)
    total = own[:, 1] - JOINT_STEP_COST * own_steps + ahead[own_steps]
    if not np.isfinite(total).any():
        return 0.0
    best = total >= total.max() - 1e-9
    return float(own_steps[best].max()) * step


def joint_options(
    plan: StagePlan,
    bound: Mapping[str, ParamValue],
    at: int,
    left_ms: float,
    backlog_ms: Sequence[float],
    allowed: Collection[int] | None = None,
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """What ``joint_spare_ms`` plans with: the request's choices (the configurations consistent
    with ``bound`` that the slow loop allows, or its fastest completion, that fit what is left
    of its deadline), each as (extra time over its fastest completion from stage ``at``,
    accuracy); and a follower's, not yet bound (the allowed configurations and the fastest),
    each as (extra time over the fastest configuration, accuracy)."""
    times = {i: remaining_ms(plan.configs[i], at, backlog_ms) for i in plan.consistent(bound)}
    quickest = min(times.values())
    own = [
        (t - quickest, plan.configs[i].accuracy)
        for i, t in times.items()
        if t <= left_ms and (allowed is None or i in allowed or t == quickest)
    ]
    fastest = plan.fastest()
    fastest_ms = plan.configs[fastest].total_ms
    theirs = [
        (entry.total_ms - fastest_ms, entry.accuracy)
        for i, entry in enumerate(plan.configs)
        if allowed is None or i in allowed or i == fastest
    ]
    return own, theirs


def luck_ms(likely_ms: float, cautious_ms: float, reach: float) -> float:
    """How much sooner than its likely time a service may end by luck that a follower or a
    refusal still counts on: ``reach`` x its spread (its cautious less its likely time; one
    spread is about 1.6 standard deviations, so 1 reaches the luck of about one in twenty)."""
    if not reach >= 0:
        raise BindingError("reach", f"{reach!r} is not >= 0", "give a count of spreads, e.g. 1")
    return reach * max(cautious_ms - likely_ms, 0.0)


def polled_followers_left_ms(count: int, own_left_ms: float) -> list[float]:
    """What is left of the deadlines of ``count`` requests waiting behind a request where only
    their number is known (a poll of Triton's pending count, docs/method.md "Late binding"):
    each arrived after it, so has at least as long left; taken as exactly that (clumps of
    simultaneous arrivals do), which never spares a follower less than it needs."""
    return [own_left_ms] * max(count, 0)


def arrival_offsets_ms(rate_per_ms: float, count: int, risk: float) -> list[float]:
    """When the next ``count`` arrivals come at the latest that a Poisson stream at
    ``rate_per_ms`` brings them sooner with probability ``risk`` only: the j-th arrival's time,
    Gamma(j, rate), at its ``risk`` quantile, ms from now (none at no rate)."""
    if not 0 < risk < 1:
        raise BindingError("risk", f"{risk!r} is not in (0, 1)", "give a probability, e.g. 0.05")
    if not rate_per_ms > 0:
        return []
    # The Gamma(j, 1) quantile: the Poisson mean at which j or more events come with
    # probability ``risk``.
    return [float(gammaincinv(j, risk)) / rate_per_ms for j in range(1, count + 1)]


def waited_long(waited_ms: float, slo_ms: float, degrade_after: float) -> bool:
    """Whether a request that waited ``waited_ms`` for a router instance binds the fastest
    completion: over ``degrade_after`` of the SLO, a queue stands behind it (admission's
    degradeAfter), which a router behind Triton's scheduler cannot see otherwise."""
    return waited_ms > degrade_after * slo_ms


def static_schedule(
    arrival_s: float, free_s: float, fastest_s: float, servers: int = 1
) -> tuple[float, float]:
    """When a request arriving at ``arrival_s`` would start if every request were served on
    the fastest configuration (``fastest_s`` each, shared by ``servers``), that queue being
    free at ``free_s``, and when it is free again after it (Lindley's recursion: the schedule
    static fastest keeps)."""
    if servers < 1:
        raise BindingError("servers", f"{servers} is not >= 1", "give the router instances")
    start = max(arrival_s, free_s)
    return start, start + fastest_s / servers


def lag_spare_ms(finish_ms: float, static_finish_ms: float, cap_ms: float) -> float:
    """How much longer than its fastest completion a request may take so that it ends no more
    than ``cap_ms`` behind the schedule static fastest keeps: ``finish_ms`` is when it ends at
    its fastest (its likely time), ``static_finish_ms`` when it would end under static fastest.
    Every request after it in the same busy period starts that much later than static fastest
    starts it, so a lag is what a clump arriving behind it pays (docs/method.md)."""
    return max(cap_ms - (finish_ms - static_finish_ms), 0.0)


def fit_stage_times(
    profiles: Sequence[LatencyProfile],
    stages: Sequence[Sequence[str]],
    prior_shares: Sequence[float] | None = None,
) -> list[tuple[float, ...]]:
    """Each profile's mean time split over the stages, each stage's part depending on that
    stage's own parameters only: a least-squares fit of the profiles' mean times on one term
    per stage and value of its parameters (main effects).

    End-to-end times fix the differences between a stage's settings, not how much of a
    common time belongs to which stage (a constant moved from one stage to another fits the
    same), so a faint pull of each stage's terms towards ``prior_shares`` (equal without) of the
    mean time picks that split; a term is never below ``MIN_STAGE_SHARE`` of the mean."""
    if prior_shares is None:
        prior_shares = [1 / len(stages)] * len(stages)
    if len(prior_shares) != len(stages) or not math.isclose(sum(prior_shares), 1.0):
        raise BindingError(
            "prior_shares",
            f"{list(prior_shares)} for {len(stages)} stages",
            "give shares adding to 1",
        )
    index: dict[tuple[int, tuple[ParamValue, ...]], int] = {}
    rows = []
    for profile in profiles:
        row = []
        for s, names in enumerate(stages):
            missing = [n for n in names if n not in profile.config]
            if missing:
                raise BindingError(
                    "profiles",
                    f"{profile.name} lacks {', '.join(missing)}",
                    "give profiles of the stages' parameters",
                )
            row.append(index.setdefault((s, tuple(profile.config[n] for n in names)), len(index)))
        rows.append(row)
    means = np.array([p.mean_ms for p in profiles])
    design = np.zeros((len(profiles), len(index)))
    for r, row in enumerate(rows):
        design[r, row] = 1.0
    # The pull: weak enough to leave the fit alone, strong enough to choose among equal fits.
    pull = 1e-3
    prior = np.array([prior_shares[s] * float(means.mean()) for s, _ in index])
    fitted, *_ = np.linalg.lstsq(
        np.vstack([design, pull * np.eye(len(index))]),
        np.concatenate([means, pull * prior]),
        rcond=None,
    )
    fitted = np.maximum(fitted, MIN_STAGE_SHARE * float(means.mean()))
    return [tuple(float(fitted[t]) for t in row) for row in rows]


def stage_shares(
    profiles: Sequence[LatencyProfile],
    stages: Sequence[Sequence[str]],
    prior_shares: Sequence[float] | None = None,
    components: Sequence[StageComponents] | None = None,
) -> list[tuple[float, ...]]:
    """Each profile's share of its time at each stage, so a configuration's stages always add
    up to its own measured time: by its measured component times where every profile has one
    for each stage (``components``, in stage order, a model or several a stage; the time outside
    them, the router's own, goes to the stages pro rata), else by ``fit_stage_times``."""
    measured = measured_stage_times(profiles, components)
    times_of = measured or fit_stage_times(profiles, stages, prior_shares)
    return [tuple(t / sum(times) for t in times) for times in times_of]


def stage_models(components: Sequence[StageComponents]) -> list[tuple[str, ...]]:
    """Each stage's component models as a tuple (a stage named by one model: that one)."""
    return [(stage,) if isinstance(stage, str) else tuple(stage) for stage in components]


def measured_stage_times(
    profiles: Sequence[LatencyProfile], components: Sequence[StageComponents] | None
) -> list[tuple[float, ...]] | None:
    """Each profile's measured time at each stage: the sum of its models' times (a model it
    did not call is not in its times), or None unless every profile measured some model of
    every stage, with some time in all (a split needs all of them)."""
    if not components:
        return None
    models = stage_models(components)
    rows = []
    for profile in profiles:
        times = profile.component_ms
        if times is None or any(not any(m in times for m in stage) for stage in models):
            return None
        row = tuple(float(sum(times.get(m, 0.0) for m in stage)) for stage in models)
        if sum(row) <= 0:
            return None
        rows.append(row)
    return rows


def stage_plan(
    profiles: Sequence[LatencyProfile],
    stages: Sequence[Sequence[str]] = RAG_SIM_STAGE_PARAMS,
    quantile: float = 0.5,
    prior_shares: Sequence[float] | None = None,
    admission_quantile: float = 0.5,
    components: Sequence[StageComponents] | None = None,
) -> StagePlan:
    """The plan for these profiles: each configuration's time at ``quantile`` split over the
    stages by ``stage_shares`` (rag-sim's: ``RAG_SIM_STAGE_PARAMS``, ``RAG_SIM_SHARES``; by the
    measured times of ``components``, a model or several a stage, where the profiles carry
    them)."""
    for field, value in (("quantile", quantile), ("admission_quantile", admission_quantile)):
        if not 0 < value < 1:
            raise BindingError(field, f"{value!r} is not in (0, 1)", "give e.g. 0.5")
    if components is not None and len(components) != len(stages):
        raise BindingError(
            "components",
            f"{len(components)} component models for {len(stages)} stages",
            "name the model each stage calls, in stage order",
        )
    shares = stage_shares(profiles, stages, prior_shares, components)
    names = [n for stage in stages for n in stage]
    configs = tuple(
        BindableConfig(
            {n: p.config[n] for n in names},
            p.accuracy,
            tuple(share * float(p.distribution.quantile(quantile)) for share in split),
            tuple(share * float(p.distribution.quantile(admission_quantile)) for share in split),
        )
        for p, split in zip(profiles, shares, strict=True)
    )
    return StagePlan(tuple(tuple(s) for s in stages), configs)


def allowed_at(max_qps: Sequence[float | None], qps: float) -> list[int]:
    """The configurations whose rate limit (None: none) a pod's arrival rate is within."""
    return [i for i, limit in enumerate(max_qps) if limit is None or qps <= limit]


def router_table(
    plan: StagePlan,
    components: Sequence[StageComponents],
    *,
    refuse: bool = False,
    max_qps: Sequence[float | None] | None = None,
    slo_ms: float | None = None,
    degrade_after: float | None = None,
    lag_share: float | None = None,
    lag_reserve: int = 0,
    settle_ms: float = 0.0,
) -> dict[str, object]:
    """The plan as a router takes it (the control model's ``binding``; model-images/router/
    model.py): the stages, the component model each stage calls (a list where it may call
    several: the router counts each one's calls as that stage's), and each configuration's
    canonical key, accuracy, per-stage times and the pod's arrival rate above which the slow
    loop disallows it (``max_qps``, per configuration; None: no limit); ``slo_ms``, the SLO
    the requests' deadlines carry, tells a router when each request arrived (its deadline less
    the SLO), so it counts the pod's arrival rate, not the rate it takes requests up at, and
    how long it waited: over ``degrade_after`` of the SLO (``waited_long``), the fastest
    completion; ``lag_share`` (None: no cap) and ``lag_reserve``: the lag cap
    (``lag_spare_ms``: a request's extra time leaves it at most ``lag_share`` of the SLO less
    ``lag_reserve`` of the fastest's likely times behind static fastest's schedule);
    ``settle_ms``: behind a gate, how long a request that finds the pipeline free waits before
    it binds (GATE_SETTLE_MS)."""
    if slo_ms is not None and not (math.isfinite(slo_ms) and slo_ms > 0):
        raise BindingError("slo_ms", f"{slo_ms!r} is not a time > 0", "give the SLO in ms")
    if degrade_after is not None and (slo_ms is None or not 0 < degrade_after <= 1):
        raise BindingError(
            "degrade_after",
            f"{degrade_after!r} with slo_ms {slo_ms!r}",
            "give a share of the SLO in (0, 1], and the SLO",
        )
    if lag_share is not None and (slo_ms is None or not 0 < lag_share <= 1):
        raise BindingError(
            "lag_share",
            f"{lag_share!r} with slo_ms {slo_ms!r}",
            "give a share of the SLO in (0, 1], and the SLO",
        )
    if lag_reserve < 0:
        raise BindingError("lag_reserve", f"{lag_reserve!r} is not >= 0", "give a count, e.g. 2")
    if not 0 <= settle_ms <= MAX_SETTLE_MS:
        raise BindingError(
            "settle_ms",
            f"{settle_ms!r} is not in [0, {MAX_SETTLE_MS:g}]",
            f"give a few ms, e.g. {GATE_SETTLE_MS:g}, or 0",
        )
    if max_qps is not None and len(max_qps) != len(plan.configs):
        raise BindingError(
            "max_qps",
            f"{len(max_qps)} limits for {len(plan.configs)} configurations",
            "give one rate limit (or None) per configuration",
        )
    if len(components) != len(plan.stages):
        raise BindingError(
            "components",
            f"{len(components)} component models for {len(plan.stages)} stages",
            "name the model each stage calls, in stage order",
        )
    models = stage_models(components)
    named = [m for stage in models for m in stage]
    # One stage naming no model is the whole pipeline: the configuration bound at take-up.
    whole = len(models) == 1 and not models[0]
    if not (whole or all(models)) or len(set(named)) != len(named):
        raise BindingError(
            "components",
            f"{list(components)} leaves a stage without a model or names one twice",
            "give each stage its own component models (a call tells the router its stage), "
            "or one stage and none (the whole pipeline)",
        )
    return {
        "stages": [list(names) for names in plan.stages],
        # One model a stage as a string (the table rag-sim's routers have always read).
        "components": [stage[0] if len(stage) == 1 else list(stage) for stage in models],
        "configs": [
            {
                "config": config_key(entry.config),
                "accuracy": entry.accuracy,
                "stage_ms": list(entry.stage_ms),
                "stage_admit_ms": list(entry.stage_admit_ms or entry.stage_ms),
                "max_qps": None if max_qps is None else max_qps[index],
            }
            for index, entry in enumerate(plan.configs)
        ],
        "refuse": refuse,
        "slo_ms": slo_ms,
        "degrade_after": degrade_after,
        "lag_share": lag_share,
        "lag_reserve": lag_reserve,
        "settle_ms": settle_ms,
    }
