"""`compass demo --cluster`: the demo through the operator, on a local real Kubernetes API server.

The k8s test tier's control plane (compass.lab.devcluster, compass.lab.devnode), a local
tritonserver serving rag-sim and `compass operator` as a process; `kubectl apply` of the CRDs and
of examples/rag-sim-workflow.yaml, adapted only as far as this machine needs (``adaptations``,
each change printed); then the same seeded spike served by the operator's policy and, paused,
by the most accurate and the fastest configuration. rag-sim runs at ``time_scale``; every figure
printed is unscaled. docs/development.md.
"""

from __future__ import annotations

import contextlib
import copy
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import yaml
from kubernetes import client

from compass.api.meta import GROUP, POLICY_PLURAL, VERSION, WORKFLOW_PLURAL
from compass.api.paretopolicy import ParetoPolicySpec
from compass.console import plan_table
from compass.controllers import kubeapi
from compass.controllers.builders import LEDGER_KEY, PROFILES_KEY, RESULT_KEY
from compass.controllers.ledgerchunks import CHUNK_OF_LABEL
from compass.conversion import (
    admission_rule,
    binding_table,
    elastico_settings,
    latency_profiles,
    simulated_binding,
)
from compass.dataplane.metrics import TritonQueueDepth
from compass.dataplane.triton import TritonRouter
from compass.domain.admission import Admission
from compass.domain.arrivals import SPIKE_FACTOR, Scenario
from compass.domain.binding import (
    RAG_SIM_COMPONENTS,
    RAG_SIM_SHARES,
    RAG_SIM_STAGE_PARAMS,
    measured_stage_times,
)
from compass.domain.bindingsim import ROUTER_POLL_S, simulate_binding
from compass.domain.elastico import Decision, Observation, PolicyState
from compass.domain.planner import Plan, Slo, plan_from_profiles
from compass.domain.podmodel import PodModel
from compass.domain.profiles import LatencyProfile, parse_profiles
from compass.domain.simulator import FRESH, MetricsView, RunReport, Tick, compare
from compass.domain.space import config_key
from compass.domain.strategy import Policy, build_policy
from compass.lab.demo import (
    RUN_TITLES,
    Reporter,
    comparison_document,
    comparison_rows,
    comparison_text,
    shown,
    verdict,
    write_file,
    write_json,
)
from compass.lab.devcluster import (
    REPO_ROOT,
    Cluster,
    ClusterError,
    ClusterUnavailableError,
    Operator,
    ensure_binaries,
)
from compass.lab.devnode import Node
from compass.lab.experiment import OBSERVED_WINDOW_S, SETTLE_S, LiveRun, SwitchEvent, serve
from compass.lab.local_triton import (
    LocalPrometheus,
    LocalServerError,
    LocalTriton,
    TritonInstallation,
    prometheus_binary,
)
from compass.lab.plots import save_plan_figure, save_timeline_figure
from compass.lab.podenv import LocalImage
from compass.lab.processes import venv_executable, wait_for
from compass.lab.scenarios import RagSimLoad, rag_sim_data, rag_sim_triton, spike_scenario

EXAMPLE = REPO_ROOT / "examples" / "rag-sim-workflow.yaml"
CRDS = REPO_ROOT / "crds"
NAMESPACE = "compass-demo"
LEDGER_CONFIG_MAP = "rag-sim-ledger"
TITLES = {**RUN_TITLES, "policy": "Elastico (operator)"}
BINDING_TITLES = {**RUN_TITLES, "policy": "late binding (operator)"}
# --late-binding: the routers' gate and lag cap as bench/serving_triton.py measured them best
# (--pipeline-slots 1 --router-instances 8 --binding-lag 0.3 --binding-lag-reserve 2
# --degrade-after 1; docs/method.md, "Behind the router's gate").
BINDING_ROUTER_INSTANCES = 8
BINDING_PIPELINE_SLOTS = 1
BINDING_LAG_SHARE = 0.3
BINDING_LAG_RESERVE = 2
# Issue 42's floor for the operator's policy: this share of the fastest-to-accurate gap (served
# accuracy) at no more than this many points of compliance under static fastest.
GAP_FLOOR_PCT = 30.0
COMPLIANCE_SLACK_POINTS = 1.0
SAMPLE_EVERY_S = 0.25  # how often the policy's status is read while the load runs
PROMETHEUS_SCRAPE_S = 0.5  # scaled: Prometheus' scrape interval when the queue is read through it
# Where the policy reads the queue: Triton's /metrics at every tick (the example's way), or
# through Prometheus (its last scrape), to see what that delay costs.
QUEUE_SOURCES = ("triton", "prometheus")
PHASES_TIMEOUT_S = 600.0  # the search and profiling Jobs: ~1.5 min on two busy cores


@dataclass(frozen=True)
class ClusterDemoSettings:
    """The adaptations' knobs and the load; times unscaled unless named scaled."""

    output_dir: Path
    # At 0.1 the operator's 0.1 s ticks and Triton's per-request overhead on two shared cores
    # put the live run 2 points under the simulator's; at 0.25 it is within 0.2 of it.
    time_scale: float = 0.25
    slo_ms: float = 1000.0
    base_qps: float | None = None  # None: beyond the most accurate's capacity, within the fastest's
    duration_s: float = 180.0
    load_seed: int = 0
    warmup_runs: int = 1
    measured_runs: int = 20
    downscale_cooldown_s: float = 20.0
    slack_buffer_ms: float = 50.0
    queue_from: str = "triton"
    # Late binding (issue 43) instead of Elastico's whole-workflow switching: the workflow's
    # serving.binding per stage with the lag cap, admission without the wait rule, and the
    # local router gated (BINDING_ROUTER_INSTANCES instances, BINDING_PIPELINE_SLOTS slot).
    late_binding: bool = False
    binding_lag_share: float = BINDING_LAG_SHARE
    binding_lag_reserve: int = BINDING_LAG_RESERVE

    @property
    def titles(self) -> dict[str, str]:
        """Each run's title: the operator's policy named by what decides."""
        return BINDING_TITLES if self.late_binding else TITLES


