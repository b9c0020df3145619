"""The CompoundWorkflow custom resource: what the user declares, and what the operator reports."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, model_validator

from compass.api.conditions import CONDITIONS_SCHEMA, MAX_CONDITIONS, Condition
from compass.api.jobpod import JobPod, Resources
from compass.api.meta import (
    DEFAULT_ROUTER_MODEL,
    MAX_ARG_LENGTH,
    MAX_ARGS,
    MAX_IMAGE_LENGTH,
    MAX_NAME_LENGTH,
    MAX_NAMESPACE_LENGTH,
    CamelModel,
    ShortText,
    Timestamp,
)
from compass.api.metricsource import TritonTls
from compass.api.paretopolicy import ServingSettings, SloSpec
from compass.api.rules import CelRule, cel_rules, strictly_increasing
from compass.domain.capacity import MAX_CURVE_POINTS, MIN_REQUESTS_PER_RATE
from compass.domain.search import (
    DEFAULT_BATCH,
    MAX_BATCH,
    MAX_CONCURRENCY,
    MAX_DATASET_SIZE,
    SearchMethod,
)
from compass.domain.space import SpaceSpec
from compass.domain.statistics import IntervalMethod

# Bounds that the CEL rules' cost estimate needs (current API servers reject a CRD whose rules
# could cost too much on unbounded input); far above what a workflow uses.
MAX_BUDGETS = 32
MAX_PATH_LENGTH = 4096
# Where the search Job's pod finds a mounted dataset; $COMPASS_DATASET names the file.
DATASET_DIR = "/var/run/compass/dataset"


class ConfigMapDataset(CamelModel):
    """A dataset stored in a ConfigMap key."""

    name: ShortText = Field(description="Name of the ConfigMap in the workflow's namespace.")
    key: ShortText = Field(
        pattern=r"^[-._a-zA-Z0-9]+$",
        description=f"Key holding the dataset (JSON Lines, one sample a line); mounted as "
        f"{DATASET_DIR}/KEY in the search Job.",
    )


class VolumeDataset(CamelModel):
    """A dataset on a PersistentVolumeClaim."""

    model_config = cel_rules(
        CelRule(
            rule="!self.path.contains('..')",
            message="volume.path: '..' leaves the volume; give a path inside it",
            field_path=".path",
        )
    )

    claim_name: ShortText = Field(
        description=f"Name of the PersistentVolumeClaim, mounted read-only at {DATASET_DIR} in "
        "the search Job.",
    )
    path: str = Field(
        min_length=1,
        max_length=MAX_PATH_LENGTH,
        description="Path of the dataset inside the volume.",
    )

    @model_validator(mode="after")
    def _inside(self) -> VolumeDataset:
        if ".." in self.path:
            raise ValueError("volume.path: '..' leaves the volume; give a path inside it")
        return self


class Dataset(CamelModel):
    """Where the evaluation samples come from: at most one source, which the search Job's pod
    sees at the path in $COMPASS_DATASET (each field says what the triton evaluator does)."""

    size: Annotated[
        int,
        Field(
            ge=1,
            le=MAX_DATASET_SIZE,
            description=f"Number of samples in the dataset (at most {MAX_DATASET_SIZE:,}).",
        ),
    ]
    config_map: ConfigMapDataset | None = Field(
        default=None,
        description="Dataset in a ConfigMap key, mounted into the search Job for the command "
        "evaluator (the triton evaluator refuses it: the pipeline holds its samples).",
    )
    volume: VolumeDataset | None = Field(
        default=None,
        description="Dataset on a volume, mounted into the search Job for the command evaluator "
        "(the triton evaluator refuses it: the pipeline holds its samples).",
    )
    image_path: str | None = Field(
        default=None,
        max_length=MAX_PATH_LENGTH,
        description=f"Dataset at this path inside the search Job's image (spec.search.image; "
        f"at most {MAX_PATH_LENGTH} characters). With the triton evaluator it only names the "
        "dataset: a new path starts the search over.",
    )

    # The same rule as _one_source, for the API server (an empty imagePath counts as unset).
    model_config = cel_rules(
        CelRule(
            rule="(has(self.configMap) ? 1 : 0) + (has(self.volume) ? 1 : 0)"
            " + (has(self.imagePath) && self.imagePath != '' ? 1 : 0) <= 1",
            message="dataset: more than one source is set; give one of configMap, volume, "
            "imagePath",
        )
    )

    @model_validator(mode="after")
    def _one_source(self) -> Dataset:
        given = [
            alias
            for name, alias in (
                ("config_map", "configMap"),
                ("volume", "volume"),
                ("image_path", "imagePath"),
            )
            if getattr(self, name)
        ]
        if len(given) > 1:
            raise ValueError(
                f"dataset: {' and '.join(given)} are both set; give one of configMap, volume, "
                f"imagePath"
            )
        return self


def _unread_by_triton(source: str) -> str:
    """Why the triton evaluator refuses a mounted dataset, and the two ways out."""
    return (
        f"evaluation.dataset.{source}: the triton evaluator never reads it (it sends "
        f'{{"sample": i}} to your pipeline, which holds the samples: docs/pipelines.md); leave '
        f"{source} out, or score with evaluator type command"
    )


class EvaluatorType(StrEnum):
    """Who scores a configuration on samples during the search."""

    TRITON = "triton"
    COMMAND = "command"
    REPLAY = "replay"


class EvaluatorSpec(CamelModel):
    """The evaluator of the search Job."""

    type: EvaluatorType = Field(
        default=EvaluatorType.TRITON,
        description="triton: send samples to the router with a per-request configuration; "
        "command: run a command that scores a configuration on sample indices; replay: read "
        "recorded scores from a ledger.",
    )
    command: list[Annotated[str, Field(max_length=MAX_ARG_LENGTH)]] | None = Field(
        default=None,
        max_length=MAX_ARGS,
        description="For type command: the command and its arguments, run in the search Job's "
        "image (spec.search.image); it reads the dataset at $COMPASS_DATASET.",
    )
    replay_config_map: ShortText | None = Field(
        default=None,
        description="For type replay: ConfigMap whose key 'ledger.jsonl' (or gzip ledger chunks, "
        "as a search's state keeps them) holds the recorded scores (an object name, at most "
        f"{MAX_NAME_LENGTH} characters).",
    )

    # The same rules as _complete, for the API server.
    model_config = cel_rules(
        CelRule(
            rule="!has(self.type) || self.type != 'command'"
            " || (has(self.command) && size(self.command) > 0)",
            message="evaluator.command: type command needs the command to run",
            field_path=".command",
            reason="FieldValueRequired",
        ),
        CelRule(
            rule="!has(self.type) || self.type != 'replay'"
            " || (has(self.replayConfigMap) && self.replayConfigMap != '')",
            message="evaluator.replayConfigMap: type replay needs the ledger ConfigMap",
            field_path=".replayConfigMap",
            reason="FieldValueRequired",
        ),
    )

    @model_validator(mode="after")
    def _complete(self) -> EvaluatorSpec:
        if self.type is EvaluatorType.COMMAND and not self.command:
            raise ValueError("evaluator.command: type command needs the command to run")
        if self.type is EvaluatorType.REPLAY and not self.replay_config_map:
            raise ValueError("evaluator.replayConfigMap: type replay needs the ledger ConfigMap")
        return self


class Evaluation(CamelModel):
    """How accuracy is measured, and the accuracy target tau."""

    dataset: Dataset = Field(description="The evaluation samples.")
    tau: Annotated[
        float,
        Field(
            gt=0,
            le=1,
            description="Accuracy target: the search finds every configuration whose accuracy "
            "is >= tau.",
        ),
    ]
    budgets: Annotated[
        list[Annotated[int, Field(ge=1)]] | None,
        Field(
            min_length=1,
            max_length=MAX_BUDGETS,
            description="Strictly increasing sample counts at which a configuration may be "
            "judged; the last at most dataset.size (at most "
            f"{MAX_BUDGETS}). Leave it out: betting then looks wherever a verdict has become "
            "possible and wilson uses 10,25,50,100 below dataset.size, then dataset.size, so "
            "that every verdict is covered by the confidence bound.",
        ),
    ] = None
    confidence: Annotated[
        float, Field(gt=0.5, lt=1, description="Confidence of the early-stopping verdicts.")
    ] = 0.95
    interval: IntervalMethod = Field(
        default=IntervalMethod.BETTING,
        description="Early-stopping test: betting (anytime-valid: any number of looks) or "
        "wilson (Bonferroni over the budgets).",
    )
    method: SearchMethod = Field(
        default=SearchMethod.COMPASS_V, description="compass-v, or grid (the baseline)."
    )
    seed: Annotated[int, Field(ge=0, description="Seed of the sample order and the search.")] = 0
    concurrency: Annotated[
        int | None,
        Field(
            ge=1,
            le=MAX_CONCURRENCY,
            description="Evaluations the search Job keeps in flight: requests to Triton, or "
            "command processes. The answer is the same at any concurrency. Default: with the "
            "triton evaluator, the Service's ready pods (its EndpointSlices) x the router's "
            "instances (its model config), the requests spread over those pods; else 1.",
        ),
    ] = None
    batch: Annotated[
        int,
        Field(
            ge=1,
            le=MAX_BATCH,
            description="Configurations a round of the search evaluates side by side: what "
            "a concurrency can overlap beyond one configuration's samples (e.g. 16 with a "
            "concurrency of 16 or more). Unlike concurrency it can change which configurations "
            "are evaluated, a few % more samples (never the verdict of one); 1: the "
            "one-at-a-time search.",
        ),
    ] = DEFAULT_BATCH
    evaluator: EvaluatorSpec = Field(
        default_factory=EvaluatorSpec, description="Who scores samples."
    )

    # The same rules as _budgets_fit and _dataset_read, for the API server.
    model_config = cel_rules(
        CelRule(
            # A conditional rather than ||: the API server short-circuits both, but the
            # CEL library the unit tests use evaluates .all() over the missing list.
            rule=f"has(self.budgets) ? ({strictly_increasing('budgets', MAX_BUDGETS)}) : true",
            message="evaluation.budgets: the budgets are not strictly increasing; "
            "e.g. 10,25,50,100",
            field_path=".budgets",
        ),
        CelRule(
            rule="has(self.budgets) ? (size(self.budgets) == 0"
            " || self.budgets[size(self.budgets) - 1] <= self.dataset.size) : true",
            message="evaluation.budgets: the last budget exceeds dataset.size; lower the last "
            "budget",
            field_path=".budgets",
        ),
        *(
            CelRule(
                rule="(has(self.evaluator) && has(self.evaluator.type)"
                f" && self.evaluator.type != 'triton') || !has(self.dataset.{source})",
                message=_unread_by_triton(source),
                field_path=f".dataset.{source}",
                reason="FieldValueForbidden",
            )
            for source in ("configMap", "volume")
        ),
    )

    @model_validator(mode="after")
    def _dataset_read(self) -> Evaluation:
        # A mounted dataset nothing reads would let a user believe the search scores it.
        if self.evaluator.type is EvaluatorType.TRITON:
            if self.dataset.config_map is not None:
                raise ValueError(_unread_by_triton("configMap"))
            if self.dataset.volume is not None:
                raise ValueError(_unread_by_triton("volume"))
        return self

    @model_validator(mode="after")
    def _budgets_fit(self) -> Evaluation:
        if self.budgets is None:
            return self
        if any(b <= a for a, b in zip(self.budgets, self.budgets[1:], strict=False)):
            raise ValueError(
                f"evaluation.budgets: {self.budgets} is not strictly increasing; e.g. 10,25,50,100"
            )
        if self.budgets[-1] > self.dataset.size:
            raise ValueError(
                f"evaluation.budgets: {self.budgets[-1]} exceeds dataset.size "
                f"{self.dataset.size}; lower the last budget"
            )
        return self


class Profiling(JobPod):
    """How the Triton pods' latency is measured, by a client pod that needs no GPU of its own."""

    resources: Resources = Field(
        default_factory=Resources,
        description="The profiling pod's resources (default: none). It sends requests to the "
        "Triton pods and needs no GPU: a GPU request would wait for one the Triton pods hold. A "
        "CPU request keeps the client's own delays out of the latencies on a busy node.",
    )
    warmup_runs: Annotated[
        int, Field(ge=0, description="Unmeasured requests per configuration.")
    ] = 3
    measured_runs: Annotated[
        int, Field(ge=2, description="Measured requests per configuration.")
    ] = 50
    curve_requests_per_rate: Annotated[
        int,
        Field(
            ge=MIN_REQUESTS_PER_RATE,
            le=100000,
            description="With serving.thresholdModel measured: the open-loop requests offered "
            "at each rate of a front configuration's capacity curve.",
        ),
    ] = 300
    curve_max_points: Annotated[
        int,
        Field(
            ge=2,
            le=MAX_CURVE_POINTS,
            description="With serving.thresholdModel measured: at most this many rates per "
            "capacity curve (the curve's cost is this times curveRequestsPerRate).",
        ),
    ] = 12
    curve_min_seconds_per_rate: Annotated[
        float,
        Field(
            ge=1,
            le=3600,
            description="With serving.thresholdModel measured: at least this many seconds of "
            "arrivals at each rate, more than curveRequestsPerRate where a fast configuration's "
            "high rates would end before an overload's queue shows. On nodes other work shares, "
            "30 steadies the p95 a run reads. curveMaxSecondsPerRate wins where the two disagree.",
        ),
    ] = 10
    curve_max_seconds_per_rate: Annotated[
        float,
        Field(
            ge=5,
            le=3600,
            description="With serving.thresholdModel measured: at most this many seconds of "
            "arrivals at each rate, fewer than curveRequestsPerRate where a slow configuration's "
            f"low rates would take minutes a point (never under {MIN_REQUESTS_PER_RATE} requests).",
        ),
    ] = 120
    curve_repeats_per_rate: Annotated[
        int,
        Field(
            ge=1,
            le=5,
            description="With serving.thresholdModel measured: runs at each rate of a capacity "
            "curve; the point is the run of median p95 (3 on nodes other work shares: one run "
            "can meet a busy moment). The curve's cost grows by this factor.",
        ),
    ] = 1
    image: str | None = Field(
        default=None,
        max_length=MAX_IMAGE_LENGTH,
        description="Profiler image (default: the operator's image).",
    )
    active_deadline_seconds: Annotated[
        int, Field(ge=1, description="The profiling Job's deadline.")
    ] = 3600
    max_seconds: Annotated[
        int | None,
        Field(
            ge=1,
            description="A bound on the profiling's wall time, from its first pod's start "
            "(retries included): past it the Job stops with a message saying how far it got, "
            "and the workflow fails with it. Measurements already made are kept: with this "
            "raised, the next profiling does not measure them again. Unset: only the Job's "
            "activeDeadlineSeconds bounds it.",
        ),
    ] = None


