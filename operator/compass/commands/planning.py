"""`compass plan` and `compass simulate`: the Pareto front, its thresholds, and Elastico on trial."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from compass.api.paretopolicy import DEFAULT_SLACK_BUFFER_MS, ParetoPolicySpec, spec_for_plan
from compass.console import UsageError, fail, parse_number, plan_table, policy_text
from compass.domain.planner import PlanError, Slo, ThresholdModel, plan_from_profiles
from compass.domain.profiles import LatencyProfile, ProfileError, parse_profiles
from compass.domain.simulator import (
    LoadPattern,
    PatternKind,
    RunReport,
    Scenario,
    SimulationError,
    compare,
    make_pattern,
    make_scenario,
)
from compass.domain.space import explain_validation_error

DEFAULT_POLICY = "paretopolicy.yaml"
DEFAULT_TIMELINE = "compass-timeline.json"
# Where a planner error's field comes from on the command line.
_PLAN_FLAGS = {"slo.latencyMs": "--slo-ms", "slo.percentile": "--percentile"}


def register(commands: Any) -> None:
    """Add `plan` and `simulate` to the `compass` parser."""
    plan = commands.add_parser(
        "plan",
        help="Pareto front and switching thresholds from latency profiles",
        description="Keep the configurations no other beats on both accuracy and tail latency, "
        "order them by mean service time, derive each one's queue-depth (and, with the tail "
        "model, arrival-rate) limits for the SLO, print them, and write the ParetoPolicy spec.",
    )
    plan.add_argument(
        "--profiles", required=True, metavar="PROFILES.json", help="`compass profile` output"
    )
    plan.add_argument("--slo-ms", required=True, help="latency target in ms")
    plan.add_argument("--percentile", default="95", help="percentile held to it (default 95)")
    plan.add_argument(
        "--slack-ms",
        default=f"{DEFAULT_SLACK_BUFFER_MS:g}",
        help=f"headroom to switch to a more accurate one (default {DEFAULT_SLACK_BUFFER_MS:g})",
    )
    plan.add_argument(
        "--model",
        choices=[m.value for m in ThresholdModel],
        default=ThresholdModel.TAIL.value,
        help="tail (default: tail of the queued work and M/G/1 rate limits) or paper-mean",
    )
    plan.add_argument(
        "--output",
        default=DEFAULT_POLICY,
        metavar="POLICY.yaml",
        help=f"the ParetoPolicy spec, YAML or .json (default {DEFAULT_POLICY})",
    )
    plan.add_argument("--plot", metavar="FRONT.png", help="draw the front and its thresholds")
    plan.set_defaults(handler=plan_command)

    simulate = commands.add_parser(
        "simulate",
        help="run a policy and the static baselines through the serving simulator",
        description="Serve one seeded load (FIFO, one server: the paper's M/G/1) with the "
        "policy and with the fastest, middle and most accurate front members held static, on "
        "the same arrivals and service-time draws, and compare them.",
    )
    simulate.add_argument(
        "--policy", required=True, metavar="POLICY.yaml", help="`compass plan` output"
    )
    add_pattern_arguments(simulate)
    simulate.add_argument(
        "--timeline",
        default=DEFAULT_TIMELINE,
        metavar="TIMELINE.json",
        help=f"where the policy's timeline goes (default {DEFAULT_TIMELINE})",
    )
    simulate.add_argument("--plot", metavar="OUT.png", help="draw the front and the timeline")
    simulate.set_defaults(handler=simulate_command)


# ---------------------------------------------------------------------------- inputs


def _read_document(flag: str, path: Path) -> object:
    """A parsed YAML or JSON file; any problem is one line naming the flag."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        fail(flag, f"{path}: no such file", "check the path")
    except (OSError, UnicodeDecodeError) as exc:
        fail(flag, f"{path}: cannot read it ({exc})", "check the path")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        fail(f"{flag} {path}{where}", "not valid YAML or JSON", "fix the syntax")


def load_profiles(path: Path) -> tuple[LatencyProfile, ...]:
    """The profiles file, validated."""
    data = _read_document("--profiles", path)
    try:
        return parse_profiles(data)
    except ProfileError as exc:
        raise UsageError(f"--profiles {path}: {exc}") from None