# ---------------------------------------------------------------------------- pure helpers


def adaptations(
    example: dict[str, Any], settings: ClusterDemoSettings, ledger: str, metrics: dict[str, str]
) -> tuple[dict[str, Any], list[str]]:
    """The shipped example with what this machine needs, and one line per change saying why."""
    manifest = copy.deepcopy(example)
    spec = manifest["spec"]
    scale = settings.time_scale
    notes = []
    if spec["evaluation"]["evaluator"] != {"type": "triton"}:
        raise ValueError(f"{EXAMPLE} changed its evaluator: revisit compass.lab.clusterdemo")
    spec["evaluation"]["evaluator"] = {"type": "replay", "replayConfigMap": ledger}
    notes.append(
        f"search evaluator triton -> replay of rag-sim's own per-question scores (ConfigMap "
        f"{ledger}): the same verdicts; through Triton its ~13,700 sequential requests take "
        "~7 minutes here"
    )
    spec["slo"]["latencyMs"] = settings.slo_ms * scale
    notes.append(
        f"slo.latencyMs {settings.slo_ms:g} -> {settings.slo_ms * scale:g}: rag-sim "
        f"serves its latencies x{scale:g}"
    )
    spec["profiling"].update(warmupRuns=settings.warmup_runs, measuredRuns=settings.measured_runs)
    notes.append(
        f"profiling {settings.warmup_runs} + {settings.measured_runs} requests a configuration "
        "(shipped 3 + 50: ~2 minutes for the 33 feasible ones on two cores)"
    )
    if "metrics" in spec["serving"]:
        raise ValueError(f"{EXAMPLE} names serving.metrics: revisit compass.lab.clusterdemo")
    spec["serving"]["metrics"] = dict(metrics)
    if metrics["type"] == "triton":
        notes.append(
            f"serving.metrics -> Triton's /metrics at {metrics['url']}: the example reads every "
            "pod's at each tick on the Service's metrics port; this machine's one Triton has "
            "its own port"
        )
    else:
        notes.append(
            f"serving.metrics -> Prometheus at {metrics['url']}, scraping Triton every "
            f"{PROMETHEUS_SCRAPE_S:g} s (--queue-from prometheus: the policy acts on the last "
            "scrape)"
        )
    spec["serving"]["intervalSeconds"] = scale
    notes.append(
        f"serving.intervalSeconds 1 -> {scale:g}: a decision every second of the paper's time "
        "(the operator's timer ticks as often)"
    )
    spec["serving"]["hysteresis"] = {
        "downscaleCooldownSeconds": settings.downscale_cooldown_s * scale,
        "cooldownExponent": 0,
        "slackBufferMs": settings.slack_buffer_ms * scale,
    }
    notes.append(
        f"serving.hysteresis: cooldown {settings.downscale_cooldown_s * scale:g} s with exponent "
        f"0, slack buffer {settings.slack_buffer_ms * scale:g} ms (the defaults are for unscaled "
        "time)"
    )
    if settings.late_binding:
        notes += late_binding_adaptations(spec, settings)
    return manifest, notes


def late_binding_serving(lag_share: float, lag_reserve: int) -> dict[str, Any]:
    """The serving settings --late-binding gives the workflow (camelCase): rag-sim's three
    stages bound per request with this lag cap, admission without the wait rule."""
    return {
        "binding": {
            "mode": "per-stage",
            "stages": [
                {"component": component, "parameters": list(names), "share": share}
                for component, names, share in zip(
                    RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS, RAG_SIM_SHARES, strict=True
                )
            ],
            "lagShare": lag_share,
            "lagReserve": lag_reserve,
        },
        "admission": {"enabled": True, "degradeAfter": 1},
    }


def late_binding_adaptations(spec: dict[str, Any], settings: ClusterDemoSettings) -> list[str]:
    """--late-binding: the workflow's serving.binding and admission (changed in ``spec``), and
    the local router's gate; one line each saying why."""
    serving = spec["serving"]
    for key in ("binding", "admission", "routerInstances"):
        if key in serving:
            raise ValueError(f"{EXAMPLE} names serving.{key}: revisit compass.lab.clusterdemo")
    space = {p["name"] for p in spec["space"]["parameters"]}
    bound = {name for names in RAG_SIM_STAGE_PARAMS for name in names}
    if bound != space:
        raise ValueError(
            f"{EXAMPLE}'s parameters {sorted(space)} are not rag-sim's stages' {sorted(bound)}: "
            "revisit compass.lab.clusterdemo"
        )
    serving.update(late_binding_serving(settings.binding_lag_share, settings.binding_lag_reserve))
    described = "; ".join(
        f"{component}: {', '.join(names)}"
        for component, names in zip(RAG_SIM_COMPONENTS, RAG_SIM_STAGE_PARAMS, strict=True)
    )
    return [
        f"serving.binding per-stage ({described}), lagShare {settings.binding_lag_share:g}, "
        f"lagReserve {settings.binding_lag_reserve}: the routers bind each request stage by "
        "stage from the table the operator sends with every switch, a request's extra time "
        f"leaving it at most {settings.binding_lag_share:g} x (SLO - "
        f"{settings.binding_lag_reserve} fastest services) behind static fastest's schedule (the "
        "stages' shares only where the profiles lack component times)",
        "serving.admission enabled, degradeAfter 1: what is late whatever serves it is refused "
        "at the first stage; no wait rule (the lag cap replaces it)",
        f"the local router: {BINDING_ROUTER_INSTANCES} instances, compass_pipeline_slots "
        f'"{BINDING_PIPELINE_SLOTS}" (the gate): requests are taken up as they arrive and wait '
        "at the gate, seen there with their deadlines; a request without one (the load sends "
        "none) gets its take-up + the SLO; the pod still serves one at a time",
    ]


