"""`compass demo --cluster`: the demo through the operator, on a local real Kubernetes API server.

The k8s test tier's control plane (compass_dev.devcluster, compass_dev.devnode), a local
tritonserver serving rag-sim and `compass operator` as a process; `kubectl apply` of the CRDs and
of examples/rag-sim-workflow.yaml, adapted only as far as this machine needs
(compass_dev.clusterdemo_setup, each change printed); then the same seeded spike served by the
operator's policy and, paused, by the most accurate and the fastest configuration, beside the
simulator's prediction (compass_dev.clusterdemo_report). rag-sim runs at ``time_scale``; every
figure printed is unscaled. docs/development.md.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import Any

import yaml
from kubernetes import client

from compass.api.meta import GROUP, POLICY_PLURAL, VERSION, WORKFLOW_PLURAL
from compass.api.paretopolicy import ParetoPolicySpec
from compass.commands.plots import save_plan_figure, save_timeline_figure
from compass.console import plan_table
from compass.controllers import kubeapi
from compass.controllers.builders import LEDGER_KEY, PROFILES_KEY, RESULT_KEY
from compass.controllers.ledgerchunks import CHUNK_OF_LABEL
from compass.dataplane.metrics import TritonQueueDepth
from compass.dataplane.triton import TritonRouter
from compass.domain.arrivals import SPIKE_FACTOR, Scenario
from compass.domain.binding import (
    measured_stage_times,
)
from compass.domain.planner import Plan, Slo
from compass.domain.profiles import parse_profiles
from compass.domain.simulator import FRESH, MetricsView, compare
from compass_dev.clusterdemo_report import (
    StartingOn,
    binding_prediction,
    by_third,
    floor_verdict,
    gap_share,
    served_mix,
    served_ticks,
    status_switches,
    status_ticks,
    table_lines,
    unscaled_admission,
    unscaled_plan,
    unscaled_policy,
)
from compass_dev.clusterdemo_setup import (
    BINDING_PIPELINE_SLOTS,
    BINDING_ROUTER_INSTANCES,
    EXAMPLE,
    PROMETHEUS_SCRAPE_S,
    ClusterDemoSettings,
    adaptations,
    replay_ledger,
)
from compass_dev.devcluster import (
    REPO_ROOT,
    Cluster,
    ClusterError,
    ClusterUnavailableError,
    Operator,
    ensure_binaries,
)
from compass_dev.devnode import Node
from compass_dev.experiment import SETTLE_S, LiveRun, serve
from compass_dev.local_triton import (
    LocalPrometheus,
    LocalServerError,
    LocalTriton,
    TritonInstallation,
    prometheus_binary,
)
from compass_dev.localdemo import (
    Reporter,
    comparison_document,
    comparison_rows,
    comparison_text,
    shown,
    verdict,
    write_file,
    write_json,
)
from compass_dev.podenv import LocalImage
from compass_dev.processes import venv_executable, wait_for
from compass_dev.scenarios import (
    RagSimLoad,
    rag_sim_data,
    rag_sim_triton,
    scaled_profile,
    spike_scenario,
)

CRDS = REPO_ROOT / "crds"
NAMESPACE = "compass-demo"
LEDGER_CONFIG_MAP = "rag-sim-ledger"
SAMPLE_EVERY_S = 0.25  # how often the policy's status is read while the load runs
# Where the policy reads the queue: Triton's /metrics at every tick (the example's way), or
# through Prometheus (its last scrape), to see what that delay costs.
QUEUE_SOURCES = ("triton", "prometheus")
PHASES_TIMEOUT_S = 600.0  # the search and profiling Jobs: ~1.5 min on two busy cores


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
        f"compass demo --cluster{'' if settings.late_binding else ' --whole-workflow'}: "
        "examples/rag-sim-workflow.yaml through the operator on a local Kubernetes API server, "
        f"{'served with late binding' if settings.late_binding else 'whole-workflow switching'}"
        f", into {shown(out)}/ "
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
    all_profiles = tuple(scaled_profile(p, 1 / scale) for p in parse_profiles(profiles_document))
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
        spec.admits and not settings.late_binding,
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
            "  the simulator's late binding (its binding rule on the gated routers' "
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


# How long the demo waits for the policy's status.served to count a run (two heartbeats).
SERVED_WAIT_S = 25.0


def _show_served(kube: Kube, name: str, answered: int) -> None:
    """`kubectl get pp` once status.served counts (nearly) every request of the run just served,
    or after SERVED_WAIT_S: the routers' own count of what they served, beside the demo's."""

    def counted() -> bool:
        served = kube.status(POLICY_PLURAL, name).get("served") or {}
        return int(served.get("requests") or 0) >= 0.95 * answered

    with contextlib.suppress(TimeoutError):
        wait_for(counted, SERVED_WAIT_S, "status.served to count the run", 0.5)
    kube.show("get", "pp")


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
        if settings.late_binding:
            # What the routers served, as the operator's status shows it (its SERVED column):
            # written once a heartbeat, so it may take a few seconds to count the whole run.
            _show_served(kube, name, len(run.answered))
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