def load_policy(path: Path) -> ParetoPolicySpec:
    """A ParetoPolicy spec body, or a whole ParetoPolicy manifest (its spec is used)."""
    data = _read_document("--policy", path)
    prefix = ""
    if isinstance(data, Mapping) and isinstance(data.get("spec"), Mapping):
        data, prefix = data["spec"], "spec."
    if not isinstance(data, Mapping):
        fail(f"--policy {path}", "expected a ParetoPolicy spec (a mapping)", "run `compass plan`")
    try:
        return ParetoPolicySpec.model_validate(data)
    except ValidationError as exc:
        raise UsageError(f"--policy {path}: {prefix}{explain_validation_error(exc)}") from None


def _plan_error(exc: PlanError, source: str | None = None) -> UsageError:
    """A planner error as a usage error that names the flag (or the file) to fix."""
    flag = _PLAN_FLAGS.get(exc.field) if source is None else None
    where = flag or (exc.field if source is None else f"{source}: {exc.field}")
    return UsageError(f"{where}: {exc.what}; {exc.fix}")


def read_trace(path: Path) -> list[float]:
    try:
        words = path.read_text(encoding="utf-8").split()
    except OSError as exc:
        fail("--trace", f"{path}: cannot read it ({exc.strerror})", "check the path")
    times = []
    for number, word in enumerate(words, start=1):
        try:
            times.append(float(word))
        except ValueError:
            fail(
                "--trace",
                f"{path}: entry {number} ({word!r}) is not a number",
                "one time (s) a line",
            )
    return times


# ---------------------------------------------------------------------------- output


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(str(path), f"cannot write it ({exc.strerror})", "choose another path")


def _check_output(flag: str, path: Path) -> None:
    if path.is_dir():
        fail(flag, f"{path} is a directory", "name a file")
    if not path.parent.is_dir():
        fail(flag, f"directory {path.parent} does not exist", "create it or choose another path")


def comparison_table(reports: Mapping[str, RunReport]) -> str:
    """One row per policy: compliance, accuracy, latency percentiles, switches, time shares."""
    names = next(iter(reports.values())).names
    lines = [
        f"{'policy':<9} {'compliance':>10} {'accuracy':>9} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'switches':>8}  time in each configuration (s, by #)"
    ]
    for label, report in reports.items():
        shares = " ".join(
            f"#{i}:{seconds:.0f}" for i, seconds in enumerate(report.time_in_config_s) if seconds
        )
        lines.append(
            f"{label:<9} {report.compliance:>9.1f}% {report.mean_accuracy:>9.4f} "
            f"{report.latency_percentile(50):>8.0f} {report.latency_percentile(95):>8.0f} "
            f"{report.latency_percentile(99):>8.0f} {report.switches:>8}  {shares}"
        )
    legend = "  ".join(f"#{i} {name}" for i, name in enumerate(names))
    return "\n".join([*lines, f"configurations: {legend}"])


def timeline_document(
    reports: Mapping[str, RunReport], scenario: Scenario, label: str = "policy"
) -> dict[str, Any]:
    """The policy's run as plain data: every decision tick, every request, every switch."""
    report = reports[label]
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
                "configuration": names[int(c)],
            }
            for a, s, latency, c in zip(
                report.arrivals_s, report.starts_s, report.latencies_ms, report.configs, strict=True
            )
        ],
    }


# ---------------------------------------------------------------------------- commands


def plan_command(args: argparse.Namespace) -> int:
    """`compass plan`: front, thresholds, policy file (and a plot)."""
    slo_ms = parse_number("--slo-ms", str(args.slo_ms), "1000", low=0, inclusive=False)
    percentile = parse_number("--percentile", str(args.percentile), "95", low=0, inclusive=False)
    if percentile >= 100:
        fail("--percentile", f"{args.percentile} is not below 100", "pass e.g. --percentile 95")
    slack = parse_number("--slack-ms", str(args.slack_ms), "50", low=0, inclusive=True)
    output = Path(str(args.output))
    _check_output("--output", output)
    plot = None if args.plot is None else Path(str(args.plot))
    if plot is not None:
        _check_output("--plot", plot)
    profiles = load_profiles(Path(str(args.profiles)))
    try:
        plan = plan_from_profiles(
            profiles, Slo(slo_ms, percentile), slack, ThresholdModel(args.model)
        )
    except PlanError as exc:
        raise _plan_error(exc) from None
    spec = spec_for_plan(plan)
    print(
        f"compass plan: {len(profiles)} profiles -> Pareto front of {len(plan.thresholds)} "
        f"(accuracy up, p{percentile:g} down), fastest first; SLO {slo_ms:g} ms at "
        f"p{percentile:g}, slack buffer {slack:g} ms, model {plan.model.value}"
    )
    print(plan_table(plan))
    print(
        "stay<=N: switch faster when more requests wait; enter<=N: switch to it only when "
        "at most N wait"
        + (
            "; qps: the same for the arrival rate (M/G/1)"
            if plan.model is ThresholdModel.TAIL
            else ""
        )
    )
    _write(output, policy_text(spec, output))
    print(f"policy: {output}")
    if plot is not None:
        from compass.lab import plots

        plots.save_plan_figure(plot, plan, profiles)
        print(f"plot: {plot}")
    return 0


