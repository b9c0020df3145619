"""Operator-wide settings: one typed object, read once at start-up from COMPASS_* variables."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from compass.controllers.collector import FREEZE_EVERY_S
from compass.controllers.job_pod_limits import ANY, JobPodLimits, quantity
from compass.controllers.logs import LogFormat, LogLevel
from compass.controllers.targets import DEFAULT_CLUSTER_DOMAIN, TargetAccess


class OperatorSettings(BaseSettings):
    """What the operator needs to know about its environment (env prefix COMPASS_)."""

    model_config = SettingsConfigDict(env_prefix="COMPASS_", extra="ignore")

    image: str = Field(
        default="ghcr.io/compass-operator/compass-operator:0.1.0",
        description="Image of the search and profiling Jobs (the operator's own image).",
    )
    allowed_job_images: list[str] = Field(
        default_factory=list,
        description="Images a workflow's search.image or profiling.image may name besides the "
        "operator's own: exact references, or prefixes ending in * (registry.example.com/team/*); "
        "* for any image.",
    )
    job_service_account: str = Field(
        default="compass-job",
        description="Prefix of the Jobs' ServiceAccounts: each workflow's Jobs run as "
        "<prefix>-<workflow>, owned by the workflow, which may read and patch that workflow's "
        "state ConfigMaps and get the Secret its triton.tls names.",
    )
    job_image_pull_secrets: list[str] = Field(
        default_factory=list,
        description="Secrets every Job's pod pulls its image with (the chart's imagePullSecrets: "
        "a JSON list of names or of {name: ...}); each must exist in the workflow's namespace.",
    )
    job_allowed_tolerations: list[str] = Field(
        default_factory=lambda: [ANY],
        description="Tolerations a workflow's Job pods may ask for: KEY (any effect), "
        "KEY:EFFECT, or * for any (a toleration with no key, which tolerates every taint, "
        "needs *). [] allows none.",
    )
    job_allowed_node_selector: list[str] = Field(
        default_factory=lambda: [ANY],
        description="Node labels a workflow's Job pods may select: KEY=VALUE, KEY=* (any "
        "value), or * for any; restricted, nodeAffinity and podAffinity are refused too. [] "
        "allows none.",
    )
    job_allowed_priority_classes: list[str] = Field(
        default_factory=lambda: [ANY],
        description="PriorityClasses a workflow's Job pods may name, or * for any; a pod that "
        "names none is always allowed. [] allows none.",
    )
    job_allowed_runtime_classes: list[str] = Field(
        default_factory=lambda: [ANY],
        description="RuntimeClasses a workflow's Job pods may name, or * for any; a pod that "
        "names none is always allowed. [] allows none.",
    )
    job_max_resources: dict[str, str] = Field(
        default_factory=dict,
        description="The most of each resource (cpu, memory, nvidia.com/gpu: a quantity) one "
        "Job pod's requests or limits may name; resources not listed are not bounded here.",
    )
    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces to watch; empty means the whole cluster.",
    )
    metrics_port: int = Field(default=8080, description="Port of the operator's own /metrics.")
    health_port: int = Field(default=8081, description="Port of the liveness probe (/healthz).")
    poll_interval_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often an active CompoundWorkflow's Jobs and state ConfigMap are read "
        "(progress counts, and the next phase once a Job ends).",
    )
    policy_tick_seconds: float = Field(
        default=1.0,
        ge=0.05,
        le=60,
        description="How often each ParetoPolicy's timer fires; a decision is due every "
        "intervalSeconds, to half a tick, so intervalSeconds below it decide at every tick. "
        "Below 1 s where time runs scaled (the demo, tests).",
    )
    policy_workers: int = Field(
        default=16,
        ge=1,
        le=256,
        description="Threads that run the ParetoPolicies' ticks (each waits mostly on its "
        "routers and the API server): more for many policies on slow networks.",
    )
    gc_freeze_seconds: float = Field(
        default=FREEZE_EVERY_S,
        ge=0,
        description="How often the objects that survived are frozen out of Python's garbage "
        "collections (a thousand policies' heap made each full collection a pause of up to "
        "1.4 s); everything is collected once every 15 minutes. 0: the collector as Python "
        "runs it.",
    )
    status_writes_per_second: float = Field(
        default=15.0,
        gt=0,
        description="Routine ParetoPolicy status writes (the observation time and rate samples, "
        "at the heartbeat) spread so that all policies together write about this many a second: "
        "the heartbeat is 10 s, or the number of policies divided by this where that is longer. "
        "A switch or a condition change is written at once.",
    )
    ledger_text_limit_mib: int = Field(
        default=32,
        ge=1,
        le=256,
        description="The most ledger text (MiB) the operator inflates for one workflow, "
        "whatever its spec; a state's ledger past it, or past what its workflow can record, is "
        "refused (the LedgerRead condition names it), not carried over.",
    )
    ledger_text_budget_mib: int = Field(
        default=64,
        ge=1,
        le=1024,
        description="The most ledger text (MiB) the operator holds inflated at once across all "
        "workflows; a start that would pass it waits and retries. The process's peak is a few "
        "times this: keep it well under the memory limit.",
    )
    triton_address_override: str | None = Field(
        default=None,
        description="Reach every Triton at this host:port instead of its Service (tests, demo).",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts a resource's metrics URL or router endpoint may name besides "
        "in-cluster Services (NAME, NAME.NAMESPACE.svc[.clusterDomain]): exact names or IPs, "
        "*.example.com for the names under a domain, * for any host (an operator run outside a "
        "cluster).",
    )
    allowed_target_namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces besides its own whose Triton routers a resource may switch "
        "(routing.grpcEndpoint, a CompoundWorkflow's triton); * for every namespace.",
    )
    metrics_namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces besides its own whose Services a resource's metrics URL may "
        "read (a shared Prometheus's, e.g. monitoring); * for every namespace. Namespaces in "
        "allowedTargetNamespaces may be read too.",
    )
    cluster_domain: str = Field(
        default=DEFAULT_CLUSTER_DOMAIN,
        description="The cluster's DNS domain: NAME.NAMESPACE.svc.<it> names a Service.",
    )
    peering: str | None = Field(
        default=None,
        description="kopf peering object to join (a ClusterKopfPeering when watching the cluster, "
        "a KopfPeering in each watched namespace); unset: standalone, no peering.",
        max_length=253,
    )
    peering_priority: int | None = Field(
        default=None,
        description="Peering priority: the live operator with the highest acts, the rest pause; "
        "unset: derived from the start time, so the oldest replica acts.",
    )
    peering_lifetime_seconds: int = Field(
        default=60,
        ge=5,
        description="How long a peer counts as alive after its last keep-alive: a killed "
        "operator's standby takes over within this.",
    )
    log_level: LogLevel = Field(
        default="info",
        description="The lowest level the operator logs: debug, info, warning or error.",
    )
    log_format: LogFormat = Field(
        default="text",
        description="text: one line a record; json: one JSON object a line (time, level, logger, "
        "message, and the resource it is about under object), for a log collector.",
    )

    def target_access(self) -> TargetAccess:
        """What resources may point the operator at, as compass.controllers.targets checks it."""
        return TargetAccess(
            tuple(self.allowed_hosts),
            tuple(self.allowed_target_namespaces),
            self.cluster_domain,
            tuple(self.metrics_namespaces),
        )

    def job_pod_limits(self) -> JobPodLimits:
        """What a workflow's Job pods may ask for, as compass.controllers.job_pod_limits checks it."""
        return JobPodLimits(
            tuple(self.job_allowed_tolerations),
            tuple(self.job_allowed_node_selector),
            dict(self.job_max_resources),
            tuple(self.job_allowed_priority_classes),
            tuple(self.job_allowed_runtime_classes),
        )

    @field_validator("job_max_resources", mode="before")
    @classmethod
    def _quantities(cls, value: object) -> object:
        """Every maximum a Kubernetes quantity: a bad chart value stops the operator at start-up."""
        if not isinstance(value, dict):
            return value
        for resource, most in value.items():
            try:
                if isinstance(most, bool) or not isinstance(most, str | int | float):
                    raise ValueError(f"{most!r} is not a Kubernetes quantity")
                if quantity(str(most)) < 0:
                    raise ValueError(f"{most!r} is negative")
            except ValueError as error:
                raise ValueError(f"jobPods.maxResources[{resource}]: {error}") from None
        return {resource: str(most) for resource, most in value.items()}

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
        """INFO and JSON mean info and json (as logging and kopf's --log-format spell them)."""
        return value.lower() if isinstance(value, str) else value

    @field_validator("job_image_pull_secrets", mode="before")
    @classmethod
    def _secret_names(cls, value: object) -> object:
        """[{name: regcred}] (a pod spec's imagePullSecrets, as the chart holds it) is [regcred]."""
        if isinstance(value, list):
            return [v.get("name") if isinstance(v, dict) else v for v in value]
        return value

    @field_validator("peering")
    @classmethod
    def _peering_name(cls, value: str | None) -> str | None:
        """Empty means standalone (a Helm value rendered as "")."""
        return value or None
