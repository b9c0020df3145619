"""Late binding (Aragog's per-request, per-stage routing): each request binds each stage's
parameters when it reaches it. Why: docs/method.md, "Late binding"."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cached_property
from typing import Any

import numpy as np

from compass.domain.errors import FieldError
from compass.domain.evaluation import ParamValue
from compass.domain.profiles import LatencyProfile
from compass.domain.space import config_key
from compass_rules import binding as rules
from compass_rules import followers
from compass_rules.binding import MAX_BINDING_CONFIGS, MAX_SETTLE_MS, MAX_STAGES

# rag-sim's pipeline (model-images/rag-sim/models/router/1/pipeline.py): each stage's parameters.
RAG_SIM_STAGE_PARAMS: tuple[tuple[str, ...], ...] = (
    ("retriever_k",),
    ("reranker_model", "reranker_k"),
    ("generator_model",),
)
RAG_SIM_COMPONENTS = ("retriever", "reranker", "generator")
# rag-sim's components' shares as deployed (podmodel.RAG_SIM_STAGES): what the fit leans to.
RAG_SIM_SHARES = (0.1, 0.2, 0.7)
# qa-real's pipeline (model-images/qa-real/models/router/1/pipeline.py) reads the retriever,
# top_k and rerank before it retrieves (how deep depends on all three), the reader after.
QA_REAL_STAGE_PARAMS: tuple[tuple[str, ...], ...] = (
    ("retriever", "top_k", "rerank"),
    ("reader",),
)
QA_REAL_COMPONENTS: tuple[tuple[str, ...], ...] = (("bm25", "dense", "reranker"), ("reader",))
# The slow loop allows a front member while the pod's arrival rate is within its planner rate
# limit x this (bench/serving_sim.py --binding-only: 1.25 wins less, 2 loses compliance).
RATE_HEADROOM = 1.5
# Behind the gate, a request that finds the pipeline free waits this long before it binds, so
# that the burst it may lead is seen and spared (it costs only a request with the most slack).
GATE_SETTLE_MS = 3.0
# No stage's share of a configuration's time is fitted below this: a stage is never free.
MIN_STAGE_SHARE = 0.02

# A stage's component model, or the several it may call (one of them, or some in turn).
StageComponents = str | Sequence[str]


class BindingError(FieldError):
    """A binding plan or input is unusable: one line, `<field>: <what is wrong>; <the fix>`."""


class BindingVerdict(StrEnum):
    """How a stage was bound."""

    # The most accurate consistent configuration that fits the deadline and spares followers.
    FITS = rules.FITS
    # None fits: the fastest completion.
    FASTEST = rules.FASTEST
    # Late whatever serves it, and admission refuses such requests.
    REFUSED = rules.REFUSED


@dataclass(frozen=True)
class BindableConfig:
    """A configuration a request may end on: its parameters, accuracy and per-stage times."""

    config: Mapping[str, ParamValue]
    accuracy: float
    # Predicted service time at each stage, ms, at the plan's quantile (what must fit).
    stage_ms: tuple[float, ...]
    # The same at admission's quantile, for its refusal (None: ``stage_ms``).
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
    # Pipelines the pod runs at once (the gate), and each configuration's ``slot_stretch``.
    slots: int = 1
    stretch: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise BindingError("slots", f"{self.slots} is not >= 1", "give the gate's slots")
        if self.stretch is not None and (
            len(self.stretch) != len(self.configs)
            or not all(1 <= s <= rules.MAX_STRETCH for s in self.stretch)
        ):
            raise BindingError(
                "stretch",
                f"{self.stretch} for {len(self.configs)} configurations",
                f"give one factor in [1, {rules.MAX_STRETCH:g}] per configuration",
            )
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

    @cached_property
    def table(self) -> dict[str, Any]:
        """The plan as compass_rules decides on it (compass_rules.binding.decision_table)."""
        return rules.decision_table(
            self.stages,
            [
                (e.config, e.accuracy, e.stage_ms, e.stage_admit_ms or e.stage_ms, None)
                for e in self.configs
            ],
            self.slots,
            self.stretch,
        )

    def at_concurrency(self, running: int) -> StagePlan:
        """The plan as a request judges it with ``running`` pipelines in the pod (one slot)."""
        if self.slots <= 1:
            return self
        stretch = np.array(self.stretch or [1.0] * len(self.configs))
        factors = rules.concurrency_factor(stretch, running, self.slots).tolist()
        return StagePlan(
            self.stages,
            tuple(
                replace(
                    entry,
                    stage_ms=tuple(t * f for t in entry.stage_ms),
                    stage_admit_ms=None
                    if entry.stage_admit_ms is None
                    else tuple(t * f for t in entry.stage_admit_ms),
                )
                for entry, f in zip(self.configs, factors, strict=True)
            ),
        )


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
    """A configuration's predicted time from ``stage`` to the end, queues ahead included."""
    own = entry.stage_admit_ms if admitting and entry.stage_admit_ms is not None else entry.stage_ms
    return rules.remaining_ms(own, stage, backlog_ms)


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
) -> Binding:
    """Bind ``stage``: the configuration (consistent with ``bound``) the request heads for.
    ``at``: the stage reached (earlier where a pipeline reads parameters ahead of their calls)."""
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
    try:
        chosen, verdict, remaining = rules.bind_stage(
            plan.table,
            stage,
            bound,
            left_ms,
            backlog_ms,
            allowed,
            at,
            spare_ms,
            refuse,
        )
    except ValueError:
        raise BindingError(
            "bound",
            f"no allowed configuration has {dict(bound)}",
            "bind only values of the plan's configurations",
        ) from None
    return Binding(chosen, BindingVerdict(verdict), remaining)


