"""Per-request binding's settings: who chooses each request's configuration, the pipeline's
stages, the lag cap and the routers' gate (part of a ParetoPolicy's and a CompoundWorkflow's
serving; docs/serving.md, "Choosing how it serves")."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from compass.api.meta import CamelModel, ShortText
from compass.api.rules import CelRule, cel_rules
from compass.domain.profiles import MAX_COMPONENTS
from compass.domain.space import MAX_PARAMETERS
from compass_rules.binding import MAX_STAGES as MAX_BINDING_STAGES

# The lag cap's reserve: more of the fastest's likely times than any SLO holds a queue of.
MAX_LAG_RESERVE = 64
# Router instances in a gate (a bound for the schema; Triton runs far fewer per GPU).
MAX_GATE_INSTANCES = 1024


class BindingMode(StrEnum):
    """Who chooses a request's configuration: the routers per request (late binding), or the
    policy for the whole workflow."""

    # Each request bound by the routers: at take-up (no stages) or stage by stage.
    PER_REQUEST = "per-request"
    # The former name of per-request with stages, kept so that existing manifests apply.
    PER_STAGE = "per-stage"
    # The policy's configuration (or mix) serves every request: for data planes that cannot
    # bind per request.
    WORKFLOW = "workflow"

    @property
    def per_request(self) -> bool:
        """Whether the routers bind each request."""
        return self is not BindingMode.WORKFLOW


# The shipped router's gated model config (model-images/*/models/router/configs/gated.pbtxt):
# 8 instances take requests up as they arrive, one runs the pipeline at a time.
DEFAULT_GATE_INSTANCES = 8
DEFAULT_GATE_SLOTS = 1
# The lag cap the example and the default serve with (bench/serving_sim.py's best rule).
DEFAULT_LAG_SHARE = 0.3
DEFAULT_LAG_RESERVE = 2


class RouterGate(CamelModel):
    """The routers' gate as their model config sets it: what the simulator and `compass
    simulate` model (the routers read their own config)."""

    instances: Annotated[
        int,
        Field(
            ge=2,
            le=MAX_GATE_INSTANCES,
            description="Router instances a pod runs (instance_group count): each takes a "
            "request up as it arrives and waits at the gate, where the request binding sees it.",
        ),
    ] = DEFAULT_GATE_INSTANCES
    slots: Annotated[
        int,
        Field(
            ge=1,
            le=MAX_GATE_INSTANCES,
            description="Requests that run the pipeline at once (compass_pipeline_slots); "
            "binding judges each at the concurrency it runs at, from the front's capacity "
            "curves. `compass plan` sets it from them: the curve's concurrency where the pod "
            "serves more at once (a batching generator), else 1.",
        ),
    ] = DEFAULT_GATE_SLOTS

    @model_validator(mode="after")
    def _more_instances_than_slots(self) -> RouterGate:
        if self.instances <= self.slots:
            raise ValueError(
                f"binding.gate.instances: {self.instances} is not above slots ({self.slots}); "
                "give more instances than slots, e.g. 8 and 1, so that waiting requests are seen"
            )
        return self


class BindingStage(CamelModel):
    """One stage of the workflow's pipeline: the component model (or models) it calls and the
    parameters their time depends on."""

    # The same rule as _one_way_to_name_models, for the API server.
    model_config = cel_rules(
        CelRule(
            rule="has(self.component) != has(self.components)",
            message="give the stage's model as component, or its models as components, "
            "not both and not neither",
            field_path=".component",
        ),
    )

    component: ShortText | None = Field(
        default=None,
        min_length=1,
        description="The component model the pipeline calls at this stage.",
    )
    components: list[Annotated[str, Field(min_length=1, max_length=253)]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_COMPONENTS,
        description="The component models the stage may call, where it calls several (qa-real's "
        "retrieval: bm25, dense, the reranker); its time is theirs together. Instead of "
        "component.",
    )
    parameters: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        min_length=1,
        max_length=MAX_PARAMETERS,
        description="The configuration parameters this stage binds (read before its call).",
    )
    share: Annotated[
        float | None,
        Field(
            gt=0,
            lt=1,
            description="Roughly what share of a configuration's time this stage takes: the "
            "per-stage fit leans to it where the end-to-end profiles leave the split open "
            "(all stages or none).",
        ),
    ] = None

    @model_validator(mode="after")
    def _one_way_to_name_models(self) -> BindingStage:
        if (self.component is None) == (self.components is None):
            raise ValueError(
                "binding.stages[].component: give the stage's model as component, or its "
                "models as components, not both and not neither"
            )
        return self

    @property
    def models(self) -> str | tuple[str, ...]:
        """The model the stage calls, or its models where it may call several."""
        return self.component if self.component is not None else tuple(self.components or ())


class BindingSettings(CamelModel):
    """Late binding: the routers bind each request, at take-up or stage by stage, from its
    deadline and the work ahead of it (docs/method.md, Late binding)."""

    mode: BindingMode = Field(
        default=BindingMode.PER_REQUEST,
        description="per-request (the default): each request gets the most accurate front "
        "entry (consistent with what it has bound) whose remaining time fits what is left of "
        "its deadline (its arrival + the SLO behind the routers' gate, where the client sends "
        "none) and spares the requests waiting behind it, else the fastest (refused where "
        "admission is enabled and refuses); without stages the whole configuration is bound "
        "when a router instance takes the request up. workflow: the policy's configuration "
        "serves every request (for data planes that cannot bind per request). per-stage: the "
        "former name of per-request with stages.",
    )
    stages: list[BindingStage] = Field(
        default_factory=list,
        max_length=MAX_BINDING_STAGES,
        description=f"The pipeline's stages in the order a request reaches them (at most "
        f"{MAX_BINDING_STAGES}), each bound just before its call; none: the whole "
        "configuration is one stage, bound at take-up.",
    )
    quantile: Annotated[
        float,
        Field(
            gt=0,
            lt=1,
            description="The quantile of each entry's time that must fit the deadline.",
        ),
    ] = 0.95
    lag_share: Annotated[
        float | None,
        Field(
            gt=0,
            le=1,
            description="The lag cap: a request may take longer than its fastest completion "
            "only while that leaves it at most this share of the SLO (less lagReserve of the "
            "fastest's likely times) behind the schedule static fastest would keep, so a clump "
            "arriving behind it pays little for its extra accuracy (docs/method.md, Late "
            "binding). null: no cap.",
        ),
    ] = DEFAULT_LAG_SHARE
    lag_reserve: Annotated[
        int,
        Field(
            ge=0,
            le=MAX_LAG_RESERVE,
            description="With lagShare: its share is of the SLO less this many of the fastest's "
            "likely times, so a short SLO allows less lag.",
        ),
    ] = DEFAULT_LAG_RESERVE
    gate: RouterGate = Field(
        default_factory=RouterGate,
        description="The routers' gate (their model config): what `compass simulate` and the "
        "plan's prediction model. The shipped router's gated config: 8 instances, 1 slot.",
    )

    @model_validator(mode="after")
    def _stages_for_per_stage(self) -> BindingSettings:
        if self.mode is BindingMode.PER_STAGE and not self.stages:
            raise ValueError(
                "binding.stages: per-stage needs the pipeline's stages; give each stage's "
                "component and parameters, in order, or use mode per-request without stages "
                "(the whole configuration bound at take-up)"
            )
        shares = [stage.share for stage in self.stages]
        if any(share is not None for share in shares) and (
            None in shares or abs(sum(s for s in shares if s is not None) - 1) > 1e-6
        ):
            raise ValueError(
                "binding.stages[].share: give every stage a share, adding up to 1, or none"
            )
        return self
