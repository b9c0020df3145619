"""Early stopping: decide from a prefix of a configuration's scores whether it reaches tau.

Exact bounds first, then betting (the default of SearchSettings.interval; anytime-valid) or
Wilson over fixed looks, at the last budget the point estimate. Why: docs/method.md, "Early
stopping"."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

import numpy as np
from scipy.stats import hypergeom, norm

from compass.domain.arrays import FloatArray

# Means are sums of floats: accuracy equal to tau must not be rejected as 0.1 + 0.2 != 0.3.
TOLERANCE = 1e-9
# Share of the maximal safe bet staked: one bad score cannot wipe out the capital (Waudby-Smith).
BET_CAP = 0.5


class IntervalMethod(StrEnum):
    """How a look at a prefix of scores turns into a verdict."""

    WILSON = "wilson"
    BETTING = "betting"


class FeasibilityVerdict(StrEnum):
    """What a look concluded about one configuration."""

    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    UNDECIDED = "undecided"


# The reference's schedule (COMPASS-V's paper), Wilson's default: Bonferroni needs few looks.
REFERENCE_BUDGETS = (10, 25, 50, 100)


def reference_budgets(population: int) -> tuple[int, ...]:
    """The reference's budgets below the dataset size, then the dataset size itself: ending at N
    keeps every verdict exact or statistical, never a point estimate outside any bound."""
    return tuple(sorted({b for b in REFERENCE_BUDGETS if b < population} | {population}))


def schedule_points(
    budgets: tuple[int, ...] | None, method: IntervalMethod, population: int
) -> tuple[int, ...] | None:
    """The sample counts a test may look at: the budgets given, else its default (None: any)."""
    if budgets is not None:
        return budgets
    return reference_budgets(population) if method is IntervalMethod.WILSON else None


def describe_schedule(
    budgets: tuple[int, ...] | None, method: IntervalMethod, population: int
) -> str:
    """A schedule as a user would pass it, or "adaptive" for betting's default."""
    points = schedule_points(budgets, method, population)
    return "adaptive" if points is None else ",".join(map(str, points))


