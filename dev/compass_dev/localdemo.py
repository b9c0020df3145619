"""`compass demo`: the whole method on one machine, against a real local Triton serving rag-sim.

COMPASS-V through the router, latency profiles of the feasible configurations, the plan, then
the same seeded load spike served several ways (by default the static fastest, the static most
accurate and the default serving: per-request binding behind the router's gate) beside the
simulator's prediction; tables on stdout, files and plots in one folder. rag-sim's latencies
are scaled by ``--time-scale`` (the SLO and cooldowns with them) and every figure is reported
unscaled; the search runs with them on, through two servers of its own with routers of four
instances, eight requests in flight (the fleet a search Job would use). docs/development.md.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from compass.api.binding import BindingSettings
from compass.api.meta import DEFAULT_ROUTER_MODEL
from compass.api.paretopolicy import Hysteresis, ParetoPolicySpec
from compass.commands.plots import save_plan_figure, save_timeline_figure
from compass.console import (
    fail,
    plan_table,
    policy_manifest,
    policy_text,
    search_with_progress,
)
from compass.console import shown as quoted
from compass.conversion import binding_table, runtime_policy, simulate_serving, spec_for_plan
from compass.dataplane.metrics import TritonQueueDepth
from compass.dataplane.profiler import ProfileSettings, profile_configurations
from compass.dataplane.triton import TritonRouter
from compass.domain.admission import Admission, AdmissionPoint, router_admission
from compass.domain.arrivals import SPIKE_FACTOR, Scenario
from compass.domain.evaluation import Config
from compass.domain.planner import Plan, PlanError, Slo, plan_from_profiles
from compass.domain.profiles import LatencyProfile, parse_profiles
from compass.domain.search import SearchOutcome, SearchSettings, complete_feasible
from compass.domain.simulator import RunReport, compare
from compass.domain.space import Space
from compass.domain.strategy import Strategy
from compass.evaluators.concurrency import ThreadRunner
from compass.evaluators.factory import ScoreSource, make_runner
from compass.evaluators.ledger import CheckpointedEvaluator, CheckpointLedger
from compass.evaluators.triton import TritonEvaluator
from compass.examples import load_rag_paper
from compass_dev.experiment import ADMITTED_RUN, BINDING_RUN, LiveRun, serve_each
from compass_dev.local_triton import LocalServerError, TritonInstallation
from compass_dev.scenarios import (
    COMPONENTS,
    DEMO_PEAK_UTILIZATION,
    QUESTIONS,
    RagSimLoad,
    fastest_mean_s,
    rag_sim_fleet,
    rag_sim_triton,
    scaled_profile,
    spike_scenario,
)

# The search's own fleet (issue 44): rag-sim servers with latencies on, each router serving
# this many requests at once, the search keeping all of them busy.
SEARCH_REPLICAS = 2
SEARCH_ROUTER_INSTANCES = 4

# What the runs are called in tables and plots (the static ones: the simulator's baselines).
RUN_TITLES = {
    "fastest": "static fastest",
    "accurate": "static most accurate",
    "policy": "Elastico",
    ADMITTED_RUN: "predictive + admission",
    BINDING_RUN: "default (per-request)",
}
# The runs --runs names, and the experiment's run each is: the default serving is per-request
# binding (the routers' table behind their gate, the policy switching beside it).
DEMO_RUNS = {
    "fastest": "fastest",
    "accurate": "accurate",
    "default": BINDING_RUN,
    "elastico": "policy",
    "predictive": ADMITTED_RUN,
}
DEFAULT_RUNS = ("fastest", "accurate", "default")
# The runs that serve with a policy (the others are static): one of them is the timeline's.
POLICY_RUNS = (BINDING_RUN, "policy", ADMITTED_RUN)


def parse_runs(text: str | None) -> tuple[str, ...]:
    """The experiment's runs `--runs` names (default: DEFAULT_RUNS), or a usage error."""
    names = [n.strip() for n in (text or ",".join(DEFAULT_RUNS)).split(",") if n.strip()]
    unknown = [name for name in names if name not in DEMO_RUNS]
    if unknown or not names:
        fail(
            "--runs",
            f"unknown run(s) {', '.join(quoted(name) for name in unknown)}"
            if unknown
            else "no run given",
            f"give some of {', '.join(DEMO_RUNS)}, comma-separated, e.g. {','.join(DEFAULT_RUNS)}",
        )
    runs = tuple(dict.fromkeys(DEMO_RUNS[name] for name in names))
    if not set(runs) & set(POLICY_RUNS):
        policies = [name for name, run in DEMO_RUNS.items() if run in POLICY_RUNS]
        fail(
            "--runs",
            "no run serves with a policy (the timeline and the verdict need one)",
            f"add one of {', '.join(policies)}, e.g. {','.join(DEFAULT_RUNS)}",
        )
    return runs


