"""What the simulator misses of `compass demo`'s static fastest run, live against predicted.

    python bench/demo_live_gap.py --profiles compass-demo/profiles.json [--time-scale 0.2]
    python bench/demo_live_gap.py --profiles compass-demo/profiles.json --sensitivity

Replays the demo's static fastest run on a local rag-sim Triton behind the demo's gate, from the
profiles a `compass demo` run wrote (no search, no profiling), on the demo's seeded spike. From
each request's send and answer times it works out the pipeline's occupancy per request (the gate
runs one pipeline at a time, in arrival order: a request holds it from the later of its arrival
and the previous answer until its own answer), and compares it with the profile the simulator
draws from. Then it simulates the same arrivals twice: on the profile (the demo's prediction) and
on the occupancy measured live (mean and p95 as a profile), against the live compliance.
--sensitivity runs no Triton: it simulates static fastest at several peaks with the fastest's
service times 3% shorter and longer, how far a few % of machine speed moves one live run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from compass.conversion import runtime_policy, spec_for_plan
from compass.dataplane.metrics import TritonQueueDepth
from compass.dataplane.triton import TritonRouter
from compass.domain.planner import Plan, Slo, plan_from_profiles
from compass.domain.profiles import parse_profiles
from compass.domain.simulator import StaticController, simulate
from compass_dev.experiment import serve_each
from compass_dev.localdemo import GATE, _set_time_scale
from compass_dev.scenarios import (
    COMPONENTS,
    DEMO_PEAK_UTILIZATION,
    PAPER_PEAK_UTILIZATION,
    RagSimLoad,
    rag_sim_triton,
    scaled_profile,
    spike_scenario,
)

SLO_MS = 1000.0
DURATION_S = 180.0


def occupancy_ms(sent_s: Sequence[float], latency_ms: Sequence[float]) -> npt.NDArray[np.float64]:
    """Each request's hold on a one-at-a-time pipeline served in arrival order (ms)."""
    order = np.argsort(sent_s)
    sent = np.asarray(sent_s)[order] * 1000.0
    finish = sent + np.asarray(latency_ms)[order]
    start = np.maximum(sent, np.concatenate(([-np.inf], finish[:-1])))
    held: npt.NDArray[np.float64] = finish - start
    return held


def sensitivity(plan: Plan) -> None:
    """Static fastest's simulated compliance at each peak, its service times scaled."""
    fastest = plan.thresholds[0].profile
    print("peak   compliance at service x0.97 / x1.00 / x1.03")
    for peak in sorted({0.6, DEMO_PEAK_UTILIZATION, 0.7, PAPER_PEAK_UTILIZATION}):
        scenario = spike_scenario(plan, DURATION_S, 0, peak=peak)
        shown = []
        for factor in (0.97, 1.0, 1.03):
            member = scaled_profile(fastest, factor)
            report = simulate(StaticController(member.name, 0), [member], scenario, SLO_MS)
            shown.append(f"{report.compliance:5.1f}%")
        print(f"{peak:4.0%}   " + " / ".join(shown))


def main(argv: Sequence[str] | None = None) -> int:
    """Serve static fastest live, then print the occupancy and the two predictions."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", required=True, help="profiles.json of a compass demo run")
    parser.add_argument("--time-scale", type=float, default=0.2)
    parser.add_argument("--sensitivity", action="store_true", help="simulate only (see above)")
    args = parser.parse_args(argv)
    profiles = parse_profiles(json.loads(Path(args.profiles).read_text(encoding="utf-8")))
    plan = plan_from_profiles(profiles, Slo(SLO_MS), 50.0)
    if args.sensitivity:
        sensitivity(plan)
        return 0
    fastest = plan.thresholds[0].profile
    scenario = spike_scenario(plan, DURATION_S, 0)
    scale = args.time_scale
    live_plan = plan_from_profiles(
        [scaled_profile(p, scale) for p in profiles], Slo(SLO_MS * scale), 50 * scale
    )
    policy = runtime_policy(spec_for_plan(live_plan))
    with tempfile.TemporaryDirectory() as workdir:
        triton = rag_sim_triton(
            Path(workdir), 0, router_instances=GATE.instances, pipeline_slots=GATE.slots
        )
        with triton.start(Path(workdir)):
            router = TritonRouter(triton.grpc_url)
            for component in COMPONENTS:
                _set_time_scale(router, component, scale)
            load = RagSimLoad(scenario)
            [(_, run)] = list(
                serve_each(
                    router,
                    live_plan,
                    policy,
                    TritonQueueDepth(triton.metrics_url, router.model),
                    load.arrivals_s(scale),
                    load.payload,
                    SLO_MS,
                    interval_s=1.0,
                    time_scale=scale,
                    offered_qps=load.offered_qps,
                    labels=("fastest",),
                )
            )
            router.close()
    answered = run.answered
    held = occupancy_ms([r.sent_s for r in answered], [r.latency_s * 1000 for r in answered])
    alone = held[held > 0]
    print(f"profile of the fastest: mean {fastest.mean_ms:.1f} ms, p95 {fastest.p95_ms:.1f} ms")
    print(
        f"live occupancy per request: mean {alone.mean():.1f} ms, p50 {np.percentile(alone, 50):.1f}, "
        f"p95 {np.percentile(alone, 95):.1f} ({len(alone)} requests)"
    )
    measured = replace(
        fastest,
        mean_ms=float(alone.mean()),
        p95_ms=float(np.percentile(alone, 95)),
        p50_ms=float(np.percentile(alone, 50)),
        p99_ms=None,
        std_ms=None,
    )
    print(f"live compliance: {run.compliance:.1f}%")
    for label, member in (("profile", fastest), ("occupancy measured live", measured)):
        report = simulate(StaticController(member.name, 0), [member], scenario, SLO_MS)
        print(f"simulated on the {label}: {report.compliance:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