@dataclass(frozen=True)
class StoppingRule:
    """The early-stopping test shared by every configuration of one search."""

    tau: float
    population: int
    budgets: tuple[int, ...] | None = None
    confidence: float = 0.95
    space_size: int = 1
    method: IntervalMethod = IntervalMethod.BETTING

    def __post_init__(self) -> None:
        if not 0 < self.tau <= 1:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.population < 1:
            raise ValueError(f"the dataset size must be >= 1, got {self.population}")
        if self.budgets is None:
            return
        if not self.budgets or any(b <= a for a, b in itertools.pairwise(self.budgets)):
            raise ValueError(f"budgets must be strictly increasing, got {list(self.budgets)}")
        if self.budgets[0] < 1 or self.budgets[-1] > self.population:
            raise ValueError(
                f"budgets must lie in 1..{self.population} (the dataset size), "
                f"got {list(self.budgets)}"
            )

    @cached_property
    def _points(self) -> tuple[int, ...] | None:
        """The sample counts at which a look may happen; None: after any sample."""
        return schedule_points(self.budgets, self.method, self.population)

    @property
    def last_look(self) -> int:
        """The schedule's last point: the verdict there is final."""
        return self._points[-1] if self._points else self.population

    @property
    def alpha_accept(self) -> float:
        """Per-configuration probability of accepting one whose full mean is below tau."""
        return 1 - self.confidence

    @property
    def alpha_reject(self) -> float:
        """Per-configuration share of the search-wide probability of rejecting a feasible one."""
        return (1 - self.confidence) / max(1, self.space_size)

    @property
    def statistical_looks(self) -> int:
        """Looks that can stop on evidence; a look at the full dataset is exact and spends none."""
        if self._points is None:
            return max(1, self.population - 1)
        return max(1, sum(1 for b in self._points if b < self.population))

    def look(self, scores: Sequence[float] | FloatArray) -> tuple[FeasibilityVerdict, int | None]:
        """The verdict after these scores and, while undecided, the next look (one capital)."""
        x = np.asarray(scores, dtype=np.float64)
        capital = self._capital(x)
        verdict = self._verdict(x, capital)
        if verdict is not FeasibilityVerdict.UNDECIDED:
            return verdict, None
        return verdict, self._next_look(x, capital)

    def next_look(self, scores: Sequence[float] | FloatArray) -> int | None:
        """The first scheduled point at which these scores and more could reach a verdict."""
        x = np.asarray(scores, dtype=np.float64)
        return self._next_look(x, self._capital(x))

    def likely_verdict(self, scores: Sequence[float] | FloatArray, horizon: int) -> int | None:
        """The sample count of a verdict if the scores went on as seen: a guess, to score ahead."""
        x = np.asarray(scores, dtype=np.float64)
        seen = len(x)
        if seen == 0 or seen >= self.last_look:
            return None
        steps = min(horizon, self.last_look - seen)
        if steps <= 0:
            return None
        ones = np.floor(np.arange(steps + 1, dtype=np.float64) * float(x.mean()) + 0.5)
        path = np.concatenate((x, np.diff(ones)))
        counts = np.arange(seen + 1, seen + steps + 1)
        if self._points is not None:
            points = set(self._points)
            counts = np.array([t for t in counts if t in points], dtype=np.int64)
        if self.method is IntervalMethod.WILSON:
            for t in counts:
                prefix = path[: int(t)]
                if self._verdict(prefix, (0.0, 0.0)) is not FeasibilityVerdict.UNDECIDED:
                    return int(t)
            return seen + steps
        n, tau = self.population, self.tau - TOLERANCE
        totals = np.cumsum(path)
        up, down = _betting_paths(path, self.tau, n)
        decided = (
            (totals / n >= tau)
            | ((totals + n - np.arange(1, len(path) + 1)) / n < tau)
            | (up >= math.log(1 / self.alpha_accept))
            | (down >= math.log(1 / self.alpha_reject))
        )
        hits = counts[decided[counts - 1]] if len(counts) else counts
        return int(hits[0]) if len(hits) else seen + steps

    def _capital(self, x: FloatArray) -> tuple[float, float]:
        """Betting's log capital (up, down) after these scores; zero before any, or for Wilson."""
        if self.method is IntervalMethod.WILSON or len(x) == 0:
            return 0.0, 0.0
        return betting_log_capital(x, self.tau, self.population)

    def _verdict(self, x: FloatArray, capital: tuple[float, float]) -> FeasibilityVerdict:
        seen = len(x)
        total = float(x.sum())
        n = self.population
        if total / n >= self.tau - TOLERANCE:
            return FeasibilityVerdict.FEASIBLE
        if (total + n - seen) / n < self.tau - TOLERANCE:
            return FeasibilityVerdict.INFEASIBLE
        if self.method is IntervalMethod.WILSON:
            verdict = self._wilson(total / seen, seen)
        else:
            verdict = self._betting(*capital)
        if verdict is FeasibilityVerdict.UNDECIDED and seen >= self.last_look:
            mean = total / seen
            return (
                FeasibilityVerdict.FEASIBLE
                if mean >= self.tau - TOLERANCE
                else FeasibilityVerdict.INFEASIBLE
            )
        return verdict

    def _next_look(self, x: FloatArray, capital: tuple[float, float]) -> int | None:
        seen = len(x)
        if self.method is IntervalMethod.WILSON:
            # Fixed looks (Wilson's always has points): the next, None when they are spent.
            return next((b for b in self._points or () if b > seen), None)
        if seen >= self.last_look:
            return None
        earliest = seen + self._samples_before_verdict(x, capital)
        if self._points is None:
            return min(earliest, self.population)
        # Past the schedule's end the last point decides (by point estimate if it is not N).
        return next((b for b in self._points if b >= earliest), self.last_look)

    def _samples_before_verdict(self, x: FloatArray, capital: tuple[float, float]) -> int:
        """A lower bound (>= 1) on the further samples any verdict needs, under betting."""
        n, seen, total = self.population, len(x), float(x.sum())
        left = n - seen
        if left <= 0:
            return 1
        target = n * self.tau
        # Exact bounds: enough ones to reach N tau, or enough zeros to rule it out.
        ones_needed = math.ceil(target - total - 1e-6)
        zeros_needed = math.floor(total + left - target - 1e-6)
        exact = max(1, min(ones_needed, zeros_needed + 1))
        up, down = capital
        # Only draws before the exact bounds matter; in growing chunks (a few dozen usually do).
        limit, horizon = min(left, exact), 64
        while True:
            horizon = min(horizon, limit)
            steps = np.arange(1, horizon + 1, dtype=np.float64)
            # Along all ones the null mean of the unseen scores falls fastest, which maximises
            # the largest gain a capped up-bet can make on each draw; all zeros, the same down.
            c_ones = np.clip((target - total - (steps - 1)) / (left - steps + 1), 1e-12, 1 - 1e-12)
            c_zeros = np.clip((target - total) / (left - steps + 1), 1e-12, 1 - 1e-12)
            best_up = up + np.cumsum(np.log1p(BET_CAP * (1 - c_ones) / c_ones))
            best_down = down + np.cumsum(np.log1p(BET_CAP * c_zeros / (1 - c_zeros)))
            reachable = (best_up >= math.log(1 / self.alpha_accept)) | (
                best_down >= math.log(1 / self.alpha_reject)
            )
            if reachable.any():
                return max(1, int(np.argmax(reachable)) + 1)
            if horizon == limit:
                return max(1, limit)
            horizon *= 4

    @cached_property
    def _wilson_z(self) -> tuple[float, float]:
        """One-sided normal quantiles for accepting and rejecting, Bonferroni over the looks."""
        looks = self.statistical_looks
        return (
            float(norm.ppf(1 - self.alpha_accept / looks)),
            float(norm.ppf(1 - self.alpha_reject / looks)),
        )

    def _wilson(self, mean: float, seen: int) -> FeasibilityVerdict:
        z_accept, z_reject = self._wilson_z
        lower, _ = wilson_interval(mean, seen, z_accept, self.population)
        if lower >= self.tau:
            return FeasibilityVerdict.FEASIBLE
        _, upper = wilson_interval(mean, seen, z_reject, self.population)
        # Wilson's normal approximation underestimates the lower tail of a small prefix when
        # tau is near 1 (binary scores exactly at tau 0.95, N 100, 234 configurations: 33x the
        # nominal false-reject rate), so a rejection must also pass a tail bound that holds
        # for any scores in [0, 1].
        if (
            upper < self.tau
            and lower_tail_bound(mean * seen, seen, self.tau, self.population)
            <= self.alpha_reject / self.statistical_looks
        ):
            return FeasibilityVerdict.INFEASIBLE
        return FeasibilityVerdict.UNDECIDED

    def _betting(self, up: float, down: float) -> FeasibilityVerdict:
        if up >= math.log(1 / self.alpha_accept):
            return FeasibilityVerdict.FEASIBLE
        if down >= math.log(1 / self.alpha_reject):
            return FeasibilityVerdict.INFEASIBLE
        return FeasibilityVerdict.UNDECIDED


