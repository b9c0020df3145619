"""A hindsight oracle: what a policy that knew the arrivals in advance could have served.

Strategies are measured against it (bench/serving_sim.py): a share of the oracle's accuracy gain
over static fastest says how much of what was possible a strategy won, which a share of the
fastest-to-most-accurate gap cannot say (in a tight cell even hindsight wins little of that).

Per window of ``window_s`` seconds the oracle serves the window's arrivals with one mix of the
front, the most accurate mix that keeps the window's requests within the SLO at least as often
as static fastest does (the same requests, pods and service-time luck) and leaves no more work
queued at the window's end than static fastest did, or one SLO's worth per pod if that is more
(without that, in an overload where static fastest misses every request of a window, any mix
would "match" it and leave a longer queue to the windows after). Maximising accuracy
under a budget on the mean service time is a linear programme over the front whose optimum is
a mix of two neighbours on the upper concave hull of (mean service time, accuracy), so the
oracle searches one position along that hull, in the routers' weight steps. A window's choice
also leaves a backlog for the next: a position is taken only if the next window, served by the
fastest member, still meets its own target (one window of lookahead).

On pods whose router queue is late-last (``late_after_s``, ``PodModel.late_after_s``) both
the target and the oracle run on such queues: a request that would wait past it holds no
server (see ``_serve``).

This is a strong heuristic in hindsight, not a proven optimum: the search is greedy in time
with one window of lookahead, and it assumes that more accuracy never meets the SLO more often
(true on average, not request by request). Switches are instant and the configuration is chosen
by arrival window. A strategy that beats it on both compliance and accuracy shows it wrong; the
bench checks for that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from compass.domain.mix import Mix, SmoothWeighting, accuracy_hull, hull_mixes, mix_weighting
from compass.domain.profiles import LatencyProfile
from compass.domain.simulator import Scenario, SimulationError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
DEFAULT_WINDOW_S = 5.0


@dataclass(frozen=True)
class OracleReport:
    """The oracle's run: its figures and the mix it chose for each window."""

    compliance: float
    mean_accuracy: float
    requests: int
    window_s: float
    mixes: tuple[Mix, ...]


@dataclass
class _Pods:
    """Each pod's FIFO server: when it is free again."""

    free_at: list[float]

    def copy(self) -> _Pods:
        return _Pods(list(self.free_at))

    def backlog_s(self, at: float) -> float:
        """Seconds of work the pods still hold at this time."""
        return sum(max(free - at, 0.0) for free in self.free_at)


def _serve(
    requests: IntArray,
    mix: Mix,
    pods: _Pods,
    arrivals: FloatArray,
    assigned: IntArray,
    service_s: FloatArray,
    slo_s: float,
    record: tuple[IntArray, FloatArray] | None = None,
    late_after_s: float = math.inf,
) -> int:
    """Serve these requests (in arrival order) with the mix; returns how many met the SLO.

    ``record``: arrays to write each request's configuration and latency into.
    ``late_after_s``: a request that would wait longer is late; a late-last queue serves it
    after every request in time, which the oracle counts as served then but holding no server
    (its work done in time nobody needed): optimistic, as a bound should be.
    """
    dealers: dict[int, SmoothWeighting[int]] = {}
    met = 0
    for request in requests:
        pod = int(assigned[request])
        if mix.blend is None:
            config = mix.base
        else:
            dealer = dealers.get(pod)
            if dealer is None:
                dealer = dealers[pod] = mix_weighting(mix)
            config = dealer.pick()
        begin = max(float(arrivals[request]), pods.free_at[pod])
        finish = begin + float(service_s[config, request])
        if begin - float(arrivals[request]) <= late_after_s:
            pods.free_at[pod] = finish
        latency = finish - float(arrivals[request])
        met += latency <= slo_s
        if record is not None:
            record[0][request] = config
            record[1][request] = latency
    return met


def hindsight_oracle(
    front: Sequence[LatencyProfile],
    scenario: Scenario,
    slo_ms: float,
    *,
    pods: int = 1,
    window_s: float = DEFAULT_WINDOW_S,
    late_after_s: float | None = None,
) -> OracleReport:
    """The oracle's run over the scenario (see the module docstring); ``late_after_s``: on
    pods with a late-last queue (``PodModel.late_after_s``), static fastest's included."""
    if not window_s > 0 or not math.isfinite(window_s):
        raise SimulationError("window_s", f"{window_s:g} is not > 0", "give e.g. 5")
    hull = accuracy_hull(front)
    arrivals = scenario.arrivals_s
    n = len(arrivals)
    slo_s = slo_ms / 1000
    service_s = np.stack([p.distribution.quantile(scenario.luck) / 1000 for p in front])
    assigned = scenario.pods_of(pods)
    window_of = np.floor(arrivals / window_s).astype(np.int64)
    windows = [np.flatnonzero(window_of == w) for w in range(int(window_of.max(initial=-1)) + 1)]
    fastest = Mix(0)
    late = math.inf if late_after_s is None else late_after_s

    def serve(
        requests: IntArray, mix: Mix, free: _Pods, record: tuple[IntArray, FloatArray] | None = None
    ) -> int:
        return _serve(requests, mix, free, arrivals, assigned, service_s, slo_s, record, late)

    # Static fastest's met count per window: the target each window must reach.
    reference = _Pods([0.0] * pods)
    targets: list[int] = []
    # And the work it leaves at the window's end, or one SLO per pod if that is more.
    backlogs: list[float] = []
    for index, requests in enumerate(windows):
        targets.append(serve(requests, fastest, reference))
        backlogs.append(max(reference.backlog_s((index + 1) * window_s), slo_s * pods))
    positions = hull_mixes(hull)
    state = _Pods([0.0] * pods)
    configs = np.zeros(n, dtype=np.int64)
    latencies = np.zeros(n)
    chosen: list[Mix] = []

    def feasible(index: int, position: Mix) -> bool:
        trial = state.copy()
        met = serve(windows[index], position, trial)
        if met < targets[index] or trial.backlog_s((index + 1) * window_s) > backlogs[index]:
            return False
        if index + 1 == len(windows):
            return True
        after = serve(windows[index + 1], fastest, trial)
        return after >= targets[index + 1]

    for index, requests in enumerate(windows):
        best = 0
        if len(requests):
            low, high = 0, len(positions) - 1
            if feasible(index, positions[high]):
                best = high
            else:
                # The highest feasible position, assuming feasibility falls with accuracy.
                while low < high - 1:
                    middle = (low + high) // 2
                    low, high = (
                        (middle, high) if feasible(index, positions[middle]) else (low, middle)
                    )
                best = low
        mix = positions[best]
        chosen.append(mix)
        serve(requests, mix, state, (configs, latencies))
    met = int(np.sum(latencies <= slo_s))
    accuracies = np.array([p.accuracy for p in front])
    return OracleReport(
        compliance=100.0 * met / n if n else 100.0,
        mean_accuracy=float(accuracies[configs].mean()) if n else math.nan,
        requests=n,
        window_s=window_s,
        mixes=tuple(chosen),
    )
