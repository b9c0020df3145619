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
from compass.conversion import admission_rule, elastico_settings, latency_profiles
from compass.dataplane.metrics import TritonQueueDepth
from compass.dataplane.triton import TritonRouter
from compass.domain.admission import Admission
from compass.domain.arrivals import SPIKE_FACTOR, Scenario
from compass.domain.elastico import Decision, Observation, PolicyState
from compass.domain.planner import Plan, Slo, plan_from_profiles
from compass.domain.profiles import LatencyProfile, parse_profiles
from compass.domain.simulator import FRESH, MetricsView, Tick, compare
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
    return manifest, notes


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

    def pause(self, name: str) -> None:
        """Pause the ParetoPolicy: `kubectl patch pp NAME -p '{"spec":{"paused":true}}'`."""
        self.kubectl(
            "patch", "pp", name, "--type=merge", "-p", json.dumps({"spec": {"paused": True}})
        )


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
        f"compass demo --cluster: examples/rag-sim-workflow.yaml through the operator on a local "
        f"Kubernetes API server, into {shown(out)}/ (rag-sim's latencies x{settings.time_scale:g}; every "
        "figure below is at the paper's scale)"
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
    triton = rag_sim_triton(work / "triton", scale)
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

    scenario = spike_scenario(plan, settings.duration_s, settings.load_seed, settings.base_qps)
    say.step(
        f"serve a load spike three ways: {scenario.pattern.base_qps:.2f} QPS, x{SPIKE_FACTOR:g} "
        f"for the middle third, {settings.duration_s:g} s, {scenario.requests} requests (the "
        "same every time)"
    )
    runs = _serve_three_ways(
        kube, name, triton, plan, scenario, top, settings, say, spec.admission.enabled
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
    rows = comparison_rows(runs, predicted, front_profiles, TITLES)
    say.say(comparison_text(rows))
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
            f"  {TITLES[label]:<21} before / during / after the spike: "
            f"{by_third(run, settings.duration_s)}"
        )
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
    say.say(verdict(runs, front_profiles, "the operator"))
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
    """The spike with the operator switching the router, then on the most accurate and on the
    fastest configuration with the policy paused. With ``deadlines`` (the policy has
    admission) the policy's requests carry the SLO as their deadline, as a gateway that owns
    the SLO would send them; the static runs serve everything."""
    scale = settings.time_scale
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
            # serve() switches to `start` first: the router already serves it (no reload).
            run = serve(
                router,
                "policy",
                plan.thresholds[top].profile.config,
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
        runs = {"policy": replace(run, ticks=ticks, switch_events=status_switches(ticks, plan))}
        after = kube.status(POLICY_PLURAL, name).get("switches") or 0
        served = sorted({t.active for t in ticks})
        say.say(
            f"      {TITLES['policy']:<21} {run.compliance:5.1f}% within the SLO, accuracy "
            f"{run.accuracy:.4f}, {after - before} switches by the operator, configurations "
            f"{served} ({time.monotonic() - started:.0f} s)"
        )
        say.say(f'      $ kubectl patch pp {name} --type=merge -p \'{{"spec":{{"paused":true}}}}\'')
        kube.pause(name)
        wait_for(
            lambda: condition(kube.status(POLICY_PLURAL, name), "Paused").get("status") == "True",
            30,
            "the policy to be Paused",
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
                f"      {TITLES[label]:<21} {pinned.compliance:5.1f}% within the SLO, "
                f"accuracy {pinned.accuracy:.4f} ({time.monotonic() - started:.0f} s)"
            )
    finally:
        router.close()
    # In the local demo's order: the static ends first, the policy last.
    return {label: runs[label] for label in ("fastest", "accurate", "policy")}