def wilson_interval(mean: float, seen: int, z: float, population: int) -> tuple[float, float]:
    """Wilson score interval for a mean in [0, 1], narrowed for sampling without replacement
    (Bernoulli variance bounds any [0, 1] score's: conservative for continuous scores like F1)."""
    fpc = (population - seen) / (population - 1) if population > 1 else 0.0
    z2 = z * z * fpc
    denominator = 1 + z2 / seen
    centre = (mean + z2 / (2 * seen)) / denominator
    half = math.sqrt(z2) * math.sqrt(mean * (1 - mean) / seen + z2 / (4 * seen * seen))
    return centre - half / denominator, centre + half / denominator


def lower_tail_bound(total: float, seen: int, tau: float, population: int) -> float:
    """Upper bound on P(the first ``seen`` scores sum to <= ``total``) when the full mean >= tau.

    Holds for any scores in [0, 1] drawn without replacement. For convex f, E f(sample sum) is
    convex and symmetric in the population's values, hence Schur-convex, so it is largest for
    the most spread population with total N tau: floor(N tau) ones, one remainder, zeros.
    Markov's inequality on the convex hinge (k - S)+ gives P(S <= s) <= E(k - S)+ / (k - s)
    for every k > s; the smallest ratio is at an atom of that population's sample sum.
    """
    target = population * tau
    ones = round(target) if abs(target - round(target)) < 1e-9 else math.floor(target)
    rest = target - ones if target - ones > 1e-9 else 0.0
    counts = np.arange(seen + 1)
    if rest == 0.0:
        atoms: FloatArray = counts.astype(np.float64)
        probs: FloatArray = hypergeom.pmf(counts, population, ones, seen)
    else:
        # The remainder is drawn with probability seen / N; the ones fill the other draws.
        drawn = seen / population
        atoms = np.concatenate((counts, counts[:-1] + rest)).astype(np.float64)
        probs = np.concatenate(
            (
                (1 - drawn) * hypergeom.pmf(counts, population - 1, ones, seen),
                drawn * hypergeom.pmf(counts[:-1], population - 1, ones, seen - 1),
            )
        )
    order = np.argsort(atoms, kind="stable")
    atoms, probs = atoms[order], probs[order]
    below = np.concatenate(([0.0], np.cumsum(probs)[:-1]))
    mass_below = np.concatenate(([0.0], np.cumsum(atoms * probs)[:-1]))
    above = atoms > total + TOLERANCE
    if not above.any():
        return 1.0
    k = atoms[above]
    ratios = (k * below[above] - mass_below[above]) / (k - total)
    return float(min(1.0, ratios.min()))


