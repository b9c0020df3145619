"""Where the default serving loses compliance to static fastest: the edge of a clump.

A clump is requests that arrive at one instant (Mooncake's trace stamps ~10 at a time) and find
the pipeline idle under static fastest. Its edge is the first request static fastest's likely
schedule has late (position floor(SLO / the fastest's likely time), counted from 0): it is in
time only when the services ahead of it and its own run short, which the profile's spread puts
at P(sum of edge + 1 services <= SLO). For each window of one trace at one utilisation, on the
same arrivals, this prints what static fastest and the policy `compass plan` writes (built as
serving_default.py builds it) did at each clump's edge, and every request the policy lost that
static fastest served in time: its position in its clump, whether admission refused it, what was
left of its deadline at take-up, and how much later than static fastest it was taken up.

    .venv/bin/python bench/clump_edge.py [--trace mooncake-conversation] [--utilisation 0.4]
        [--set held-out,tuning] [--slo-ms 1000]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from compass.conversion import simulate_serving
from compass.domain.arrivals import make_scenario
from compass.domain.planner import Slo, plan_from_profiles
from compass.domain.podmodel import PodModel
from compass.domain.simulator import RunReport, StaticController, simulate
from compass.domain.traces import TRACE_NAMES, window_pattern
from compass.examples import load_trace
from serving_default import (
    PAPER_PROFILES,
    SLACK_BUFFER_MS,
    WINDOW_S,
    WINDOW_SEED,
    WINDOWS,
    Cell,
    cell_profiles,
    spec_of,
)
from trace_windows import trace_windows

# Draws of the edge's chance from the fastest member's service-time distribution.
CHANCE_DRAWS = 20_000


@dataclass(frozen=True)
class Lost:
    """A request static fastest served in time and the policy did not."""

    position: int
    refused: bool
    left_ms: float
    later_ms: float
    slower_ahead: int


@dataclass(frozen=True)
class Edges:
    """One window's clumps and their edges under both runs."""

    clumps: int
    fastest_kept: int
    policy_kept: int
    chance: float
    edge: int
    lost: tuple[Lost, ...]
    compliance: tuple[float, float]


def clump_edges(policy: RunReport, fastest: RunReport, edge: int) -> Edges:
    """The clumps longer than ``edge`` that find static fastest's pipeline idle, how often each
    run kept their edge in time, and every request the policy lost to static fastest."""
    arrivals, slo_s = policy.arrivals_s, policy.slo_ms / 1000
    policy_ok = (policy.finishes_s - arrivals <= slo_s) & ~policy.dropped
    fastest_ok = fastest.finishes_s - arrivals <= slo_s
    _, first, size = np.unique(arrivals, return_index=True, return_counts=True)
    clumps = fastest_kept = policy_kept = 0
    for start, count in zip(first.tolist(), size.tolist(), strict=True):
        if count > edge and fastest.starts_s[start] == arrivals[start]:
            clumps += 1
            fastest_kept += bool(fastest_ok[start + edge])
            policy_kept += bool(policy_ok[start + edge])
    lost = []
    for request in np.flatnonzero(fastest_ok & ~policy_ok).tolist():
        position = int(np.searchsorted(arrivals, arrivals[request]))
        ahead = slice(position, request)
        lost.append(
            Lost(
                position=request - position,
                refused=bool(policy.dropped[request]),
                left_ms=(arrivals[request] + slo_s - policy.starts_s[request]) * 1000,
                later_ms=(policy.starts_s[request] - fastest.starts_s[request]) * 1000,
                slower_ahead=int(np.count_nonzero(policy.configs[ahead] > 0)),
            )
        )
    return Edges(
        clumps,
        fastest_kept,
        policy_kept,
        math.nan,
        edge,
        tuple(lost),
        (policy.compliance, fastest.compliance),
    )


def window_edges(cell: Cell) -> Edges:
    """Both runs on the cell's arrivals, and their clumps' edges."""
    spec = spec_of(cell)
    plan = plan_from_profiles(cell_profiles(cell), Slo(cell.slo_ms), SLACK_BUFFER_MS)
    front = [t.profile for t in plan.thresholds]
    pattern = window_pattern(
        load_trace(cell.window.trace), cell.window, cell.utilisation, front[0].mean_ms, 1
    )
    scenario = make_scenario(pattern, 0)
    policy = simulate_serving(spec, scenario, plan=plan)
    fastest = simulate(
        StaticController(front[0].name, 0), front, scenario, cell.slo_ms, pod_model=PodModel(1)
    )
    spread = front[0].distribution
    likely_ms = float(spread.quantile(spec.admission.quantile))
    edge = math.floor(cell.slo_ms / likely_ms)
    draws = np.random.default_rng(0).random((CHANCE_DRAWS, edge + 1))
    chance = float(np.mean(np.asarray(spread.quantile(draws)).sum(axis=1) <= cell.slo_ms))
    return replace(clump_edges(policy, fastest, edge), chance=chance)


def main(argv: Sequence[str] | None = None) -> int:
    """Print each window's clumps, their edges and the policy's lost requests."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake-conversation", choices=TRACE_NAMES)
    parser.add_argument("--utilisation", type=float, default=0.4)
    parser.add_argument("--set", default="held-out,tuning", help="held-out, tuning or both")
    parser.add_argument("--slo-ms", type=float, default=1000.0)
    args = parser.parse_args(argv)
    sets = trace_windows(tuple(TRACE_NAMES), WINDOWS, WINDOW_S, WINDOW_SEED)
    chosen = [s for s in args.set.split(",") if s]
    if not chosen or any(s not in ("held-out", "tuning") for s in chosen):
        parser.error(f"--set {args.set!r}: give held-out, tuning or held-out,tuning")
    for name in chosen:
        windows = sets.held_out if name == "held-out" else sets.tuning
        for window in (w for w in windows if w.trace == args.trace):
            cell = Cell("default", window, args.utilisation, args.slo_ms, str(PAPER_PROFILES))
            found = window_edges(cell)
            (policy, fastest), lost = found.compliance, found.lost
            print(
                f"\n{name} {window.trace}@{args.utilisation:g}+{window.start_s:.0f}s: "
                f"policy {policy:.2f}% vs static fastest {fastest:.2f}% "
                f"({policy - fastest:+.2f} points); {len(lost)} lost to static fastest"
            )
            print(
                f"  clumps longer than {found.edge} at an idle pipeline: {found.clumps}; "
                f"request {found.edge} (the edge) in time: static fastest {found.fastest_kept} "
                f"({found.fastest_kept / max(found.clumps, 1):.0%}; the spread gives "
                f"{found.chance:.0%}), policy {found.policy_kept}"
            )
            at_edge = sum(lost_one.position == found.edge for lost_one in lost)
            refused = [x for x in lost if x.refused]
            served = [x for x in lost if not x.refused]
            print(f"  lost at the edge: {at_edge}/{len(lost)}; refused by admission {len(refused)}")
            for label, group in (("refused", refused), ("served late", served)):
                if group:
                    left = [x.left_ms for x in group]
                    later = [x.later_ms for x in group]
                    slower = [x.slower_ahead for x in group]
                    print(
                        f"  {label}: {min(left):.0f}-{max(left):.0f} ms left at take-up, taken "
                        f"up {min(later):.0f}-{max(later):.0f} ms after static fastest, "
                        f"{min(slower)}-{max(slower)} of the clump ahead on a slower member"
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
