"""`compass simulate`: a policy and the static baselines served one seeded load, compared."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from compass.api.paretopolicy import AdmissionSettings, ParetoPolicySpec
from compass.commands import plots
from compass.commands.common import (
    add_admission_arguments,
    add_pattern_arguments,
    add_trace_window_arguments,
    admission_degrade_after,
    admission_quantile,
    check_output,
    check_some_requests,
    load_policy,
    pattern_from_args,
    plan_error,
    save_output,
    trace_window_pattern,
    write_text,
)
from compass.console import fail, parse_number, serving_summary
from compass.conversion import admission_rule, mix_dealing, policy_plan, simulate_serving
from compass.domain.admission import AdmissionPoint
from compass.domain.arrivals import Scenario, make_scenario
from compass.domain.mix import Dealing
from compass.domain.oracle import hindsight_oracle
from compass.domain.planner import PlanError
from compass.domain.podmodel import POD_STAGES, PodModel
from compass.domain.profiles import LatencyProfile
from compass.domain.simulator import MetricsView, RunReport, compare

DEFAULT_TIMELINE = "compass-timeline.json"
# Each pod is simulated as its own queue: a bound keeps a typo from exhausting memory.
MAX_PODS = 1000

# --stages: router instances that share the cores (PodModel.contended).
CONTENDED = "contended"


def register(commands: Any, summary: str) -> None:
    """Add `compass simulate` to the `compass` parser."""
    simulate = commands.add_parser(
        "simulate",
        help=summary,
        description="Serve one seeded load with the policy as its routers serve it (each "
        "request bound behind their gate, or the whole workflow switched on pods of "
        "routerInstances servers) and with the fastest, middle and most accurate front members "
        "held static, on the same arrivals, pod assignment and service-time draws, and compare "
        "them; --oracle adds the hindsight oracle.",
    )
    simulate.add_argument(
        "--policy", required=True, metavar="POLICY.yaml", help="`compass plan` output"
    )
    add_pattern_arguments(simulate)
    simulate.add_argument(
        "--pods",
        default="1",
        help="Triton pods behind the Service: each request goes to one at random, the policy "
        "sees the per-pod queue (default 1)",
    )
    simulate.add_argument(
        "--stages",
        choices=sorted([*POD_STAGES, CONTENDED]),
        default="independent",
        help="what a request passes through in a pod: independent (each router instance "
        "serves it alone), rag-sim (one-instance retriever and reranker, a batching "
        "generator) or contended (the instances share the cores: a busy pod slows each "
        "request as the member's capacity curve says, as one server without a curve); "
        "default "
        "independent",
    )
    simulate.add_argument(
        "--switch-delay-ms",
        help="how long a switch takes to reach every pod (default: the policy's switchDelayMs)",
    )
    simulate.add_argument(
        "--scrape-interval",
        default="0",
        metavar="SECONDS",
        help="the policy reads the queue as Prometheus last scraped it, every SECONDS (the "
        "operator's Prometheus metrics source: 15-30 s on most clusters); default 0: read from "
        "every pod at each tick, as the operator does without a Prometheus source",
    )
    simulate.add_argument(
        "--metrics-lag",
        default="0",
        metavar="SECONDS",
        help="each reading shows the pods as they were SECONDS before it was taken (Triton's "
        "--metrics-interval-ms, a recording rule or rate window), unseen by the policy; "
        "default 0",
    )
    simulate.add_argument(
        "--admission",
        action="store_true",
        help="the policy's routers serve a request that would be late (its wait plus the "
        "--admission-quantile of its service time over the SLO) on the fastest member if "
        "that brings it in time, else refuse it; the baselines serve everything (on by "
        "itself when the policy has admission.enabled)",
    )
    add_admission_arguments(simulate, "the policy's admission.quantile, 0.5")
    simulate.add_argument(
        "--no-refuse",
        action="store_true",
        help="with admission: serve a request that would be late whatever serves it on the "
        "fastest member instead of refusing it (the policy's admission.refuse: false)",
    )
    add_trace_window_arguments(simulate)
    simulate.add_argument(
        "--oracle",
        action="store_true",
        help="add the hindsight oracle's row on the same arrivals (per 5 s window, the most "
        "accurate mix at static fastest's compliance) and the policy's share of its gain",
    )
    simulate.add_argument(
        "--timeline",
        default=DEFAULT_TIMELINE,
        metavar="TIMELINE.json",
        help=f"where the policy's timeline goes (default {DEFAULT_TIMELINE})",
    )
    simulate.add_argument("--plot", metavar="OUT.png", help="draw the front and the timeline")
    simulate.set_defaults(handler=simulate_command)


def comparison_table(reports: Mapping[str, RunReport]) -> str:
    """One row per policy: compliance, accuracy, latency percentiles, switches, time shares."""
    names = next(iter(reports.values())).names
    lines = [
        f"{'policy':<9} {'compliance':>10} {'accuracy':>9} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'dropped':>8} {'switches':>8}  time in each configuration (s, by #)"
    ]
    for label, report in reports.items():
        shares = " ".join(
            f"#{i}:{seconds:.0f}" for i, seconds in enumerate(report.time_in_config_s) if seconds
        )
        lines.append(
            f"{label:<9} {report.compliance:>9.1f}% {report.mean_accuracy:>9.4f} "
            f"{report.latency_percentile(50):>8.0f} {report.latency_percentile(95):>8.0f} "
            f"{report.latency_percentile(99):>8.0f} {report.dropped_pct:>7.1f}% "
            f"{report.switches:>8}  {shares}"
        )
    legend = "  ".join(f"#{i} {name}" for i, name in enumerate(names))
    return "\n".join([*lines, f"configurations: {legend}"])


def timeline_document(reports: Mapping[str, RunReport], scenario: Scenario) -> dict[str, Any]:
    """The policy's run as plain data: every decision tick, every request, every switch."""
    report = reports["policy"]
    names = report.names
    return {
        "pattern": scenario.pattern.kind.value,
        "seed": scenario.seed,
        "slo_ms": report.slo_ms,
        "configurations": list(names),
        "summary": {name: r.summary() for name, r in reports.items()},
        "ticks": [
            {
                "time_s": t.time_s,
                "offered_qps": t.offered_qps,
                "observed_qps": t.observed_qps,
                "queue_depth": t.queue_depth,
                "active": names[t.active],
                "switched": t.switched,
            }
            for t in report.ticks
        ],
        "switches": [{"time_s": time, "reason": reason} for time, reason in report.reasons],
        "requests": [
            {
                "arrival_s": round(float(a), 6),
                "start_s": round(float(s), 6),
                "latency_ms": round(float(latency), 3),
                # A request dropped at arrival was served by none.
                "configuration": None if dropped else names[int(c)],
                "dropped": bool(dropped),
            }
            for a, s, latency, c, dropped in zip(
                report.arrivals_s,
                report.starts_s,
                report.latencies_ms,
                report.configs,
                report.dropped,
                strict=True,
            )
        ],
    }