# The router's gate the demo's Triton runs (its model config), as a policy's default expects.
GATE = BindingSettings().gate


@dataclass(frozen=True)
class DemoSettings:
    """What the demo searches for, how it measures, and the load it serves."""

    output_dir: Path
    search: SearchSettings
    time_scale: float = 0.2
    slo_ms: float = 1000.0
    percentile: float = 95.0
    slack_buffer_ms: float = 50.0
    base_qps: float | None = None  # None: the spike peaks at DEMO_PEAK_UTILIZATION here
    duration_s: float = 180.0
    load_seed: int = 0
    warmup_runs: int = 3
    measured_runs: int = 30
    screen_runs: int = 5
    runs: tuple[str, ...] = tuple(DEMO_RUNS[name] for name in DEFAULT_RUNS)


class Reporter:
    """Numbered steps with their wall time, flushed as they happen."""

    def __init__(self, steps: int, stream: Any = sys.stdout) -> None:
        self.steps = steps
        self.done = 0
        self.stream = stream
        self.started = time.monotonic()
        self.step_started = self.started

    def step(self, title: str) -> None:
        """Start the next step."""
        self.done += 1
        self.step_started = time.monotonic()
        self.say(f"[{self.done}/{self.steps}] {title}")

    def say(self, line: str) -> None:
        """One line now."""
        print(line, file=self.stream, flush=True)

    def took(self) -> str:
        """Seconds since the step started."""
        return f"{time.monotonic() - self.step_started:.0f} s"


def _set_time_scale(router: TritonRouter, component: str, scale: float) -> None:
    """Reload a rag-sim component with another ``time_scale`` (Triton's config override)."""
    config = router.client.get_model_config(component, as_json=True)["config"]
    config["parameters"]["time_scale"] = {"string_value": repr(scale)}
    router.client.load_model(component, config=json.dumps(config))


def shown(path: Path) -> str:
    """A resolved path as people typed it: relative to the working directory when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def write_file(path: Path, text: str) -> Path:
    """Write a UTF-8 text file; its path."""
    path.write_text(text, encoding="utf-8")
    return path


def write_json(path: Path, document: Any) -> Path:
    """Write a document as indented JSON, as every file the demos leave is; its path."""
    return write_file(path, json.dumps(document, indent=2) + "\n")


@dataclass(frozen=True)
class Searched:
    """The search's outcome, and the same with the feasible set scored on every sample."""

    outcome: SearchOutcome
    completed: SearchOutcome

    @property
    def extra_evaluations(self) -> int:
        """Sample evaluations the completion added."""
        return self.completed.sample_evals - self.outcome.sample_evals


def run_search(
    addresses: Sequence[str], space: Space, population: int, settings: DemoSettings
) -> Searched:
    """COMPASS-V through the routers at these addresses, ``SEARCH_ROUTER_INSTANCES`` requests
    in flight on each, then the feasible set scored on the whole dataset (as the operator's
    search Job does: complete_feasible), reusing every score the search recorded."""

    ledger_path = settings.output_dir / "search.ledger.jsonl"
    ledger_path.unlink(missing_ok=True)
    evaluator = CheckpointedEvaluator(
        TritonEvaluator.over(addresses, DEFAULT_ROUTER_MODEL), CheckpointLedger(ledger_path)
    )
    runner = make_runner(
        ScoreSource(triton=",".join(addresses)),
        evaluator,
        len(addresses) * SEARCH_ROUTER_INSTANCES,
    )
    try:
        outcome = search_with_progress(space, evaluator, population, settings.search, runner)
        return Searched(outcome, complete_feasible(outcome, evaluator, runner))
    finally:
        if isinstance(runner, ThreadRunner):
            runner.close()


