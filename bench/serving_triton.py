"""rag-sim on a real Triton under a load spike: the live Elastico loop against static baselines.

    python bench/serving_triton.py [--time-scale 0.25] [--slos 750,1000,1500] [--seed 0]

Everything runs for real on this machine: tritonserver (nvidia-pytriton's CPU build) serving
rag-sim, the open-loop load generator, the latency profiler and Elastico's live loop switching
the router over gRPC. Time is scaled down by --time-scale (service times, arrival rates, SLO,
cooldowns and the decision interval together), which leaves the queueing unchanged in scaled
time. Every run replays the same seeded arrivals and service-time luck (the simulator's
scenario), so the static baselines, the live policy and the simulator's prediction are paired.
Figures are reported at the paper's scale (ms and QPS divided back by the time scale).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from compass.api.paretopolicy import Hysteresis, spec_for_plan
from compass.dataplane.metrics import TritonQueueDepth
from compass.dataplane.profiler import ProfileSettings, profile_configurations
from compass.dataplane.triton import TritonRouter
from compass.domain.planner import Slo, plan_from_profiles
from compass.domain.profiles import parse_profiles
from compass.domain.simulator import compare, make_pattern, make_scenario
from compass.domain.space import config_key
from compass.lab.experiment import serve_each
from compass.lab.scenarios import (
    PAPER_FRONT,
    QUESTIONS,
    RagSimLoad,
    rag_sim_data,
    rag_sim_triton,
)


def main() -> int:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-scale", type=float, default=0.25)
    parser.add_argument("--slos", default="750,1000,1500", help="SLOs in ms at the paper's scale")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds, paper scale")
    parser.add_argument("--base-qps", type=float, default=1.5, help="paper scale")
    parser.add_argument("--profile-runs", type=int, default=40)
    parser.add_argument(
        "--runs", default="fastest,accurate,policy", help="which runs, comma-separated"
    )
    args = parser.parse_args()
    scale = args.time_scale
    slos = [float(s) for s in args.slos.split(",")]
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="compass-bench-"))
    data = rag_sim_data()
    with rag_sim_triton(workdir, scale).start(workdir) as triton:
        router = TritonRouter(triton.grpc_url)
        # Profile the front through the router, as `compass profile` does.
        configs = [
            (c, float(np.mean(data["configs"][config_key(c)]["scores"]))) for c in PAPER_FRONT
        ]
        document = profile_configurations(
            router,
            configs,
            ProfileSettings(warmup_runs=5, measured_runs=args.profile_runs),
            lambda i: {"sample": i % QUESTIONS},
        )
        profiles = parse_profiles(document)
        print(f"rag-sim on Triton 2.51 (CPU), time scale {scale:g}; profiled front (paper scale):")
        for p in profiles:
            print(
                f"  accuracy {p.accuracy:.4f}  mean {p.mean_ms / scale:6.1f} ms  "
                f"p95 {p.p95_ms / scale:6.1f} ms  {p.name}"
            )
        pattern = make_pattern(
            "spike", args.base_qps / scale, args.duration * scale, seed=args.seed
        )
        scenario = make_scenario(pattern, args.seed)
        # Already scaled: the pattern was made at the scaled rate and duration.
        load = RagSimLoad(scenario)
        arrivals = load.arrivals_s()
        print(
            f"spike: base {args.base_qps:g} QPS, x4 for the middle third, {args.duration:g} s, "
            f"{scenario.requests} requests, seed {args.seed}\n"
        )

        header = (
            f"{'SLO':>5} {'run':<9} {'compl%':>7} {'sim%':>6} {'accuracy':>8} "
            f"{'p95 ms':>7} {'failed':>6} {'switches':>8}"
        )
        print(header)
        reloads_ms: list[float] = []
        effects_ms: list[float] = []
        for slo_ms in slos:
            plan = plan_from_profiles(profiles, Slo(slo_ms * scale, 95.0), 50.0 * scale)
            spec = spec_for_plan(
                plan, Hysteresis(downscale_cooldown_seconds=5.0 * scale), interval_seconds=scale
            )
            members = [t.profile for t in plan.thresholds]
            predicted = compare(
                {"policy": spec.elastico()}, members, scenario, slo_ms * scale, interval_s=scale
            )
            for label, run in serve_each(
                router,
                plan,
                spec.elastico(),
                TritonQueueDepth(triton.metrics_url),
                arrivals,
                load.payload,
                slo_ms,
                interval_s=scale,
                time_scale=scale,
                labels=set(args.runs.split(",")),
            ):
                # Reloads are real time at any time scale; the effect is reported unscaled.
                reloads_ms += [e.reload_s * 1000 for e in run.switch_events]
                effects_ms += [e * scale * 1000 for e in run.switch_effects_s()]
                report = predicted.get(label)
                print(
                    f"{slo_ms:5.0f} {label:<9} {run.compliance:7.1f} "
                    f"{report.compliance if report else float('nan'):6.1f} "
                    f"{run.accuracy:8.4f} {run.percentile_ms(95):7.0f} "
                    f"{run.failed:6d} {run.switches:8d}"
                )
        router.close()
    if reloads_ms:
        print(
            f"\nswitches: {len(reloads_ms)}; router reload over gRPC (real ms): median "
            f"{statistics.median(reloads_ms):.0f}, max {max(reloads_ms):.0f}; decision -> first "
            f"reply served by the new configuration (real ms): median "
            f"{statistics.median(effects_ms):.0f}, max {max(effects_ms):.0f}"
        )
    print(f"wall time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