def betting_log_capital(x: FloatArray, tau: float, population: int) -> tuple[float, float]:
    """Log wealth of two bets against the null "full mean == tau", sampling without replacement.

    ``up`` bets that the mean is above tau, ``down`` that it is below. Each is a nonnegative
    martingale under its null (Waudby-Smith & Ramdas 2020, "Confidence sequences for sampling
    without replacement"), so by Ville's inequality it ever reaches 1/alpha with probability
    <= alpha, however often it is looked at: no correction for repeated looks is needed. The
    stake adapts to the observed variance (aGRAPA), so low-variance scores decide sooner.
    Under the null, before draw i the unseen scores have mean c_i = (N tau - S_{i-1}) / (N-i+1).
    The caller has already excluded the cases where c_i leaves [0, 1] (exact bounds).
    """
    up, down = _bet_terms(x, tau, population, population - np.arange(len(x), dtype=np.float64))
    return float(up.sum()), float(down.sum())


def _betting_paths(x: FloatArray, tau: float, population: int) -> tuple[FloatArray, FloatArray]:
    """``betting_log_capital`` after every draw (cumulative sums, so the last entries may
    differ from it in the last bits: use it for guesses, never for verdicts)."""
    remaining = np.maximum(population - np.arange(len(x), dtype=np.float64), 1.0)
    up, down = _bet_terms(x, tau, population, remaining)
    return np.cumsum(up), np.cumsum(down)


def _bet_terms(
    x: FloatArray, tau: float, population: int, remaining: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Each draw's log growth of the up and down bets (``remaining``: unseen before each)."""
    i = np.arange(1, len(x) + 1, dtype=np.float64)
    before = np.concatenate(([0.0], np.cumsum(x)[:-1]))
    c = np.clip((population * tau - before) / remaining, 1e-12, 1 - 1e-12)
    # Predictable estimates from the draws before i, regularised towards 1/2.
    mean_before = (0.5 + before) / i
    running_mean = (0.5 + np.cumsum(x)) / (i + 1)
    squares = np.concatenate(([0.0], np.cumsum((x - running_mean) ** 2)[:-1]))
    var_before = (0.25 + squares) / i
    edge = mean_before - c
    stake = edge / (var_before + edge**2)
    up_stake = np.clip(stake, 0.0, BET_CAP / c)
    down_stake = np.clip(-stake, 0.0, BET_CAP / (1 - c))
    return np.log1p(up_stake * (x - c)), np.log1p(-down_stake * (x - c))