def replay_ledger(rag_sim: dict[str, Any]) -> str:
    """rag-sim's recorded per-question scores as a replay ledger, rounded as Triton returns them
    (the generator's SCORE output is float32)."""
    lines = [
        {"config": json.loads(key), "scores": [float(np.float32(s)) for s in entry["scores"]]}
        for key, entry in rag_sim["configs"].items()
    ]
    return "".join(json.dumps(line) + "\n" for line in lines)


def unscaled_plan(spec: ParetoPolicySpec, scale: float) -> tuple[Plan, tuple[LatencyProfile, ...]]:
    """The policy's plan at the paper's scale (the front's times and the SLO divided by scale)."""
    profiles = tuple(p.scaled(1 / scale) for p in latency_profiles(spec))
    plan = plan_from_profiles(
        profiles,
        Slo(spec.slo.latency_ms / scale, spec.slo.percentile),
        spec.hysteresis.slack_buffer_ms / scale,
        spec.threshold_model,
        spec.switch_delay_ms / scale,
        spec.router_instances,
    )
    return plan, profiles


def unscaled_policy(spec: ParetoPolicySpec, plan: Plan, scale: float) -> Policy:
    """The policy (its strategy, cooldowns and staleness) as the simulator runs it at the
    paper's scale."""
    settings = elastico_settings(spec)
    unscaled = replace(
        settings,
        upscale_cooldown_s=settings.upscale_cooldown_s / scale,
        downscale_cooldown_s=settings.downscale_cooldown_s / scale,
        stale_after_s=settings.stale_after_s / scale,
    )
    return build_policy(spec.strategy, plan, unscaled, spec.forecaster)


@dataclass(frozen=True)
class StartingOn:
    """A policy whose first state serves front member ``index``: the live run starts where the
    idle policy climbed to (the most accurate eligible member), so the prediction beside it
    starts there too, not on the fastest where a fresh policy would."""

    policy: Policy
    index: int

    def initial_state(self, now: float) -> PolicyState:
        """The policy's own initial state, on ``index``."""
        return replace(
            self.policy.initial_state(now),
            active=self.policy.plan.names[self.index],
            last_reason="initial: where the live run starts",
        )

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        """The policy's own decision."""
        return self.policy.decide(observation, state, now)


def unscaled_admission(spec: ParetoPolicySpec, scale: float) -> Admission | None:
    """The routers' admission at the paper's scale, None where the policy has none."""
    if not spec.admission.enabled:
        return None
    rule = admission_rule(spec)
    return replace(rule, slo_ms=rule.slo_ms / scale)


def binding_prediction(
    spec: ParetoPolicySpec,
    plan: Plan,
    profiles: Sequence[LatencyProfile],
    scenario: Scenario,
    slo_ms: float,
    scale: float,
) -> RunReport:
    """The simulator's late binding on the same arrivals at the paper's scale: the routers'
    table for the unscaled plan (its rate limits at the paper's rates), on what the gated
    routers see (compass.conversion.simulated_binding; their 25 ms poll, unscaled)."""
    table = binding_table(spec, plan)
    if table is None:
        raise ValueError("the policy has no per-stage binding to predict")
    shares = [stage.share for stage in spec.binding.stages]
    return simulate_binding(
        profiles,
        scenario,
        slo_ms,
        "policy",
        stages=[tuple(stage.parameters) for stage in spec.binding.stages],
        prior_shares=None if None in shares else [s for s in shares if s is not None],
        settings=simulated_binding(
            spec, table, BINDING_ROUTER_INSTANCES, BINDING_PIPELINE_SLOTS, ROUTER_POLL_S / scale
        ),
        pod_model=PodModel(servers=BINDING_PIPELINE_SLOTS),
    )


def gap_share(run: LiveRun, front: Sequence[LatencyProfile]) -> float:
    """The run's served accuracy as a share (%) of the fastest-to-most-accurate gap of the
    ``front`` (fastest first); nan where the front has no gap."""
    fastest = front[0].accuracy
    gap = max(p.accuracy for p in front) - fastest
    return 100 * (run.served_accuracy(front) - fastest) / gap if gap > 0 else float("nan")