def joint_options(
    plan: StagePlan,
    bound: Mapping[str, ParamValue],
    at: int,
    left_ms: float,
    backlog_ms: Sequence[float],
    allowed: Collection[int] | None = None,
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """The request's and a follower's (extra time, accuracy) choices ``joint_spare_ms`` plans."""
    own, theirs = followers.joint_options(plan.table, bound, at, left_ms, backlog_ms, allowed)
    return [(t, a) for t, a in own.tolist()], [(t, a) for t, a in theirs.tolist()]


def fit_stage_times(
    profiles: Sequence[LatencyProfile],
    stages: Sequence[Sequence[str]],
    prior_shares: Sequence[float] | None = None,
) -> list[tuple[float, ...]]:
    """Each profile's mean time split over the stages by least squares, one term per stage and
    value; what a fit cannot tell (a constant moved between stages) leans to ``prior_shares``."""
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
    """Each profile's share of its time at each stage: measured where all have it, else fitted."""
    measured = measured_stage_times(profiles, components)
    times_of = measured or fit_stage_times(profiles, stages, prior_shares)
    return [tuple(t / sum(times) for t in times) for times in times_of]


def stage_models(components: Sequence[StageComponents]) -> list[tuple[str, ...]]:
    """Each stage's component models as a tuple (a stage named by one model: that one)."""
    return [(stage,) if isinstance(stage, str) else tuple(stage) for stage in components]


def measured_stage_times(
    profiles: Sequence[LatencyProfile], components: Sequence[StageComponents] | None
) -> list[tuple[float, ...]] | None:
    """Each profile's time at each stage from its component times; None unless all have some."""
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
    """The plan for these profiles: each one's time at ``quantile`` split by ``stage_shares``."""
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
    """The plan as a router takes it (the control model's ``binding``)."""
    if slo_ms is not None and not (math.isfinite(slo_ms) and slo_ms > 0):
        raise BindingError("slo_ms", f"{slo_ms!r} is not a time > 0", "give the SLO in ms")
    for field, share in (("degrade_after", degrade_after), ("lag_share", lag_share)):
        if share is not None and (slo_ms is None or not 0 < share <= 1):
            raise BindingError(
                field,
                f"{share!r} with slo_ms {slo_ms!r}",
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
                "stretch": 1.0 if plan.stretch is None else plan.stretch[index],
            }
            for index, entry in enumerate(plan.configs)
        ],
        "refuse": refuse,
        "slo_ms": slo_ms,
        "slots": plan.slots,
        "degrade_after": degrade_after,
        "lag_share": lag_share,
        "lag_reserve": lag_reserve,
        "settle_ms": settle_ms,
    }