def refuse_whole_workflow_flags(args: argparse.Namespace, view: MetricsView) -> None:
    """A usage error for a flag that only whole-workflow serving has: the routers bind each
    request on what they see, never on the operator's metrics or a pod model of its own."""
    given = {
        "--scrape-interval": not view.fresh and view.scrape_interval_s > 0,
        "--metrics-lag": view.lag_s > 0,
        "--stages": args.stages != "independent",
        "--admission-at": args.admission_at != AdmissionPoint.DISPATCH.value,
    }
    for flag, set_ in given.items():
        if set_:
            fail(
                flag,
                "applies to whole-workflow serving, and this policy's routers bind each request",
                "drop it, or simulate a policy planned with --whole-workflow",
            )


def bound_admission(args: argparse.Namespace, spec: ParetoPolicySpec) -> AdmissionSettings:
    """The policy's admission with the flags' changes."""
    current = spec.admission
    return current.model_copy(
        update={
            "enabled": True if args.admission else current.enabled,
            "quantile": admission_quantile(args, current.quantile),
            "degrade_after": admission_degrade_after(args, current.degrade_after),
            "refuse": current.refuse and not args.no_refuse,
        }
    )


def oracle_line(
    reports: Mapping[str, RunReport],
    front: Sequence[LatencyProfile],
    scenario: Scenario,
    slo_ms: float,
    pods: int,
) -> str:
    """The hindsight oracle on the same arrivals, and the policy's share of its accuracy gain
    over static fastest."""
    oracle = hindsight_oracle(front, scenario, slo_ms, pods=pods)
    fastest, policy = reports["fastest"], reports["policy"]
    gain = oracle.mean_accuracy - fastest.mean_accuracy
    share = (
        f"{100 * (policy.mean_accuracy - fastest.mean_accuracy) / gain:.0f}%"
        if gain > 0
        else "n/a (the oracle gains nothing over static fastest)"
    )
    return (
        f"{'oracle':<9} {oracle.compliance:>9.1f}% {oracle.mean_accuracy:>9.4f}  (hindsight: "
        f"per {oracle.window_s:g} s window, the most accurate mix at static fastest's "
        f"compliance); the policy's share of its accuracy gain: {share}, at "
        f"{policy.compliance - fastest.compliance:+.1f} points of compliance against static "
        "fastest"
    )