def add_pattern_arguments(parser: argparse.ArgumentParser) -> None:
    """The load-pattern flags `compass simulate` and `compass load` share."""
    parser.add_argument(
        "--pattern",
        default=PatternKind.SPIKE.value,
        choices=[k.value for k in PatternKind],
        help="load shape (default spike: 4x for the middle third)",
    )
    parser.add_argument("--trace", metavar="FILE", help="arrival timestamps (s), one a line")
    parser.add_argument("--duration", default="180", help="seconds of load (default 180)")
    parser.add_argument("--base-qps", default="1.5", help="base arrival rate (default 1.5)")
    parser.add_argument("--seed", default="0", help="seed of the arrivals and service times")


def pattern_from_args(args: argparse.Namespace) -> tuple[LoadPattern, int]:
    """The load pattern and seed the shared flags describe; UsageError names the bad flag."""
    seed_text = str(args.seed)
    try:
        seed = int(seed_text)
    except ValueError:
        fail("--seed", f"{seed_text!r} is not an integer", "pass e.g. --seed 0")
    if (args.pattern == PatternKind.TRACE.value) != (args.trace is not None):
        fail("--trace", "--pattern trace and --trace FILE go together", "give both or neither")
    trace: Sequence[float] = () if args.trace is None else read_trace(Path(str(args.trace)))
    duration = parse_number("--duration", str(args.duration), "180", low=0, inclusive=False)
    base = parse_number("--base-qps", str(args.base_qps), "1.5", low=0, inclusive=False)
    try:
        return make_pattern(args.pattern, base, duration, seed=seed, trace_s=trace), seed
    except SimulationError as exc:
        flag = {"base_qps": "--base-qps", "duration": "--duration"}.get(exc.field, "--trace")
        raise UsageError(f"{flag}: {exc.what}; {exc.fix}") from None


def simulate_command(args: argparse.Namespace) -> int:
    """`compass simulate`: the policy against the static baselines on one seeded load."""
    policy_path = Path(str(args.policy))
    timeline = Path(str(args.timeline))
    _check_output("--timeline", timeline)
    plot = None if args.plot is None else Path(str(args.plot))
    if plot is not None:
        _check_output("--plot", plot)
    pattern, seed = pattern_from_args(args)
    spec = load_policy(policy_path)
    try:
        policy = spec.elastico()
    except PlanError as exc:
        raise _plan_error(exc, f"--policy {policy_path}") from None
    front = [t.profile for t in policy.plan.thresholds]
    scenario = make_scenario(pattern, seed)
    reports = compare(
        {"policy": policy}, front, scenario, spec.slo.latency_ms, spec.interval_seconds
    )
    print(
        f"compass simulate: {pattern.kind.value}, base {pattern.base_qps:g} QPS for "
        f"{pattern.duration_s:g} s (peak {pattern.peak_qps:.2f}), seed {seed}: "
        f"{scenario.requests} requests, the same arrivals for every policy; SLO "
        f"{spec.slo.latency_ms:g} ms, model {spec.threshold_model.value}"
    )
    print(comparison_table(reports))
    _write(timeline, json.dumps(timeline_document(reports, scenario), indent=1) + "\n")
    print(f"timeline: {timeline}")
    if plot is not None:
        from compass.lab import plots

        plots.save_simulation_figure(plot, policy.plan, reports, scenario)
        print(f"plot: {plot}")
    return 0