def profile_feasible(
    router: TritonRouter,
    searched: Searched,
    settings: DemoSettings,
) -> tuple[dict[str, Any], tuple[LatencyProfile, ...]]:
    """Profile every feasible configuration; the document and its profiles, both unscaled."""
    outcome = searched.completed
    configs: list[tuple[Config, float | None]] = [
        (outcome.space.config(a.index), a.accuracy) for a in outcome.feasible
    ]
    document = profile_configurations(
        router,
        configs,
        ProfileSettings(
            settings.warmup_runs, settings.measured_runs, screen_runs=settings.screen_runs
        ),
        lambda i: {"sample": i % outcome.population},
    )
    scale = settings.time_scale
    for entry in document["profiles"]:
        for key in [k for k in entry if k.startswith("latency_")]:
            entry[key] = entry[key] / scale
    document["metadata"]["time_scale"] = scale
    document["metadata"]["note"] = (
        f"measured through Triton with rag-sim's latencies x{scale:g}; times divided back by it"
    )
    return document, parse_profiles(document)


def live_policy(profiles: Sequence[LatencyProfile], settings: DemoSettings) -> ParetoPolicySpec:
    """The policy the live run uses: the same plan, every time scaled."""
    scale = settings.time_scale
    scaled = [scaled_profile(p, scale) for p in profiles]
    plan = plan_from_profiles(
        scaled,
        Slo(settings.slo_ms * scale, settings.percentile),
        settings.slack_buffer_ms * scale,
    )
    default = Hysteresis()
    return spec_for_plan(
        plan,
        Hysteresis(
            upscale_cooldown_seconds=default.upscale_cooldown_seconds * scale,
            downscale_cooldown_seconds=default.downscale_cooldown_seconds * scale,
        ),
        interval_seconds=scale,
    )


def predictive(spec: ParetoPolicySpec) -> ParetoPolicySpec:
    """The spec with the predictive strategy: what the demo serves with admission."""
    return spec.model_copy(update={"strategy": Strategy.PREDICTIVE})


def predictions(
    plan: Plan, policy: ParetoPolicySpec, scenario: Scenario, settings: DemoSettings
) -> dict[str, RunReport]:
    """The simulator's prediction of every run the settings ask for, on the same arrivals: the
    default serving as simulate_serving serves the policy, the others as compare runs them."""
    members = [t.profile for t in plan.thresholds]
    predicted = compare(
        {"policy": runtime_policy(policy)},
        members,
        scenario,
        settings.slo_ms,
        policy.interval_seconds,
    )
    if ADMITTED_RUN in settings.runs:
        predicted[ADMITTED_RUN] = compare(
            {ADMITTED_RUN: runtime_policy(predictive(policy))},
            members,
            scenario,
            settings.slo_ms,
            policy.interval_seconds,
            admission=Admission(settings.slo_ms, at=AdmissionPoint.DISPATCH),
        )[ADMITTED_RUN]
    if BINDING_RUN in settings.runs:
        predicted[BINDING_RUN] = simulate_serving(policy, scenario, BINDING_RUN, plan=plan)
    return {label: report for label, report in predicted.items() if label in settings.runs}


def serve_spike(
    router: TritonRouter,
    metrics_url: str,
    plan: Plan,
    live: ParetoPolicySpec,
    scenario: Scenario,
    settings: DemoSettings,
    reporter: Reporter,
    predicted: dict[str, RunReport],
) -> dict[str, LiveRun]:
    """The spike served by each run the settings ask for, in EVERY_RUN's order: the static
    fastest and most accurate, Elastico, the predictive strategy with admission at dispatch,
    and the default serving (the policy's binding table behind the router's gate, its loop
    switching beside it, as the operator serves); requests carry no deadline, the gated
    router gives each its take-up plus the SLO. Each run's line beside its prediction."""
    scale = settings.time_scale
    load = RagSimLoad(scenario)
    runs = {}
    started = time.monotonic()
    policy = runtime_policy(live)
    rule = Admission(settings.slo_ms * scale, at=AdmissionPoint.DISPATCH)
    for label, run in serve_each(
        router,
        plan,
        policy,
        TritonQueueDepth(metrics_url, router.model),
        load.arrivals_s(scale),
        load.payload,
        settings.slo_ms,
        interval_s=live.interval_seconds,
        time_scale=scale,
        offered_qps=load.offered_qps,
        labels=settings.runs,
        admission=router_admission([t.profile for t in policy.plan.thresholds], rule),
        admitted_policy=runtime_policy(predictive(live)),
        binding=binding_table(live, policy.plan),
        bound_policy=policy,
        client_deadlines=False,
    ):
        runs[label] = run
        report = predicted.get(label)
        reporter.say(
            f"      {RUN_TITLES[label]:<22} {run.compliance:5.1f}% within the SLO, accuracy "
            f"{run.accuracy:.4f}, {run.switches} switches"
            + (f", {run.refused} refused as late" if run.refused else "")
            + (
                f"; simulator {report.compliance:5.1f}%, accuracy {report.mean_accuracy:.4f}"
                if report is not None
                else ""
            )
            + f" ({time.monotonic() - started:.0f} s)"
        )
        started = time.monotonic()
    return runs