def simulate_command(args: argparse.Namespace) -> int:
    """`compass simulate`: the policy against the static baselines on one seeded load."""
    policy_path = Path(str(args.policy))
    timeline = Path(str(args.timeline))
    inputs = {"--policy": args.policy, "--trace": args.trace}
    check_output("--timeline", timeline, inputs)
    plot = None if args.plot is None else Path(str(args.plot))
    if plot is not None:
        check_output("--plot", plot, {**inputs, "--timeline": timeline})
    pattern, seed = pattern_from_args(args)
    pods = parse_number("--pods", str(args.pods), "2", low=1, inclusive=True, high=MAX_PODS)
    if not pods.is_integer():
        fail("--pods", f"{pods:g} is not a whole number", "pass e.g. --pods 2")
    view = MetricsView(
        parse_number("--scrape-interval", str(args.scrape_interval), "15", low=0, inclusive=True),
        parse_number("--metrics-lag", str(args.metrics_lag), "2", low=0, inclusive=True),
    )
    spec = load_policy(policy_path)
    if args.switch_delay_ms is not None:
        delay = parse_number("--switch-delay-ms", args.switch_delay_ms, "10", low=0, inclusive=True)
        spec = spec.model_copy(update={"switch_delay_ms": delay})
    per_request = spec.binding.mode.per_request
    if args.admission and mix_dealing(spec) is Dealing.DRAW:
        fail(
            "--admission",
            "the gateway (routing.actuator inferenceModelRewrite) has no admission at dispatch",
            "drop it, or simulate a policy whose routing.actuator is triton",
        )
    if per_request:
        refuse_whole_workflow_flags(args, view)
        spec = spec.model_copy(update={"admission": bound_admission(args, spec)})
    try:
        plan = policy_plan(spec)
    except PlanError as exc:
        raise plan_error(exc, f"--policy {policy_path}") from None
    front = [t.profile for t in plan.thresholds]
    load = pattern.kind.value
    if args.trace_name is not None:
        pattern = trace_window_pattern(args, front[0].mean_ms, int(pods))
        load = (
            f"{args.trace_name} from {args.window_start} s, stretched to {args.utilisation} of "
            "the fastest's capacity"
        )
    admission = None
    if not per_request and (args.admission or spec.admits):
        flagged = spec.model_copy(update={"admission": bound_admission(args, spec)})
        admission = replace(admission_rule(flagged), at=AdmissionPoint(args.admission_at))
    scenario = make_scenario(pattern, seed)
    check_some_requests(pattern, seed, scenario.requests)
    pod_model = PodModel(
        spec.router_instances,
        POD_STAGES.get(str(args.stages), ()),
        contended=args.stages == CONTENDED,
    )
    # The static baselines serve everything on plain pods; the policy as its routers serve it.
    reports = compare(
        {},
        front,
        scenario,
        spec.slo.latency_ms,
        spec.interval_seconds,
        pods=int(pods),
        switch_delay_s=spec.switch_delay_ms / 1000,
        pod_model=pod_model,
    )
    reports["policy"] = simulate_serving(
        spec,
        scenario,
        pods=int(pods),
        plan=plan,
        pod_model=pod_model,
        admission=admission,
        metrics_view=view,
    )
    print(
        f"compass simulate: {load}, base {pattern.base_qps:g} QPS for "
        f"{pattern.duration_s:g} s (peak {pattern.peak_qps:.2f}), seed {seed}: "
        f"{scenario.requests} requests, the same arrivals for every policy; {int(pods)} pod(s); "
        f"SLO {spec.slo.latency_ms:g} ms; the policy: {serving_summary(spec)}"
        + (
            f", behind a gate of {spec.binding.gate.instances} instances and "
            f"{spec.binding.gate.slots} slot(s)"
            if per_request
            else f", {spec.router_instances} router instance(s) ({args.stages}), switch delay "
            f"{spec.switch_delay_ms:g} ms, model {spec.threshold_model.value}"
        )
        + (
            ""
            if admission is None
            else f"; admission q {admission.quantile:g}"
            + ("" if admission.refuse else ", refusing nothing")
        )
        + (
            ""
            if view.fresh
            else f"; the policy reads the queue as scraped every {view.scrape_interval_s:g} s, "
            f"showing the pods {view.lag_s:g} s before"
        )
    )
    print(comparison_table(reports))
    if args.oracle:
        print(oracle_line(reports, front, scenario, spec.slo.latency_ms, int(pods)))
    write_text(timeline, json.dumps(timeline_document(reports, scenario), indent=1) + "\n")
    print(f"timeline: {timeline}")
    if plot is not None:
        title = (
            f"{scenario.pattern.kind.value} load, seed {scenario.seed}: {scenario.requests} "
            "requests, the same for every policy"
        )
        save_output(plot, lambda path: plots.save_timeline_figure(path, plan, reports, title))
        print(f"plot: {plot}")
    return 0
