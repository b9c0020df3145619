"""Why `compass demo --cluster`'s policy serves so little of the fastest-to-accurate gap.

    python bench/demo_gap.py [--policy compass-demo/policy.yaml] [--time-scale 0.25]
                             [--seeds 0] [--oracle] [--binding-lags 0.3/2,0.5/2]

Issue 42 asks the demo's default policy for >= 30% of the fastest-to-accurate gap with
compliance >= static fastest - 1.0. This replays the demo's own prediction (the ParetoPolicy
`compass demo --cluster` wrote, its front and hysteresis at the paper's scale, the seeded spike,
the policy starting where the live run starts) in the simulator, then once per suspect with that
one thing changed: the downscale cooldown, the cooldown exponent, the slack buffer, the
confidence and windows of the rate test that leaves a member, the metrics path's age, the
strategy. Each row: compliance against static fastest, share of the gap, and that share before,
during and after the spike. Last, what no causal policy can beat: the best switch-only schedule
in hindsight (a member before the spike, the fastest through it, a member again some seconds
after it ends), and with --oracle the hindsight oracle (mixes, 5 s windows). With
--binding-lags, late binding as `compass demo --cluster --late-binding` serves it, once per lag
cap (share/reserve): the binding simulator on the gated routers' view
(compass_dev.clusterdemo_report.binding_prediction), on the same front and arrivals.

Changing a module constant of compass.domain.elastico here is a what-if, not a setting the
operator has; nothing here changes a default.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from compass.api.paretopolicy import ParetoPolicySpec
from compass.domain import elastico
from compass.domain.oracle import hindsight_oracle
from compass.domain.planner import Plan
from compass.domain.policy import Action, Decision, Observation, PolicyState
from compass.domain.simulator import (
    FRESH,
    MetricsView,
    RunReport,
    StaticController,
    simulate,
)
from compass_dev.clusterdemo_report import (
    StartingOn,
    binding_prediction,
    unscaled_plan,
    unscaled_policy,
)
from compass_dev.clusterdemo_setup import ClusterDemoSettings, late_binding_serving
from compass_dev.scenarios import spike_scenario

DEFAULTS = ClusterDemoSettings(output_dir=Path("compass-demo"))
# Unscaled seconds after the spike's end at which the hindsight schedule is back on a member.
RETURN_DELAYS_S = (0.0, 5.0, 10.0, 20.0)


@dataclass(frozen=True)
class Variant:
    """One suspect changed: hysteresis fields (unscaled), Elastico constants, metrics, strategy."""

    label: str
    hysteresis: dict[str, float] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)
    scrape_s: float = 0.0
    strategy: str | None = None


VARIANTS = (
    Variant("as the demo runs it"),
    Variant("cooldown 5 s", {"downscaleCooldownSeconds": 5.0}),
    Variant("cooldown 2 s", {"downscaleCooldownSeconds": 2.0}),
    Variant(
        "the example's 5 s, exponent 4",
        {"downscaleCooldownSeconds": 5.0, "cooldownExponent": 4.0},
    ),
    Variant("slack buffer 0", {"slackBufferMs": 0.0}),
    Variant("leave confidence 0.95", constants={"LEAVE_CONFIDENCE": 0.95}),
    Variant("leave windows 2, 5 s", constants={"LEAVE_WINDOWS_S": (2.0, 5.0)}),
    Variant("enter confidence 0.5", constants={"ENTER_CONFIDENCE": 0.5}),
    Variant(
        "cooldown 5 s, leave 0.95",
        {"downscaleCooldownSeconds": 5.0},
        {"LEAVE_CONFIDENCE": 0.95},
    ),
    Variant(
        "cooldown 2 s, leave 0.99, slack 0",
        {"downscaleCooldownSeconds": 2.0, "slackBufferMs": 0.0},
        {"LEAVE_CONFIDENCE": 0.99},
    ),
    Variant("queue via Prometheus, 2 s scrape", scrape_s=2.0),
    Variant("queue via Prometheus, 15 s scrape", scrape_s=15.0),
    Variant("split, cooldown 5 s", {"downscaleCooldownSeconds": 5.0}, strategy="split"),
)
SCALED_FIELDS = {"downscaleCooldownSeconds", "upscaleCooldownSeconds", "slackBufferMs"}


@contextlib.contextmanager
def constants(changed: dict[str, Any]) -> Iterator[None]:
    """Elastico's module constants changed for the block (it reads them at each decision)."""
    saved = {name: getattr(elastico, name) for name in changed}
    try:
        for name, value in changed.items():
            setattr(elastico, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(elastico, name, value)


def variant_spec(spec: dict[str, Any], variant: Variant, scale: float) -> ParetoPolicySpec:
    """The demo's policy spec with the variant's hysteresis and strategy (times scaled)."""
    changed = {**spec, "hysteresis": dict(spec.get("hysteresis") or {})}
    for name, value in variant.hysteresis.items():
        changed["hysteresis"][name] = value * scale if name in SCALED_FIELDS else value
    if variant.strategy is not None:
        changed["strategy"] = variant.strategy
    return ParetoPolicySpec.model_validate(changed)


@dataclass(frozen=True)
class Scripted:
    """A switch-only schedule in hindsight: ``before`` until the spike starts (plus one
    look), the fastest through it, ``after`` from ``back_at`` on."""

    plan: Plan
    before: int
    after: int
    leave_at: float
    back_at: float

    def _member(self, now: float) -> int:
        if now < self.leave_at:
            return self.before
        return self.plan.eligible[0] if now < self.back_at else self.after

    def initial_state(self, now: float) -> PolicyState:
        """On the member of the schedule's start."""
        return PolicyState(active=self.plan.names[self._member(now)], active_since=now)

    def decide(
        self, observation: Observation | None, state: PolicyState, now: float
    ) -> tuple[Decision, PolicyState]:
        """The schedule's member now."""
        index = self._member(now)
        name = self.plan.names[index]
        action = Action.HOLD if state.active == name else Action.FASTER
        return Decision(name, index, action, "scripted"), PolicyState(active=name)


def gap_share(report: RunReport, fastest: RunReport, accurate: RunReport) -> float:
    """The accuracy served above static fastest's, as % of the most accurate's above it."""
    span = accurate.mean_accuracy - fastest.mean_accuracy
    return 100 * (report.mean_accuracy - fastest.mean_accuracy) / span


def by_third(report: RunReport, fastest: RunReport, accurate: RunReport) -> list[float]:
    """The gap share among the requests that arrived before, during and after the spike."""
    span = accurate.mean_accuracy - fastest.mean_accuracy
    end = report.arrivals_s.max() if report.requests else 0.0
    shares = []
    for k in range(3):
        low, high = k * DEFAULTS.duration_s / 3, (k + 1) * DEFAULTS.duration_s / 3
        inside = (report.arrivals_s >= low) & (report.arrivals_s < (high if k < 2 else end + 1))
        served = np.asarray(report.accuracies)[report.configs[inside & ~report.dropped]]
        shares.append(100 * (float(served.mean()) - fastest.mean_accuracy) / span)
    return shares


def _variant_row(
    label: str, reports: dict[int, RunReport], statics: dict[int, tuple[RunReport, RunReport]]
) -> str:
    """One variant's line: compliance against static fastest and its share of the gap, over
    the seeds and by third of the spike (``statics``: each seed's fastest and most accurate)."""
    deltas, shares, thirds = [], [], []
    for seed, report in reports.items():
        fastest, accurate = statics[seed]
        deltas.append(report.compliance - fastest.compliance)
        shares.append(gap_share(report, fastest, accurate))
        thirds.append(by_third(report, fastest, accurate))
    return (
        f"{label:<34} {summary(deltas, '+.2f'):>22} {summary(shares, '.1f'):>14} "
        f"{' / '.join(f'{statistics.mean(t):.0f}' for t in zip(*thirds, strict=True)):>40}"
    )


def run(args: argparse.Namespace) -> None:
    document = yaml.safe_load(Path(args.policy).read_text(encoding="utf-8"))
    raw = document.get("spec", document)
    scale = args.time_scale
    seeds = [int(s) for s in args.seeds.split(",")]
    base = ParetoPolicySpec.model_validate(raw)
    plan, front = unscaled_plan(base, scale)
    top = plan.eligible[-1]
    slo_ms = base.slo.latency_ms / scale
    print(
        f"{args.policy}: {len(front)} members, eligible {list(plan.eligible)}, SLO {slo_ms:g} ms, "
        f"look every {base.interval_seconds / scale:g} s; spike seeds {seeds}"
    )
    scenarios = {seed: spike_scenario(plan, DEFAULTS.duration_s, seed) for seed in seeds}
    statics = {
        seed: tuple(
            simulate(StaticController(front[i].name, i), front, scenario, slo_ms)
            for i in (0, len(front) - 1)
        )
        for seed, scenario in scenarios.items()
    }
    print(
        f"{'variant':<34} {'compliance - fastest':>22} {'gap %':>14} "
        f"{'gap % before / during / after the spike':>40}"
    )
    for variant in VARIANTS:
        spec = variant_spec(raw, variant, scale)
        vplan, vfront = unscaled_plan(spec, scale)
        view = MetricsView(variant.scrape_s) if variant.scrape_s else FRESH
        with constants(variant.constants):
            reports = {
                seed: simulate(
                    StartingOn(unscaled_policy(spec, vplan, scale), top),
                    vfront,
                    scenario,
                    slo_ms,
                    interval_s=spec.interval_seconds / scale,
                    metrics_view=view,
                )
                for seed, scenario in scenarios.items()
            }
        print(_variant_row(variant.label, reports, statics))
    for share, reserve in args.binding_lags:
        spec = ParetoPolicySpec.model_validate({**raw, **late_binding_serving(share, reserve)})
        reports = {
            seed: binding_prediction(spec, plan, front, scenario, slo_ms, scale)
            for seed, scenario in scenarios.items()
        }
        print(_variant_row(f"late binding, lag cap {share:g}/{reserve}", reports, statics))
    print(
        "\nthe best switch-only schedule in hindsight (member before / after the spike; the "
        "fastest through it, leaving one look after it starts): gap % at "
        + ", ".join(f"+{d:g} s" for d in RETURN_DELAYS_S)
        + " after its end"
    )
    third = DEFAULTS.duration_s / 3
    look = base.interval_seconds / scale
    for before, after in ((top, top), (top - 1, top - 1)):
        if before not in plan.eligible:
            continue
        rows = []
        for delay in RETURN_DELAYS_S:
            deltas, shares = [], []
            for seed, scenario in scenarios.items():
                fastest, accurate = statics[seed]
                script = Scripted(plan, before, after, third + look, 2 * third + delay)
                report = simulate(script, front, scenario, slo_ms, interval_s=look)
                deltas.append(report.compliance - fastest.compliance)
                shares.append(gap_share(report, fastest, accurate))
            rows.append(f"{summary(shares, '.1f')} ({summary(deltas, '+.2f')})")
        print(f"  #{before} / #{after}: " + ", ".join(rows))
    if args.oracle:
        shares, deltas = [], []
        for seed, scenario in scenarios.items():
            fastest, accurate = statics[seed]
            oracle = hindsight_oracle(front, scenario, slo_ms)
            span = accurate.mean_accuracy - fastest.mean_accuracy
            shares.append(100 * (oracle.mean_accuracy - fastest.mean_accuracy) / span)
            deltas.append(oracle.compliance - fastest.compliance)
        print(
            f"the hindsight oracle (mixes, 5 s windows): gap {summary(shares, '.1f')}%, "
            f"compliance - fastest {summary(deltas, '+.2f')}"
        )


def summary(values: Sequence[float], spec: str) -> str:
    """One value, or the mean and the worst (lowest) of several."""
    if len(values) == 1:
        return format(values[0], spec)
    return f"{format(statistics.mean(values), spec)} (min {format(min(values), spec)})"


def lag_caps(text: str) -> list[tuple[float, int]]:
    """--binding-lags: share/reserve pairs, comma-separated."""
    caps = []
    for part in text.split(","):
        share, _, reserve = part.partition("/")
        try:
            caps.append((float(share), int(reserve or 0)))
        except ValueError as error:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not SHARE/RESERVE; give e.g. 0.3/2,0.5/2"
            ) from error
    return caps


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--policy",
        default=str(DEFAULTS.output_dir / "policy.yaml"),
        help="the ParetoPolicy compass demo --cluster wrote (its --output-dir/policy.yaml)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=DEFAULTS.time_scale,
        help="the demo's --time-scale (the policy's times are divided by it)",
    )
    parser.add_argument(
        "--seeds", default=str(DEFAULTS.load_seed), help="spike seeds, comma-separated"
    )
    parser.add_argument("--oracle", action="store_true", help="also the hindsight oracle")
    parser.add_argument(
        "--binding-lags",
        type=lag_caps,
        default=[],
        metavar="S/R,...",
        help="also late binding as `compass demo --cluster --late-binding` serves it, once per "
        "lag cap: its share of the SLO / the fastest services reserved (e.g. 0.3/2,0.5/2)",
    )
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
