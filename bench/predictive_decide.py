"""The predictive strategy's CPU per decision: ms per Predictive.decide on realistic observations.

Policies of one three-member front (they share its draws and miss-share cache, as on the
operator's scheduler), each fed once a second by its own Poisson arrivals (so its rate keeps
moving, the case the cache cannot help) and now and then a queue. Prints ms per decision and a
digest of every decision made, so that two versions of the code can be compared for identical
decisions as well as for speed.

--idle: instead, policies whose arrivals counter never moves, looked at about once a second at
wall-clock times a few ms apart (the steady ticks of bench/operator_scale.py's policies: their
rate bound moves a little every look as their window's length does, so nothing is reused).

    .venv/bin/python bench/predictive_decide.py [--policies 40] [--seconds 60] [--idle]
                                                [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import pstats
import time

import numpy as np

from compass.domain.planner import Slo, ThresholdModel, plan_thresholds
from compass.domain.policy import Observation
from compass.domain.predictive import Predictive
from compass_dev.scenarios import normal_profile

FRONT = [
    normal_profile("fast", 0.70, 100, 15),
    normal_profile("mid", 0.80, 150, 20),
    normal_profile("slow", 0.90, 250, 30),
]


# The operator bench's front (bench/operator_common.py, rag_sim_policy): two members of a few
# tens of ms (p95 23 and 37.5 ms), SLO 150 ms, slack 20 ms.
IDLE_FRONT = [
    normal_profile("fastest", 0.8318, 20.5, 1.52),
    normal_profile("accurate", 0.8604, 33.5, 2.43),
]
# An operator's wall clock, and how far apart its policies' looks fall within a tick.
EPOCH_S = 1_800_000_000.0
SPREAD_S = 0.05


def run(policies: int, seconds: int, idle: bool = False) -> tuple[float, int, str]:
    """(seconds spent in decide, decisions, digest of every decision's mix and reason)."""
    if idle:
        plan = plan_thresholds(IDLE_FRONT, Slo(150), 20, ThresholdModel.TAIL)
    else:
        plan = plan_thresholds(FRONT, Slo(1000), 50, ThresholdModel.TAIL)
    rng = np.random.default_rng(7)
    deciders = [Predictive(plan) for _ in range(policies)]
    states = [p.initial_state(0.0) for p in deciders]
    qps = rng.uniform(0.5, 6.0, size=policies)
    totals = np.zeros(policies) if not idle else np.ones(policies)
    digest = hashlib.sha256()
    spent = 0.0
    decisions = 0
    for t in range(1, seconds + 1):
        if not idle:
            totals += rng.poisson(qps)
        queues = np.where(rng.uniform(size=policies) < 0.1, rng.integers(1, 8, policies), 0)
        if idle:
            queues[:] = 0
        for i, policy in enumerate(deciders):
            now = EPOCH_S + t + rng.uniform(0, SPREAD_S) if idle else float(t)
            observation = Observation(now, float(queues[i]), arrivals_total=float(totals[i]))
            start = time.process_time()
            decision, states[i] = policy.decide(observation, states[i], now)
            spent += time.process_time() - start
            decisions += 1
            digest.update(f"{decision.mix}|{decision.action}|{decision.reason}\n".encode())
    return spent, decisions, digest.hexdigest()


def main() -> None:
    """Run, print ms per decision and the decisions' digest."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", type=int, default=40)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--idle", action="store_true", help="policies whose counter never moves")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top entries")
    args = parser.parse_args()
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    spent, decisions, digest = run(args.policies, args.seconds, args.idle)
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
    print(
        f"{decisions} decisions ({args.policies} policies x {args.seconds} s"
        f"{', idle' if args.idle else ''}): "
        f"{1000 * spent / decisions:.3f} ms of CPU per decide; decisions digest {digest[:16]}"
    )


if __name__ == "__main__":
    main()
