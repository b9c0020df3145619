"""Yardsticks for the strategies: what a policy that knew the arrivals, or the load, could serve
(a strong heuristic, not a proven optimum). Why and how: docs/method.md, "Oracles"."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from compass.domain.arrays import FloatArray, IntArray
from compass.domain.arrivals import Scenario, SimulationError
from compass.domain.mix import (
    Mix,
    SmoothWeighting,
    accuracy_hull,
    hull_mixes,
    mix_weighting,
    most_accurate,
)
from compass.domain.profiles import LatencyProfile

DEFAULT_WINDOW_S = 5.0
# A request's routed member is replaced at dispatch (front index -> front index).
Dispatch = Callable[[float, int], int]


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


def hindsight_oracle(
    front: Sequence[LatencyProfile],
    scenario: Scenario,
    slo_ms: float,
    *,
    pods: int = 1,
    window_s: float = DEFAULT_WINDOW_S,
    late_after_s: float | None = None,
) -> OracleReport:
    """The oracle's run over the scenario; ``late_after_s``: on pods with a late-last queue."""
    _check_window(window_s)
    real = _Draw.of(front, scenario, pods, window_s)
    late = math.inf if late_after_s is None else late_after_s
    # In hindsight the only draw is the real one.
    return _search(front, real, (real,), _Rules(slo_ms / 1000, pods, window_s, late_after_s=late))


@dataclass(frozen=True)
class _Rules:
    """How the oracles serve: the SLO (s), pods, window, and the routers' rules."""

    slo_s: float
    pods: int
    window_s: float
    dispatch: Dispatch | None = None
    late_after_s: float = math.inf


def _check_window(window_s: float) -> None:
    """Refuse a window that is not a positive, finite number of seconds, naming it."""
    if not window_s > 0 or not math.isfinite(window_s):
        raise SimulationError("window_s", f"{window_s:g} is not > 0", "give e.g. 5")


@dataclass(frozen=True)
class _Draw:
    """One realisation of the load, cut into the oracle's windows."""

    arrivals: FloatArray
    service_s: FloatArray
    assigned: IntArray
    windows: tuple[IntArray, ...]

    @staticmethod
    def of(
        front: Sequence[LatencyProfile],
        scenario: Scenario,
        pods: int,
        window_s: float,
        count: int | None = None,
    ) -> _Draw:
        """The scenario's arrivals, service times and pods in ``count`` windows (None: all)."""
        arrivals = scenario.arrivals_s
        window_of = np.floor(arrivals / window_s).astype(np.int64)
        if count is None:
            count = int(window_of.max(initial=-1)) + 1
        return _Draw(
            arrivals,
            np.stack([p.distribution.quantile(scenario.luck) / 1000 for p in front]),
            scenario.pods_of(pods),
            tuple(np.flatnonzero(window_of == w) for w in range(count)),
        )

    def serve(
        self,
        index: int,
        mix: Mix,
        pods: _Pods,
        rules: _Rules,
        record: tuple[IntArray, FloatArray] | None = None,
    ) -> int:
        """Serve window ``index`` with the mix; how many met the SLO. A request late past
        ``late_after_s`` holds no server (a late-last queue serves it last: optimistic, a bound)."""
        arrivals, assigned, service_s = self.arrivals, self.assigned, self.service_s
        dealers: dict[int, SmoothWeighting[int]] = {}
        met = 0
        for request in self.windows[index]:
            pod = int(assigned[request])
            if mix.blend is None:
                config = mix.base
            else:
                dealer = dealers.get(pod)
                if dealer is None:
                    dealer = dealers[pod] = mix_weighting(mix)
                config = dealer.pick()
            begin = max(float(arrivals[request]), pods.free_at[pod])
            if rules.dispatch is not None:
                config = rules.dispatch(begin - float(arrivals[request]), config)
            finish = begin + float(service_s[config, request])
            if begin - float(arrivals[request]) <= rules.late_after_s:
                pods.free_at[pod] = finish
            latency = finish - float(arrivals[request])
            met += latency <= rules.slo_s
            if record is not None:
                record[0][request] = config
                record[1][request] = latency
        return met


def _search(
    front: Sequence[LatencyProfile], real: _Draw, draws: Sequence[_Draw], rules: _Rules
) -> OracleReport:
    """Per window, the most accurate hull position under which ``draws`` (from the real queue)
    do as well as static fastest, with one window of lookahead; served on ``real``."""
    fastest = Mix(0)
    count = len(real.windows)
    pods, window_s = rules.pods, rules.window_s
    # Static fastest in each draw: the met count to reach and the work it leaves (at least an SLO).
    references = [_Pods([0.0] * pods) for _ in draws]
    targets: list[int] = []
    backlogs: list[float] = []
    for index in range(count):
        end = (index + 1) * window_s
        targets.append(
            sum(d.serve(index, fastest, r, rules) for d, r in zip(draws, references, strict=True))
        )
        backlogs.append(sum(max(r.backlog_s(end), rules.slo_s * pods) for r in references))
    positions = hull_mixes(accuracy_hull(front))
    state = _Pods([0.0] * pods)
    configs = np.zeros(len(real.arrivals), dtype=np.int64)
    latencies = np.zeros(len(real.arrivals))
    chosen: list[Mix] = []

    def feasible(index: int, position: Mix) -> bool:
        # Every draw starts from the real queue: the oracle sees it, as a policy would.
        trials = [state.copy() for _ in draws]
        met = sum(d.serve(index, position, t, rules) for d, t in zip(draws, trials, strict=True))
        left = sum(t.backlog_s((index + 1) * window_s) for t in trials)
        if met < targets[index] or left > backlogs[index]:
            return False
        if index + 1 == count:
            return True
        after = sum(
            d.serve(index + 1, fastest, t, rules) for d, t in zip(draws, trials, strict=True)
        )
        return after >= targets[index + 1]

    for index in range(count):
        mix = positions[0]
        if len(real.windows[index]):
            mix = most_accurate(positions, functools.partial(feasible, index))
        chosen.append(mix)
        real.serve(index, mix, state, rules, (configs, latencies))
    n = len(configs)
    accuracies = np.array([p.accuracy for p in front])
    return OracleReport(
        compliance=100.0 * int(np.sum(latencies <= rules.slo_s)) / n if n else 100.0,
        mean_accuracy=float(accuracies[configs].mean()) if n else math.nan,
        requests=n,
        window_s=window_s,
        mixes=tuple(chosen),
    )