def floor_verdict(runs: dict[str, LiveRun], front: Sequence[LatencyProfile], title: str) -> str:
    """One line: the operator's policy's share of the gap, its compliance against static
    fastest's, and whether that meets issue 42's floor (GAP_FLOOR_PCT of the gap within
    COMPLIANCE_SLACK_POINTS of static fastest)."""
    policy, fastest = runs["policy"], runs["fastest"]
    share = gap_share(policy, front)
    ahead = policy.compliance - fastest.compliance
    met = share >= GAP_FLOOR_PCT and ahead >= -COMPLIANCE_SLACK_POINTS
    return (
        f"  share of the fastest-to-accurate gap (served accuracy): {title} {share:.0f}% at "
        f"{ahead:+.1f} points of compliance against static fastest; issue 42's floor (>= "
        f"{GAP_FLOOR_PCT:g}% at >= static fastest - {COMPLIANCE_SLACK_POINTS:.1f} points) "
        f"{'met' if met else 'not met'}"
    )


def served_mix(run: LiveRun, plan: Plan) -> dict[int, int]:
    """How many answered requests each front member served, by its index (fastest 0)."""
    index_of = {t.profile.key: i for i, t in enumerate(plan.thresholds)}
    mix: dict[int, int] = {}
    for record in run.answered:
        if record.config:
            index = index_of[config_key(json.loads(record.config))]
            mix[index] = mix.get(index, 0) + 1
    return dict(sorted(mix.items()))


def table_lines(
    table: dict[str, Any], plan: Plan, scale: float, quantile: float, measured: bool
) -> list[str]:
    """The routers' late-binding table, read back from the router, at the paper's scale."""
    lag = (
        "no lag cap"
        if table["lag_share"] is None
        else f"lag cap {table['lag_share']:g} (reserve {table['lag_reserve']})"
    )
    wait = (
        "no wait rule"
        if table["degrade_after"] is None
        else f"wait rule {table['degrade_after']:g}"
    )
    split = "the profiled component times" if measured else "the fit"
    lines = [
        f"      the router holds the operator's late-binding table: stages "
        f"{' | '.join(', '.join(s) for s in table['stages'])}, SLO {table['slo_ms'] / scale:g} "
        f"ms, {lag}, {wait}, refuse {str(table['refuse']).lower()}; per-stage ms at quantile "
        f"{quantile:g} (split by {split}) and the rate limit:"
    ]
    names = {t.profile.key: (i, t.profile.name) for i, t in enumerate(plan.thresholds)}
    for entry in table["configs"]:
        index, name = names[entry["config"]]
        limit = entry["max_qps"]
        lines.append(
            f"        #{index} {name:<28} accuracy {entry['accuracy']:.4f}  "
            + " / ".join(f"{ms / scale:6.1f}" for ms in entry["stage_ms"])
            + ("  no limit" if limit is None else f"  <= {limit * scale:.2f}/s")
        )
    return lines


def status_ticks(
    samples: Sequence[tuple[float, dict[str, Any]]],
    offered: Callable[[float], float],
    sent_s: Sequence[float],
    scale: float,
) -> tuple[Tick, ...]:
    """Timeline ticks from the policy's status read during a run (sample times scaled, from the
    load's start; the last sample before it gives the state at 0). The queue depth is the
    sample's (_Sampler: Triton's at the sample); the observed rate is the load's own over
    OBSERVED_WINDOW_S."""
    sent = np.sort(np.asarray(sent_s, dtype=np.float64))
    started = [i for i, (at, _) in enumerate(samples) if at < 0]
    kept = samples[started[-1] :] if started else samples
    ticks = []
    previous = None
    for at, status in kept:
        active = (status.get("active") or {}).get("index")
        if active is None:
            continue
        unscaled = max(at, 0.0) / scale
        window = min(OBSERVED_WINDOW_S, unscaled)
        count = np.searchsorted(sent, unscaled, "right") - np.searchsorted(sent, unscaled - window)
        ticks.append(
            Tick(
                time_s=unscaled,
                offered_qps=offered(unscaled),
                observed_qps=float(count) / window if window > 0 else float("nan"),
                queue_depth=int(status.get("lastQueueDepth") or 0),
                active=int(active),
                switched=previous is not None and active != previous,
            )
        )
        previous = active
    return tuple(ticks)


def served_ticks(ticks: Sequence[Tick], run: LiveRun, plan: Plan) -> tuple[Tick, ...]:
    """With late binding, each tick's configuration is the front member that served most of
    the requests sent over the OBSERVED_WINDOW_S before it (the routers choose per request, so
    the policy's active configuration is not what served them); a tick with none keeps the
    last one's."""
    index_of = {t.profile.key: i for i, t in enumerate(plan.thresholds)}
    served = sorted(
        (r.sent_s, index_of[config_key(json.loads(r.config))]) for r in run.answered if r.config
    )
    sent = np.array([at for at, _ in served])
    members = np.array([index for _, index in served], dtype=np.int64)
    out: list[Tick] = []
    for tick in ticks:
        low, high = np.searchsorted(sent, [tick.time_s - OBSERVED_WINDOW_S, tick.time_s], "right")
        counts = np.bincount(members[low:high], minlength=len(plan.thresholds))
        previous = out[-1].active if out else tick.active
        active = int(np.argmax(counts)) if counts.sum() else previous
        out.append(replace(tick, active=active, switched=bool(out) and active != previous))
    return tuple(out)


def status_switches(ticks: Sequence[Tick], plan: Plan) -> tuple[SwitchEvent, ...]:
    """The switches the status showed (the reload's cost is the operator's, not seen here)."""
    return tuple(
        SwitchEvent(t.time_s, config_key(plan.thresholds[t.active].profile.config), 0.0)
        for t in ticks
        if t.switched
    )