def comparison_rows(
    runs: dict[str, LiveRun],
    predicted: dict[str, RunReport],
    front: Sequence[LatencyProfile],
    titles: dict[str, str] = RUN_TITLES,
) -> list[dict[str, Any]]:
    """One row per run: measured on Triton, and the simulator's prediction beside it.

    ``served_accuracy`` credits each answer with the profiled accuracy of the ``front`` member
    that served it: what the simulator counts, without the luck of which questions it drew."""
    rows = []
    for label, run in runs.items():
        report = predicted.get(label)
        rows.append(
            {
                "run": titles[label],
                "compliance_pct": round(run.compliance, 2),
                "simulated_compliance_pct": round(report.compliance, 2) if report else None,
                "accuracy": round(run.accuracy, 4),
                "served_accuracy": round(run.served_accuracy(front), 4),
                "simulated_accuracy": round(report.mean_accuracy, 4) if report else None,
                "p95_ms": round(run.percentile_ms(95), 1),
                "failed": run.failed,
                "refused": run.refused,
                "switches": run.switches,
            }
        )
    return rows


def verdict(
    runs: dict[str, LiveRun], front: Sequence[LatencyProfile], who: str = "Elastico"
) -> str:
    """One line: compliance against the static most accurate, accuracy against the fastest
    (the answers' score, and what served them by the ``front``'s profiled accuracies)."""

    def accuracy(run: LiveRun) -> str:
        return f"{run.accuracy:.4f} (served {run.served_accuracy(front):.4f})"

    policy, accurate, fastest = runs["policy"], runs["accurate"], runs["fastest"]
    line = (
        f"{who} met the SLO for {policy.compliance:.1f}% of requests (static most accurate: "
        f"{accurate.compliance:.1f}%) at accuracy {accuracy(policy)} (static fastest: "
        f"{accuracy(fastest)})"
    )
    admitted = runs.get(ADMITTED_RUN)
    if admitted is None:
        return line
    return (
        f"{line}; predictive with admission {admitted.compliance:.1f}% (static fastest: "
        f"{fastest.compliance:.1f}%) at accuracy {accuracy(admitted)}, "
        f"{admitted.refused} refused as late"
    )


def runs_verdict(runs: dict[str, LiveRun], front: Sequence[LatencyProfile]) -> str:
    """One line: each policy run's compliance and accuracy (the answers' score, and what
    served them by the ``front``'s profiled accuracies), beside the static runs made."""

    def accuracy(run: LiveRun) -> str:
        return f"{run.accuracy:.4f} (served {run.served_accuracy(front):.4f})"

    served = [
        f"{RUN_TITLES[label]} met the SLO for {run.compliance:.1f}% of requests at accuracy "
        f"{accuracy(run)}" + (f", {run.refused} refused as late" if run.refused else "")
        for label in POLICY_RUNS
        if (run := runs.get(label)) is not None
    ]
    static = [
        f"{RUN_TITLES[label]} {run.compliance:.1f}% at accuracy {accuracy(run)}"
        for label in ("accurate", "fastest")
        if (run := runs.get(label)) is not None
    ]
    return "; ".join(served) + (f" (against {', '.join(static)})" if static else "")