class TritonEndpoint(CamelModel):
    """The Triton server that serves the workflow."""

    service: ShortText = Field(description="Service name (or host) of Triton.")
    namespace: str | None = Field(
        default=None,
        max_length=MAX_NAMESPACE_LENGTH,
        description="Namespace of the Service (default: the workflow's).",
    )
    grpc_port: Annotated[int, Field(ge=1, le=65535, description="gRPC port.")] = 8001
    http_port: Annotated[int, Field(ge=1, le=65535, description="HTTP port.")] = 8000
    metrics_port: Annotated[int, Field(ge=1, le=65535, description="Metrics port.")] = 8002
    router_model: ShortText = Field(
        default=DEFAULT_ROUTER_MODEL,
        description="Name of the router model.",
    )
    evaluation_service: ShortText | None = Field(
        default=None,
        description="Service name (or host) the search and profiling Jobs send to instead of "
        "service: a staging set of Triton pods with the same router model, ports and TLS, so "
        "that measuring loads no pod that serves. The generated ParetoPolicy still routes "
        "service, with the latencies measured here: give the staging pods the serving pods' "
        "nodes and models. Default: service.",
    )
    tls: TritonTls | None = Field(
        default=None,
        description="TLS (and mutual TLS) to Triton's gRPC port, for the search and profiling "
        "Jobs (which get the Secret by name) and the generated ParetoPolicy's routing.tls "
        "(none: plaintext). The Secret is in the workflow's namespace.",
    )