def by_third(run: LiveRun, duration_s: float) -> str:
    """SLO compliance before, during and after the spike (by when each request was sent)."""
    parts = []
    for k in range(3):
        low, high = k * duration_s / 3, (k + 1) * duration_s / 3 if k < 2 else float("inf")
        part = [r for r in run.records if low <= r.sent_s < high]
        within = sum(1 for r in part if r.error is None and r.latency_s * 1000 <= run.slo_ms)
        parts.append(f"{100 * within / max(len(part), 1):.0f}%")
    return " / ".join(parts)


# ---------------------------------------------------------------------------- the cluster


@dataclass
class Kube:
    """The demo's view of its cluster: kubectl for what a user would type, the client to poll."""

    cluster: Cluster
    namespace: str
    api: Any = None
    say: Callable[[str], None] = print
    _custom: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:

        self.api = self.cluster.api_client()
        self._custom = client.CustomObjectsApi(self.api)

    def kubectl(self, *args: str, input: str | None = None) -> str:
        """Run kubectl in the demo's namespace; its output."""
        return self.cluster.kubectl("-n", self.namespace, *args, input=input).stdout

    def show(self, *args: str) -> None:
        """Print a kubectl command and its output, indented, as a user would see them."""
        self.say(f"      $ kubectl {' '.join(args)}")
        for line in self.kubectl(*args).splitlines():
            self.say(f"        {line}")

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        """A compass.io object, or None while it does not exist."""

        found: dict[str, Any] | None = kubeapi.read(
            self._custom.get_namespaced_custom_object, GROUP, VERSION, self.namespace, plural, name
        )
        return found

    def status(self, plural: str, name: str) -> dict[str, Any]:
        """An object's status ({} while it has none)."""
        return dict((self.get(plural, name) or {}).get("status") or {})

    def patch_policy(self, name: str, spec: dict[str, Any]) -> None:
        """Merge-patch the ParetoPolicy's spec (paused: `kubectl patch pp NAME --type=merge -p
        '{"spec":{"paused":true}}'`)."""
        self.kubectl("patch", "pp", name, "--type=merge", "-p", json.dumps({"spec": spec}))


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    """The condition of this type in a status as read from the server (camelCase), or {}."""
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every child is stopped on the way out."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _error(message: str) -> int:
    print(f"compass demo --cluster: error: {message}", file=sys.stderr)
    return 1


def run_cluster_demo(settings: ClusterDemoSettings, say: Reporter | None = None) -> int:
    """Every step; 0 when done, 1 when this machine cannot run it (the message says why)."""
    say = say or Reporter(steps=8)
    # Resolved once, here: these paths reach processes that run in other directories (the API
    # server's flags from the control plane's folder, the pods' KUBECONFIG from theirs).
    settings = replace(settings, output_dir=settings.output_dir.resolve())
    try:
        TritonInstallation.find()
    except LocalServerError as error:
        return _error(
            f"no tritonserver here ({error}); install it with pip install "
            "'compass-operator[local]' (hack/demo.sh does)"
        )
    out = settings.output_dir
    out.mkdir(parents=True, exist_ok=True)
    say.say(
        f"compass demo --cluster{' --late-binding' if settings.late_binding else ''}: "
        "examples/rag-sim-workflow.yaml through the operator on a local Kubernetes API server"
        f"{', served with late binding' if settings.late_binding else ''}, into {shown(out)}/ "
        f"(rag-sim's latencies x{settings.time_scale:g}; every figure below is at the paper's "
        "scale)"
    )
    say.step("the control plane binaries (hack/k8s/build.sh: cached after the first build)")
    try:
        binaries = ensure_binaries(stream=sys.stderr)
    except ClusterUnavailableError as error:
        return _error(f"no Kubernetes control plane on this machine: {error}")
    except ClusterError as error:
        return _error(str(error))
    say.say(
        f"      kube-apiserver, kube-controller-manager, kubectl in "
        f"{binaries.kubectl.parent} ({say.took()})"
    )
    try:
        with _sigterm_interrupts(), contextlib.ExitStack() as stack:
            return _run(settings, say, binaries, stack)
    except (ClusterError, LocalServerError, TimeoutError) as error:
        # Everything it started is stopped by now; the logs stay in the work directory.
        return _error(f"{error} (logs under {out / 'cluster'})")