def comparison_text(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison as an aligned table."""
    lines = [
        f"  {'run':<22} {'SLO met':>8} {'(sim)':>7} {'accuracy':>8} {'served':>7} {'(sim)':>7} "
        f"{'p95 ms':>7} {'failed':>6} {'refused':>7} {'switches':>8}"
    ]
    for row in rows:
        lines.append(
            f"  {row['run']:<22} {row['compliance_pct']:7.1f}% "
            f"{_optional(row['simulated_compliance_pct'], '6.1f')}% {row['accuracy']:8.4f} "
            f"{row['served_accuracy']:7.4f} "
            f"{_optional(row['simulated_accuracy'], '7.4f')} {row['p95_ms']:7.0f} "
            f"{row['failed']:6d} {row['refused']:7d} {row['switches']:8d}"
        )
    return "\n".join(lines)


def _optional(value: float | None, spec: str) -> str:
    """A number formatted to ``spec``, or a dash as wide when there is none."""
    return format(value, spec) if value is not None else "-".rjust(int(spec.split(".")[0]))


def _search_step(space: Space, settings: DemoSettings, say: Reporter) -> Searched:
    """Step 2: the search, its result file, its summary; no feasible set is a usage error."""
    population = QUESTIONS
    instances = SEARCH_ROUTER_INSTANCES
    say.step(
        f"COMPASS-V through {SEARCH_REPLICAS} more rag-sim servers (router of {instances} "
        f"instances each, latencies x{settings.time_scale:g}, "
        f"{SEARCH_REPLICAS * instances} requests in flight): every configuration of "
        f"{space.size} with accuracy >= {settings.search.tau:g}, {population} samples each"
    )
    workdir = settings.output_dir / "triton-search"
    with rag_sim_fleet(workdir, settings.time_scale, SEARCH_REPLICAS, instances) as servers:
        searched = run_search([s.grpc_url for s in servers], space, population, settings)
    outcome = searched.outcome
    out = settings.output_dir
    write_json(out / "search-result.json", outcome.result_document())
    if not outcome.feasible:
        best = max(a.accuracy for a in outcome.assessments)
        fail(
            "--tau",
            f"no configuration reaches {settings.search.tau:g} (best {best:.3f})",
            "lower it",
        )
    saved = 1 - outcome.sample_evals / (space.size * population)
    say.say(
        f"      {len(outcome.feasible)} feasible; {outcome.configs_evaluated} configurations "
        f"evaluated, {outcome.sample_evals:,} sample evaluations ({saved:.1%} fewer than "
        f"exhaustive), then {searched.extra_evaluations:,} more to score the feasible ones on "
        f"all {population} samples for the front ({say.took()})"
    )
    return searched


def _profile_step(
    router: TritonRouter, searched: Searched, settings: DemoSettings, say: Reporter
) -> tuple[LatencyProfile, ...]:
    """Step 3: rag-sim at its (scaled) latency, every feasible configuration profiled."""
    say.step(
        f"profile the {len(searched.completed.feasible)} feasible configurations through the router, one "
        f"request at a time ({settings.screen_runs} each, then {settings.measured_runs} for "
        "those no more accurate configuration clearly beats)"
    )
    for component in COMPONENTS:
        _set_time_scale(router, component, settings.time_scale)
    document, profiles = profile_feasible(router, searched, settings)
    write_json(settings.output_dir / "profiles.json", document)
    say.say(
        f"      {document['metadata']['screened_out']} screened out, "
        f"{len(profiles) - document['metadata']['screened_out']} measured ({say.took()})"
    )
    return profiles


def _plan_step(
    profiles: Sequence[LatencyProfile], settings: DemoSettings, say: Reporter
) -> tuple[Plan, ParetoPolicySpec, ParetoPolicySpec]:
    """Step 4: the plan (unscaled, written as the policy) and the live loop's scaled twin."""

    slo = Slo(settings.slo_ms, settings.percentile)
    say.step(
        f"plan: the Pareto front and its thresholds for p{slo.percentile:g} <= "
        f"{slo.latency_ms:g} ms"
    )
    try:
        plan = plan_from_profiles(profiles, slo, settings.slack_buffer_ms)
        live = live_policy(profiles, settings)
    except PlanError as error:
        fail("--slo-ms", str(error), "raise it")
    say.say(plan_table(plan))
    policy = spec_for_plan(plan)
    out = settings.output_dir
    write_file(out / "policy.yaml", policy_text(policy_manifest(policy, "rag"), "yaml"))
    save_plan_figure(out / "front.png", plan, profiles)
    return plan, policy, live


def comparison_document(
    scenario: Scenario,
    slo: Slo,
    time_scale: float,
    rows: list[dict[str, Any]],
    switches: list[dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    """What comparison.json holds: the load, ``extra``, every run's figures, the switches."""
    return {
        "slo_ms": slo.latency_ms,
        "percentile": slo.percentile,
        "pattern": {
            "kind": "spike",
            "base_qps": round(scenario.pattern.base_qps, 4),
            "duration_s": scenario.pattern.duration_s,
            "seed": scenario.seed,
        },
        "requests": scenario.requests,
        "time_scale": time_scale,
        **extra,
        "runs": rows,
        "switches": switches,
    }


OUTPUTS = (
    "timeline.png",
    "front.png",
    "comparison.json",
    "policy.yaml",
    "profiles.json",
    "search-result.json",
    "search.ledger.jsonl",
)


def run_demo(settings: DemoSettings, say: Reporter | None = None) -> int:
    """Run every step; 0 when done, 1 when this machine cannot run Triton (the message says why)."""

    say = say or Reporter(steps=6)
    # Resolved once, here: tritonserver and its Python stubs get these paths, and the demo must
    # not depend on the directory it was started from.
    settings = replace(settings, output_dir=settings.output_dir.resolve())
    out = settings.output_dir
    try:
        TritonInstallation.find()
    except LocalServerError as error:
        print(
            f"compass demo: error: no tritonserver here ({error}); install it with "
            "pip install 'compass-operator[local]' (hack/demo.sh does), or run "
            "`compass demo --search-only` (the search alone, no Triton)",
            file=sys.stderr,
        )
        return 1
    out.mkdir(parents=True, exist_ok=True)
    space = Space.from_spec(load_rag_paper()[0])
    say.say(
        f"compass demo: the whole method on this machine, into {shown(out)}/ (rag-sim's latencies "
        f"x{settings.time_scale:g}; every figure below is at the paper's scale)"
    )
    say.step(
        f"start tritonserver with rag-sim: the router ({GATE.instances} instances behind a gate "
        f"of {GATE.slots} pipeline slot(s), as per-request binding serves) and its three "
        "components"
    )
    workdir = out / "triton"
    # Latency 0 until the profiling step sets the real scale (the search has servers of its own).
    # Every run is served behind the gate, so that they differ only in what binds each request.
    triton = rag_sim_triton(workdir, 0, router_instances=GATE.instances, pipeline_slots=GATE.slots)
    with triton.start(workdir):
        router = TritonRouter(triton.grpc_url)
        say.say(f"      Triton at {triton.grpc_url}, its log in {workdir} ({say.took()})")
        searched = _search_step(space, settings, say)
        profiles = _profile_step(router, searched, settings, say)
        plan, policy, live = _plan_step(profiles, settings, say)
        scenario = spike_scenario(
            plan, settings.duration_s, settings.load_seed, settings.base_qps, DEMO_PEAK_UTILIZATION
        )
        peak = SPIKE_FACTOR * scenario.pattern.base_qps * fastest_mean_s(plan)
        predicted = predictions(plan, policy, scenario, settings)
        say.step(
            f"serve a load spike {len(settings.runs)} ways beside the simulator's prediction: "
            f"{scenario.pattern.base_qps:.2f} QPS, x4 for the "
            f"middle third (peak at {peak:.0%} "
            f"of the fastest configuration's capacity), {settings.duration_s:g} s, "
            f"{scenario.requests} requests (the same for every run)"
        )
        runs = serve_spike(
            router, triton.metrics_url, plan, live, scenario, settings, say, predicted
        )
        router.close()

    say.step("compare with the simulator's prediction on the same arrivals")
    members = [t.profile for t in plan.thresholds]
    rows = comparison_rows(runs, predicted, members)
    say.say(comparison_text(rows))
    # The timeline and the switches are the first policy run's (the default serving's first).
    featured = next(label for label in POLICY_RUNS if label in runs)
    switches = [
        {"time_s": round(e.time_s, 2), "config": e.config, "switch_ms": round(e.switch_s * 1000, 1)}
        for e in runs[featured].switch_events
    ]
    slo = Slo(settings.slo_ms, settings.percentile)
    document = comparison_document(
        scenario, slo, settings.time_scale, rows, switches, switches_of=RUN_TITLES[featured]
    )
    write_json(out / "comparison.json", document)
    save_timeline_figure(
        out / "timeline.png",
        plan,
        runs,
        f"rag-sim on a real Triton: spike at {scenario.pattern.base_qps:.2f} QPS x4, SLO p"
        f"{settings.percentile:g} <= {settings.slo_ms:g} ms, {scenario.requests} requests",
        label=featured,
        profiles=profiles,
    )
    say.say(runs_verdict(runs, members))
    say.say(f"wrote {shown(out)}/: {', '.join(OUTPUTS)}")
    say.say(f"done in {time.monotonic() - say.started:.0f} s")
    return 0