class Search(JobPod):
    """Limits of the search Job, and where its pod runs."""

    active_deadline_seconds: Annotated[
        int, Field(ge=1, description="The search Job's deadline.")
    ] = 86400
    backoff_limit: Annotated[
        int, Field(ge=0, le=20, description="Pod retries; the ledger makes each retry resume.")
    ] = 3
    image: str | None = Field(
        default=None,
        max_length=MAX_IMAGE_LENGTH,
        description="Image (default: the operator's image); a command evaluator runs in it.",
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="The search pod's resources (default: requests cpu 250m and memory 256Mi, "
        "limit memory 2Gi: a space at the 2,000,000-configuration limit needs about 1Gi).",
    )


class CompoundWorkflowSpec(CamelModel):
    """A compound-AI workflow, its configuration space, how to evaluate it and its SLO."""

    space: SpaceSpec = Field(description="The components' parameters and their constraints.")
    evaluation: Evaluation = Field(description="Accuracy measurement and the target tau.")
    search: Search = Field(
        default_factory=Search, description="Limits of the search Job, and where its pod runs."
    )
    profiling: Profiling = Field(
        default_factory=Profiling,
        description="Latency profiling of the feasible configurations on the Triton pods.",
    )
    slo: SloSpec = Field(description="The latency SLO the serving policy keeps.")
    triton: TritonEndpoint = Field(description="The Triton server and router model.")
    serving: ServingSettings = Field(
        default_factory=ServingSettings,
        description="How the generated ParetoPolicy serves: hysteresis, threshold model, metrics "
        "source (default: Triton's own /metrics at spec.triton), decision interval. A change "
        "re-plans without any Job.",
    )
    auto_apply: bool = Field(
        default=True,
        description="Apply the planned ParetoPolicy. false: the plan waits for review in "
        "status.plannedPolicy (phase Planned, Ready False AwaitingReview) and a person or GitOps "
        "applies it; turning it true applies the plan without searching again.",
    )