def _run(
    settings: ClusterDemoSettings, say: Reporter, binaries: Any, stack: contextlib.ExitStack
) -> int:
    """Steps 2-8, every child process registered on ``stack`` as soon as it runs."""

    out, scale = settings.output_dir, settings.time_scale
    work = out / "cluster"

    say.step(
        "start the control plane (etcd, kube-apiserver 1.20, kube-controller-manager) and the "
        "node helper"
    )
    cluster = Cluster(binaries, work / "k8s")
    stack.callback(cluster.stop)
    cluster.start()
    compass = venv_executable("compass")
    images = {
        "compass-operator": LocalImage(entrypoint=[compass], executables={"compass": compass})
    }
    # The node runs the Jobs' pods as local processes, with this cluster's kubeconfig.
    node = Node(cluster.api_client(), work / "node", images=images, env=cluster.env())
    stack.callback(node.stop)
    node.start()
    kube = Kube(cluster, NAMESPACE, say=say.say)
    cluster.kubectl("create", "namespace", NAMESPACE)
    wait_for(lambda: _has_token(cluster), 60, f"the default service account of {NAMESPACE}")
    say.say(
        f"      Kubernetes {cluster.request('/version')['gitVersion']} at {cluster.server}; "
        f"KUBECONFIG={cluster.kubeconfig} ({say.took()})"
    )

    say.step(
        "start tritonserver with rag-sim"
        + (", and Prometheus scraping it" if settings.queue_from == "prometheus" else "")
    )
    triton = (
        rag_sim_triton(
            work / "triton",
            scale,
            router_instances=BINDING_ROUTER_INSTANCES,
            pipeline_slots=BINDING_PIPELINE_SLOTS,
        )
        if settings.late_binding
        else rag_sim_triton(work / "triton", scale)
    )
    stack.callback(triton.stop)
    triton.start(work / "triton")
    metrics = {"type": "triton", "url": triton.metrics_url}
    if settings.queue_from == "prometheus":
        prometheus_binary()  # LocalServerError, saying how to install it, when missing
        prometheus = LocalPrometheus(
            targets=[f"127.0.0.1:{triton.metrics_port}"], interval_s=PROMETHEUS_SCRAPE_S
        )
        stack.callback(prometheus.stop)
        (work / "prometheus").mkdir(parents=True, exist_ok=True)
        prometheus.start(work / "prometheus")
        metrics = {"type": "prometheus", "url": prometheus.url}
    say.say(
        f"      Triton at {triton.grpc_url}; metrics: {metrics['type']} at {metrics['url']} "
        f"({say.took()})"
    )

    say.step("start `compass operator` watching the namespace, and `kubectl apply` the CRDs")
    operator = Operator(
        cluster,
        NAMESPACE,
        work / "operator.log",
        env={
            # The example names an in-cluster Service (rag-sim-triton) that does not exist here.
            "COMPASS_TRITON_ADDRESS_OVERRIDE": triton.grpc_url,
            "COMPASS_POLL_INTERVAL_SECONDS": "0.5",
            # The policy's timer ticks as often as the adapted intervalSeconds asks.
            "COMPASS_POLICY_TICK_SECONDS": f"{max(scale, 0.05):g}",
        },
    )
    stack.callback(operator.stop)
    # kubectl 1.20 validates a CRD against its own schema, which predates the CEL rules; the API
    # server accepts the file and drops them.
    say.say(f"      $ kubectl apply --validate=false -f {CRDS}")
    cluster.kubectl("apply", "--validate=false", "-f", str(CRDS))
    for plural in (WORKFLOW_PLURAL, POLICY_PLURAL):
        cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=30s", f"crd/{plural}.{GROUP}"
        )
    operator.start()
    say.say(f"      operator up, its log in {operator.log} ({say.took()})")

    say.step("kubectl apply the example workflow, adapted to this machine; watch it")
    example = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    name = example["metadata"]["name"]
    manifest, notes = adaptations(example, settings, LEDGER_CONFIG_MAP, metrics)
    for note in notes:
        say.say(f"      - {note}")
    ledger = out / "replay-ledger.jsonl"
    ledger.write_text(replay_ledger(rag_sim_data()), encoding="utf-8")
    workflow = out / "workflow.yaml"
    workflow.write_text(yaml.safe_dump(manifest, sort_keys=False), encoding="utf-8")
    kube.kubectl("create", "configmap", LEDGER_CONFIG_MAP, f"--from-file={LEDGER_KEY}={ledger}")
    say.say(f"      $ kubectl apply -f {workflow}")
    kube.kubectl("apply", "-f", str(workflow))
    _watch_phases(kube, name, say)

    say.step("the operator's ParetoPolicy: its front, and the climb while idle")
    policy = kube.get(POLICY_PLURAL, name)
    assert policy is not None, "Ready without a policy"
    spec = ParetoPolicySpec.model_validate(policy["spec"])
    plan, front_profiles = unscaled_plan(spec, scale)
    state = _state(kube, name)
    profiles_document = json.loads(state[PROFILES_KEY])
    all_profiles = tuple(p.scaled(1 / scale) for p in parse_profiles(profiles_document))
    write_json(out / "profiles.json", profiles_document)
    write_json(out / "search-result.json", json.loads(state[RESULT_KEY]))
    write_file(out / "policy.yaml", yaml.safe_dump(policy, sort_keys=False))
    save_plan_figure(out / "front.png", plan, all_profiles)
    say.say(plan_table(plan))
    top = wait_for(lambda: _climbed(kube, name), 60, "the policy to climb while idle", 0.2)
    say.say(
        f"      idle: the operator serves #{top} ({plan.thresholds[top].profile.name}) "
        f"({say.took()})"
    )
    if settings.late_binding:
        table = wait_for(
            lambda: triton.router_table("binding"),
            60,
            "the operator's late-binding table on the router",
            0.2,
        )
        measured = (
            measured_stage_times(
                [t.profile for t in plan.thresholds], [s.models for s in spec.binding.stages]
            )
            is not None
        )
        for line in table_lines(table, plan, scale, spec.binding.quantile, measured):
            say.say(line)

    scenario = spike_scenario(plan, settings.duration_s, settings.load_seed, settings.base_qps)
    say.step(
        f"serve a load spike three ways: {scenario.pattern.base_qps:.2f} QPS, x{SPIKE_FACTOR:g} "
        f"for the middle third, {settings.duration_s:g} s, {scenario.requests} requests (the "
        "same every time)"
    )
    runs = _serve_three_ways(
        kube,
        name,
        triton,
        plan,
        scenario,
        top,
        settings,
        say,
        # The policy's requests carry the SLO as their deadline where it admits (a gateway
        # that owns the SLO); behind the gate late binding needs none (client-free).
        spec.admission.enabled and not settings.late_binding,
    )
    kube.show("get", "cwf,pp")

    say.step("compare (the simulator's prediction on the same arrivals beside each run)")
    # The simulator sees the queue as the policy did: at the tick, or as Prometheus scraped it.
    views = {"triton": FRESH, "prometheus": MetricsView(PROMETHEUS_SCRAPE_S / scale)}
    predictions = {
        source: compare(
            # The live run starts on `top`, where the idle policy climbed to.
            {"policy": StartingOn(unscaled_policy(spec, plan, scale), top)},
            front_profiles,
            scenario,
            settings.slo_ms,
            spec.interval_seconds / scale,
            admission=unscaled_admission(spec, scale),
            metrics_view=view,
        )
        for source, view in views.items()
    }
    predicted = predictions[settings.queue_from]
    titles = settings.titles
    if settings.late_binding:
        # The routers bind, not the policy: the prediction is the binding simulator's.
        predicted = {
            **predicted,
            "policy": binding_prediction(
                spec, plan, front_profiles, scenario, settings.slo_ms, scale
            ),
        }
    rows = comparison_rows(runs, predicted, front_profiles, titles)
    for row, run in zip(rows, runs.values(), strict=True):
        row["gap_share_pct"] = round(gap_share(run, front_profiles), 1) + 0.0  # never -0.0
    say.say(comparison_text(rows))
    if settings.late_binding:
        say.say(
            "  the simulator's late binding (compass.domain.bindingsim on the gated routers' "
            f"view, the table's own numbers): {predicted['policy'].compliance:.1f}% within the "
            f"SLO, served accuracy {predicted['policy'].mean_accuracy:.4f}"
        )
    else:
        read = {
            "triton": "from Triton at each tick",
            "prometheus": f"at Prometheus' last scrape (every {PROMETHEUS_SCRAPE_S / scale:g} s)",
        }
        other = next(source for source in QUEUE_SOURCES if source != settings.queue_from)
        say.say(
            f"  the simulator's policy, the queue read {read[settings.queue_from]} (as here): "
            f"{predicted['policy'].compliance:.1f}% within the SLO; read {read[other]}: "
            f"{predictions[other]['policy'].compliance:.1f}%"
        )
    for label, run in runs.items():
        say.say(
            f"  {titles[label]:<23} before / during / after the spike: "
            f"{by_third(run, settings.duration_s)}"
        )
    say.say(floor_verdict(runs, front_profiles, titles["policy"]))
    # The switches as the status showed them: the reload's cost is the operator's, not seen here.
    switches = [
        {"time_s": round(e.time_s, 2), "config": e.config} for e in runs["policy"].switch_events
    ]
    slo = Slo(settings.slo_ms, spec.slo.percentile)
    document = comparison_document(
        scenario, slo, scale, rows, switches, metrics=metrics, adaptations=notes
    )
    write_json(out / "comparison.json", document)
    save_timeline_figure(
        out / "timeline.png",
        plan,
        runs,
        f"rag-sim through compass operator on Kubernetes: spike at "
        f"{scenario.pattern.base_qps:.2f} QPS x{SPIKE_FACTOR:g}, SLO p{spec.slo.percentile:g} <= "
        f"{settings.slo_ms:g} ms, {scenario.requests} requests",
        profiles=all_profiles,
    )
    who = "the operator's late binding" if settings.late_binding else "the operator"
    say.say(verdict(runs, front_profiles, who))
    say.say(f"wrote {shown(out)}/: {', '.join(OUTPUTS)}; logs under {shown(work)}")
    prometheus_too = ", Prometheus" if settings.queue_from == "prometheus" else ""
    say.say(f"stopping the operator{prometheus_too}, Triton, the node and the control plane")
    stack.close()
    say.say(f"done in {time.monotonic() - say.started:.0f} s")
    return 0


