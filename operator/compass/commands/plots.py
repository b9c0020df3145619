"""Figures for `compass plan`, `compass simulate` and the demo (matplotlib, Agg: no display)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from compass.console import UsageError
from compass.domain.planner import Plan
from compass.domain.profiles import LatencyProfile
from compass.domain.simulator import Tick

BASELINE_STYLE = {"fastest": "tab:green", "middle": "tab:orange", "accurate": "tab:red"}
POLICY_COLOUR = "tab:blue"
MISSING_MATPLOTLIB = (
    "--plot needs matplotlib, which is not installed: pip install 'compass-operator[plot]' "
    "(compass demo's figures need it too)"
)


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, imported on first use: matplotlib is the `plot`
    extra, absent from the operator's image, whose commands never draw."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(MISSING_MATPLOTLIB) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class TimelineRun(Protocol):
    """What a timeline draws of a run: a simulated RunReport or a live run on Triton."""

    @property
    def slo_ms(self) -> float: ...
    @property
    def ticks(self) -> Sequence[Tick]: ...
    @property
    def arrivals_s(self) -> Any: ...
    @property
    def latencies_ms(self) -> Any: ...
    @property
    def compliance(self) -> float: ...


def draw_front(axes: Any, plan: Plan, profiles: Sequence[LatencyProfile] = ()) -> None:
    """Accuracy against tail latency: every profile, the front, the SLO and the thresholds."""
    percentile = plan.slo.percentile
    if profiles:
        axes.scatter(
            [p.latency_at(percentile) for p in profiles],
            [p.accuracy for p in profiles],
            s=12,
            color="lightgrey",
            label="profiled",
        )
    tails = [t.tail_ms for t in plan.thresholds]
    accuracies = [t.profile.accuracy for t in plan.thresholds]
    axes.plot(tails, accuracies, "-o", color=POLICY_COLOUR, label="Pareto front")
    for index, t in enumerate(plan.thresholds):
        limits = f"#{index} stay<={t.stay_max_queue if t.stay_max_queue is not None else '-'}"
        if t.stay_max_qps is not None:
            limits += f", <={t.stay_max_qps:.1f}/s"
        if not t.eligible:
            limits += " (never)"
        axes.annotate(
            limits, (t.tail_ms, t.profile.accuracy), textcoords="offset points", xytext=(6, -10)
        )
    axes.axvline(plan.slo.latency_ms, color="black", linestyle="--", label="SLO")
    axes.set_xlabel(f"p{percentile:g} service time (ms)")
    axes.set_ylabel("accuracy")
    axes.set_title(f"front and thresholds ({plan.model.value}, SLO {plan.slo.latency_ms:g} ms)")
    axes.legend(loc="lower right", fontsize="small")


def save_plan_figure(path: Path, plan: Plan, profiles: Sequence[LatencyProfile]) -> None:
    """The front with its thresholds, as an image."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(8, 5.5))
    draw_front(axes, plan, profiles)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def draw_timeline(
    axes: Sequence[Any], plan: Plan, reports: Mapping[str, TimelineRun], label: str
) -> None:
    """Four panels: load, queue depth, active configuration, latency against the SLO."""
    load, queue, active, latency = axes
    report = reports[label]
    times = np.array([t.time_s for t in report.ticks])
    load.plot(times, [t.offered_qps for t in report.ticks], color="black", label="offered")
    load.plot(times, [t.observed_qps for t in report.ticks], color="grey", label="observed (5 s)")
    load.set_ylabel("requests/s")
    load.legend(loc="upper right", fontsize="small")
    queue.step(times, [t.queue_depth for t in report.ticks], where="post", color=POLICY_COLOUR)
    queue.set_ylabel("queue depth")
    active.step(times, [t.active for t in report.ticks], where="post", color=POLICY_COLOUR)
    active.set_yticks(range(len(plan.thresholds)))
    active.set_yticklabels([f"#{i}" for i in range(len(plan.thresholds))])
    active.set_ylabel("configuration")
    for name, other in reports.items():
        if name != label:
            latency.scatter(
                other.arrivals_s,
                other.latencies_ms,
                s=3,
                color=BASELINE_STYLE.get(name, "grey"),
                alpha=0.25,
                label=f"{name} ({other.compliance:.1f}%)",
            )
    latency.scatter(
        report.arrivals_s,
        report.latencies_ms,
        s=4,
        color=POLICY_COLOUR,
        label=f"{label} ({report.compliance:.1f}%)",
    )
    latency.axhline(report.slo_ms, color="black", linestyle="--", label="SLO")
    latency.set_yscale("log")
    latency.set_ylabel("latency (ms)")
    latency.set_xlabel("time (s)")
    latency.legend(loc="upper right", fontsize="x-small", markerscale=3)


def save_timeline_figure(
    path: Path,
    plan: Plan,
    reports: Mapping[str, TimelineRun],
    title: str,
    label: str = "policy",
    profiles: Sequence[LatencyProfile] = (),
) -> None:
    """The front (left) beside one run's timeline, the others' latencies behind it (right)."""
    plt = pyplot()
    figure = plt.figure(figsize=(15, 9))
    grid = figure.add_gridspec(4, 2, width_ratios=(1, 1.6))
    draw_front(figure.add_subplot(grid[:, 0]), plan, profiles)
    first = figure.add_subplot(grid[0, 1])
    rest = [figure.add_subplot(grid[i, 1], sharex=first) for i in range(1, 4)]
    draw_timeline([first, *rest], plan, reports, label)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