class Phase(StrEnum):
    """Where a CompoundWorkflow is in its life."""

    PENDING = "Pending"
    SEARCHING = "Searching"
    PROFILING = "Profiling"
    PLANNING = "Planning"
    PLANNED = "Planned"  # planned, not applied (spec.autoApply false): awaiting review
    READY = "Ready"
    FAILED = "Failed"


class WorkflowConditionType(StrEnum):
    """The conditions a CompoundWorkflow reports."""

    READY = "Ready"
    SPEC_VALID = "SpecValid"
    SEARCH_SUCCEEDED = "SearchSucceeded"
    FEASIBLE_SET_EMPTY = "FeasibleSetEmpty"
    PROFILED = "Profiled"
    POLICY_READY = "PolicyReady"
    LEDGER_READ = "LedgerRead"


class CompoundWorkflowStatus(CamelModel):
    """What the operator has done for a CompoundWorkflow."""

    phase: Phase = Field(default=Phase.PENDING, description="Where the workflow is in its life.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Ready (kubectl wait --for=condition=Ready), SpecValid, SearchSucceeded, "
        "Profiled, PolicyReady, ...",
        json_schema_extra=CONDITIONS_SCHEMA,
    )
    start_time: Timestamp = Field(
        default=None, description="When the operator started the current generation (RFC 3339)."
    )
    completion_time: Timestamp = Field(
        default=None, description="When the current generation became Ready or Failed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, description="The spec generation the status describes."
    )
    configurations_evaluated: int | None = Field(
        default=None, description="Configurations the search has evaluated so far."
    )
    samples_used: int | None = Field(default=None, description="Sample evaluations so far.")
    feasible_found: int | None = Field(
        default=None, description="Configurations found with accuracy >= tau."
    )
    best_accuracy: float | None = Field(
        default=None, description="Highest accuracy seen (what tau could be at most)."
    )
    search_rate: str | None = Field(
        default=None,
        description="While the search runs: its sample evaluations per second and an upper "
        "bound on the time left (every configuration never evaluated, at the samples an "
        "evaluated one took so far).",
    )
    search_job: str | None = Field(default=None, description="Name of the search Job.")
    profiling_job: str | None = Field(default=None, description="Name of the profiling Job.")
    ledger_config_map: str | None = Field(
        default=None, description="ConfigMap holding the search ledger (the checkpoint)."
    )
    ledger_config_map_uid: str | None = Field(
        default=None,
        max_length=64,
        description="The uid the API server gave the state ConfigMap when the operator created "
        "it: a ConfigMap of that name with another uid (made by someone else) is never read.",
    )
    policy: str | None = Field(default=None, description="Name of the generated ParetoPolicy.")
    planned_policy: dict[str, Any] | None = Field(
        default=None,
        description="With spec.autoApply false: the planned ParetoPolicy, an applyable manifest "
        "(kubectl get compoundworkflow NAME -o jsonpath='{.status.plannedPolicy}' | kubectl "
        "apply -f -). Its front has at most as many entries as a ParetoPolicy admits.",
    )