OUTPUTS = (
    "timeline.png",
    "front.png",
    "comparison.json",
    "workflow.yaml",
    "policy.yaml",
    "profiles.json",
    "search-result.json",
)


def _has_token(cluster: Cluster) -> bool:
    """The demo namespace's default service account has its token (pods can be admitted)."""
    try:
        account = cluster.request(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
    except OSError:
        return False
    return bool(account.get("secrets"))


def _watch_phases(kube: Kube, name: str, say: Reporter) -> None:
    """`kubectl get cwf,pp` each time the workflow's phase changes, until Ready."""
    seen = None
    deadline = time.monotonic() + PHASES_TIMEOUT_S
    while True:
        status = kube.status(WORKFLOW_PLURAL, name)
        phase = status.get("phase", "Pending")
        if phase != seen:
            say.say(f"      phase {phase} after {say.took()}")
            kube.show("get", "cwf,pp")
            seen = phase
        if phase == "Ready":
            return
        if phase == "Failed" or time.monotonic() > deadline:
            kube.show("get", "cwf,pp,jobs,pods")
            raise ClusterError(
                f"the workflow is {phase} after {say.took()}: "
                f"{json.dumps(status.get('conditions'), indent=1)}"
            )
        time.sleep(0.5)


def _state(kube: Kube, name: str) -> dict[str, str]:
    """The data of the workflow's state ConfigMap (its result and profiles; the ledger's
    chunk ConfigMaps, labelled CHUNK_OF_LABEL, are left out)."""
    selector = f"compass.io/workflow={name},!{CHUNK_OF_LABEL}"
    listing = json.loads(kube.kubectl("get", "configmaps", "-l", selector, "-o", "json"))
    [state] = listing["items"]
    data: dict[str, str] = state["data"]
    return data


def _climbed(kube: Kube, name: str) -> int | None:
    """The index the idle policy rests on once it reads metrics and has climbed, else None."""
    status = kube.status(POLICY_PLURAL, name)
    thresholds = status.get("thresholds") or []
    eligible = [
        i for i, t in enumerate(thresholds) if t["eligible"] and t.get("enterMaxQueue") is not None
    ]
    active = (status.get("active") or {}).get("index")
    if not eligible or condition(status, "MetricsAvailable").get("status") != "True":
        return None
    return active if active == max(eligible) else None


@dataclass
class _Sampler:
    """Reads the policy's status every SAMPLE_EVERY_S while a run's load goes through, with
    the router's queue read from Triton then (the status writes the queue it saw only with a
    switch or at its heartbeat, so that policies under load do not write every tick)."""

    kube: Kube
    name: str
    origin: float
    queue: TritonQueueDepth
    samples: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(Exception):  # a missed sample is a gap, not a failure
                status = self.kube.status(POLICY_PLURAL, self.name)
                status["lastQueueDepth"] = self.queue.queue_depth()
                self.samples.append((time.monotonic() - self.origin, status))
            self.stop.wait(SAMPLE_EVERY_S)


def _serve_three_ways(
    kube: Kube,
    name: str,
    triton: LocalTriton,
    plan: Plan,
    scenario: Scenario,
    top: int,
    settings: ClusterDemoSettings,
    say: Reporter,
    deadlines: bool,
) -> dict[str, LiveRun]:
    """The spike with the operator switching the router (with late binding: its routers binding
    each request), then on the most accurate and on the fastest configuration with the policy
    paused (and its binding and admission off). With ``deadlines`` the policy's requests carry the SLO as
    their deadline, as a gateway that owns the SLO would send them; the static runs serve
    everything."""
    scale, titles = settings.time_scale, settings.titles
    load = RagSimLoad(scenario)
    arrivals = load.arrivals_s(scale)
    router = TritonRouter(triton.grpc_url)
    try:
        before = kube.status(POLICY_PLURAL, name).get("switches") or 0
        started = time.monotonic()
        # serve() waits SETTLE_S after its switch before the load's clock starts: the status
        # samples share the load's origin to a few ms.
        sampler = _Sampler(
            kube, name, started + SETTLE_S, TritonQueueDepth(triton.metrics_url, timeout_s=0.5)
        )
        thread = threading.Thread(target=sampler.run, daemon=True)
        thread.start()
        try:
            # No switch of the demo's own: the router serves what the operator set, with the
            # tables the operator sent (a switch from here would send none).
            run = serve(
                router,
                "policy",
                None,
                arrivals,
                load.payload,
                settings.slo_ms,
                time_scale=scale,
                deadlines=deadlines,
            )
        finally:
            sampler.stop.set()
            thread.join()
        ticks = status_ticks(
            sampler.samples, load.offered_qps, [r.sent_s for r in run.records], scale
        )
        # The switches are the operator's (as its status showed them); with late binding the
        # timeline draws what served the requests, not what the policy held.
        drawn = served_ticks(ticks, run, plan) if settings.late_binding else ticks
        runs = {"policy": replace(run, ticks=drawn, switch_events=status_switches(ticks, plan))}
        after = kube.status(POLICY_PLURAL, name).get("switches") or 0
        if settings.late_binding:
            mix = ", ".join(f"#{i} {n}" for i, n in served_mix(run, plan).items())
            what = f"requests bound to {mix}, {run.refused} refused"
        else:
            what = f"configurations {sorted({t.active for t in ticks})}"
        say.say(
            f"      {titles['policy']:<23} {run.compliance:5.1f}% within the SLO, accuracy "
            f"{run.accuracy:.4f}, {after - before} switches by the operator, {what} "
            f"({time.monotonic() - started:.0f} s)"
        )
        # Paused, the operator holds the routing at every tick and sends its tables with it:
        # with late binding on, the static runs would be bound too, and behind the gate a
        # request without a deadline is admitted (its take-up plus the SLO): both off.
        patch: dict[str, Any] = {"paused": True}
        if settings.late_binding:
            patch.update(binding={"mode": "workflow"}, admission={"enabled": False})
        typed = json.dumps({"spec": patch}, separators=(",", ":"))
        say.say(f"      $ kubectl patch pp {name} --type=merge -p '{typed}'")
        kube.patch_policy(name, patch)
        wait_for(
            lambda: condition(kube.status(POLICY_PLURAL, name), "Paused").get("status") == "True",
            30,
            "the policy to be Paused",
            0.2,
        )
        if settings.late_binding:
            wait_for(
                lambda: (
                    triton.router_table("binding") is None
                    and triton.router_table("admission") is None
                ),
                30,
                "the operator to take its late-binding and admission tables off the router",
                0.2,
            )
        # The same arrivals on each end of the front, pinned while the policy is paused.
        for label, index in (("accurate", len(plan.thresholds) - 1), ("fastest", 0)):
            started = time.monotonic()
            pinned = serve(
                router,
                label,
                plan.thresholds[index].profile.config,
                arrivals,
                load.payload,
                settings.slo_ms,
                time_scale=scale,
            )
            runs[label] = pinned
            say.say(
                f"      {titles[label]:<23} {pinned.compliance:5.1f}% within the SLO, "
                f"accuracy {pinned.accuracy:.4f} ({time.monotonic() - started:.0f} s)"
            )
    finally:
        router.close()
    # In the local demo's order: the static ends first, the policy last.
    return {label: runs[label] for label in ("fastest", "accurate", "policy")}
