"""COMPASS-V: find every configuration whose accuracy is >= tau, with few sample evaluations.

The paper's method (Latin-hypercube seeds, hill-climbing, lateral expansion along the
feasibility boundary, progressive budgets with early stopping), made complete: climbs and
expansion visit every neighbour, a completion phase driven by a Bayesian model of accuracy
finds feasible regions not connected to the first, and every configuration is scored on one
seeded permutation of the dataset. Early stopping is in ``statistics``. What it changes and what
it guarantees: docs/method.md, "Search".
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import brentq
from scipy.stats import norm

from compass.domain.evaluation import EvaluationError, Evaluator
from compass.domain.space import Space
from compass.domain.statistics import TOLERANCE, FeasibilityVerdict, IntervalMethod, StoppingRule

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Prior standard deviation of one parameter value's effect on accuracy: wide, so a value that
# has never been evaluated stays uncertain (and therefore worth evaluating).
EFFECT_PRIOR_SD = 0.5
# Interactions between two parameters' values are usually smaller than main effects, but not
# always: a feasible region that exists only where two parameters take particular values (a
# second, disconnected region) is an interaction as large as a main effect. At 0.1 the model
# was sure an unseen pair of values could not lift accuracy to tau and stopped without it.
INTERACTION_PRIOR_SD = 0.3
# Floor on the model's residual standard deviation: a perfect fit on few points is luck.
MIN_RESIDUAL_SD = 0.01
# The search holds one permutation of the dataset's indices (8 bytes each): 80 MB at most.
MAX_DATASET_SIZE = 10_000_000


class SearchMethod(StrEnum):
    """Which configurations get evaluated."""

    COMPASS_V = "compass-v"
    GRID = "grid"


@dataclass(frozen=True)
class SearchSettings:
    """Everything that steers one search besides the space and the evaluator."""

    tau: float
    budgets: tuple[int, ...] | None = None
    confidence: float = 0.95
    seed: int = 0
    method: SearchMethod = SearchMethod.COMPASS_V
    interval: IntervalMethod = IntervalMethod.BETTING
    initial_configs: int | None = None


@dataclass
class Assessment:
    """What the search knows about one configuration: its scores so far and its verdict."""

    index: int
    scores: list[float] = field(default_factory=list)
    verdict: FeasibilityVerdict = FeasibilityVerdict.UNDECIDED

    @property
    def samples(self) -> int:
        """Number of samples this configuration was scored on."""
        return len(self.scores)

    @property
    def accuracy(self) -> float:
        """Mean score over the samples seen."""
        return sum(self.scores) / len(self.scores) if self.scores else 0.0

    @property
    def feasible(self) -> bool:
        """Whether the verdict is feasible."""
        return self.verdict is FeasibilityVerdict.FEASIBLE


@dataclass(frozen=True)
class Progress:
    """A snapshot reported after every evaluated batch."""

    phase: str
    configs_evaluated: int
    sample_evals: int
    feasible: int
    space_size: int


@dataclass(frozen=True)
class SearchOutcome:
    """The assessments of one search, in the order configurations were first evaluated."""

    space: Space
    assessments: tuple[Assessment, ...]
    population: int
    stop_reason: str

    @property
    def feasible(self) -> list[Assessment]:
        """Feasible configurations, most accurate first."""
        return sorted((a for a in self.assessments if a.feasible), key=lambda a: -a.accuracy)

    @property
    def sample_evals(self) -> int:
        """Samples evaluated over all configurations."""
        return sum(a.samples for a in self.assessments)

    @property
    def configs_evaluated(self) -> int:
        """Configurations evaluated on at least one sample."""
        return len(self.assessments)

    def result_document(self) -> dict[str, Any]:
        """The result file's content: feasible, evaluated, sample_evals, configs_evaluated."""

        def entry(record: Assessment) -> dict[str, Any]:
            config = self.space.config(record.index)
            return {"config": config, "accuracy": record.accuracy, "samples": record.samples}

        return {
            "feasible": [entry(a) for a in self.feasible],
            "evaluated": [{**entry(a), "verdict": a.verdict.value} for a in self.assessments],
            "sample_evals": self.sample_evals,
            "configs_evaluated": self.configs_evaluated,
        }


class _Search:
    """One run: the space, the stopping rule, the evaluator and what has been assessed."""

    def __init__(
        self,
        space: Space,
        evaluator: Evaluator,
        population: int,
        settings: SearchSettings,
        progress: Callable[[Progress], None] | None,
    ) -> None:
        self.space = space
        self.evaluator = evaluator
        self.settings = settings
        self.rule = StoppingRule(
            tau=settings.tau,
            population=population,
            budgets=settings.budgets,
            confidence=settings.confidence,
            space_size=space.size,
            method=settings.interval,
        )
        # One permutation for every configuration: prefixes are simple random samples, and
        # two configurations' prefixes are scored on the same questions.
        self.order = np.random.default_rng(settings.seed).permutation(population)
        self.rng = np.random.default_rng([settings.seed, 1])
        self.assessed: dict[int, Assessment] = {}
        self.progress = progress
        self.phase = "seeding"
        self.samples = 0
        self.feasible_count = 0

    # -- evaluation --------------------------------------------------------------------------

    def assess(self, index: int) -> Assessment:
        """Evaluate a configuration through the budget schedule until it has a verdict."""
        if index in self.assessed:
            return self.assessed[index]
        record = Assessment(index)
        self.assessed[index] = record
        config = self.space.config(index)
        budget = self.rule.next_look(record.scores)
        while record.verdict is FeasibilityVerdict.UNDECIDED:
            assert budget is not None, "the last budget always yields a verdict"
            indices = [int(i) for i in self.order[record.samples : budget]]
            scores = self.evaluator.evaluate(config, indices)
            if len(scores) != len(indices):
                raise EvaluationError(
                    f"evaluator returned {len(scores)} scores for {len(indices)} samples"
                )
            record.scores.extend(float(s) for s in scores)
            self.samples += len(indices)
            record.verdict, budget = self.rule.look(record.scores)
            if record.feasible:
                self.feasible_count += 1
            self._report()
        return record

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(
                Progress(
                    phase=self.phase,
                    configs_evaluated=len(self.assessed),
                    sample_evals=self.samples,
                    feasible=self.feasible_count,
                    space_size=self.space.size,
                )
            )

    def outcome(self, reason: str) -> SearchOutcome:
        """Freeze the run into its outcome."""
        return SearchOutcome(
            space=self.space,
            assessments=tuple(self.assessed.values()),
            population=self.rule.population,
            stop_reason=reason,
        )

    # -- grid --------------------------------------------------------------------------------

    def grid(self) -> SearchOutcome:
        """Every configuration, each with the same early stopping."""
        self.phase = "grid"
        for index in range(self.space.size):
            self.assess(index)
        return self.outcome("evaluated every configuration")

    # -- COMPASS-V ---------------------------------------------------------------------------

    def compass_v(self) -> SearchOutcome:
        """Seed, climb, expand, then complete until no unevaluated configuration can reach tau."""
        seeds = self.latin_hypercube_seeds()
        for index in seeds:
            self.assess(index)
        self.phase = "climbing"
        for index in sorted(seeds, key=lambda i: -self.assessed[i].accuracy):
            if self.feasible_count:
                break
            self.climb(index)
        self.phase = "expanding"
        self.expand(a.index for a in list(self.assessed.values()) if a.feasible)
        self.phase = "completing"
        while len(self.assessed) < self.space.size:
            candidates, mean, sd = self.predict_unevaluated()
            expected = float(norm.sf((self.rule.tau - TOLERANCE - mean) / sd).sum())
            if expected < self.rule.alpha_accept:
                return self.outcome(
                    f"the model expects {expected:.3f} feasible configurations among the "
                    f"{len(candidates)} never evaluated (below {self.rule.alpha_accept:g})"
                )
            # Explore by the upper bound, not by the chance of feasibility: a region the model
            # knows little about (wide sd) is looked at before it is written off. Ordering by
            # chance alone missed a second feasible region that only a three-way effect makes.
            upper = mean + self.exploration_z * sd
            candidate = int(candidates[int(np.argmax(upper))])
            if self.assess(candidate).feasible:
                self.phase = "expanding"
                self.expand([candidate])
                self.phase = "completing"
        return self.outcome("evaluated every configuration")

    def latin_hypercube_seeds(self) -> list[int]:
        """Distinct configurations nearest to a Latin-hypercube design over the value indices."""
        space = self.space
        wanted = self.settings.initial_configs
        if wanted is None:
            wanted = max(len(space.names) + 1, min(20, math.ceil(math.sqrt(space.size))))
        wanted = min(wanted, space.size)
        dims = len(space.parameters)
        strata = np.stack([self.rng.permutation(wanted) for _ in range(dims)], axis=1)
        points = (strata + self.rng.random((wanted, dims))) / wanted
        chosen: list[int] = []
        taken = np.zeros(space.size, dtype=bool)
        sizes = np.array([len(p.values) for p in space.parameters])
        for point in points:
            # Stratify over value indices (each value equally likely), then snap to the
            # nearest configuration that exists and satisfies the constraints.
            target = np.minimum((point * sizes).astype(np.int64), sizes - 1)
            mismatch = (space.rows != target).astype(np.float64)
            spread = np.abs(space.rows - target) / np.maximum(sizes - 1, 1)
            distance = np.where(space.categorical, mismatch, spread).sum(axis=1)
            distance[taken] = np.inf
            index = int(np.argmin(distance))
            taken[index] = True
            chosen.append(index)
        return chosen

    def climb(self, start: int) -> None:
        """Hill-climb from a configuration towards feasibility along the estimated gradient."""
        current = start
        visited = {current}
        while not self.assessed[current].feasible:
            neighbours = self.space.neighbours(current)
            gain = self.predicted_gain(current, neighbours)
            untried = [n for n, g in zip(neighbours, gain, strict=True) if n not in self.assessed]
            if untried:
                # Evaluate the neighbour the gradient favours, in whichever direction it points.
                best_untried = max(untried, key=lambda n: gain[neighbours.index(n)])
                self.assess(best_untried)
            moves = [n for n in neighbours if n in self.assessed and n not in visited]
            if not moves:
                return
            # Move to the best neighbour seen so far, even one evaluated earlier by another
            # climb: that is where the paper's climber stopped.
            best = max(moves, key=lambda n: self.assessed[n].accuracy)
            if self.assessed[best].accuracy <= self.assessed[current].accuracy:
                return
            current = best
            visited.add(current)

    def predicted_gain(self, current: int, candidates: list[int]) -> FloatArray:
        """Accuracy change to each candidate from an inverse-distance-weighted gradient fit."""
        others = np.array([i for i in self.assessed if i != current], dtype=np.int64)
        if len(others) == 0 or not candidates:
            return np.zeros(len(candidates))
        encoded = self.space.encoded
        delta = encoded[others] - encoded[current]
        change = np.array([self.assessed[int(i)].accuracy for i in others])
        change -= self.assessed[current].accuracy
        weights = 1.0 / np.maximum(self.space.distances(current, others), 1e-9) ** 2
        root = np.sqrt(weights)[:, None]
        gradient, *_ = np.linalg.lstsq(delta * root, change * root[:, 0], rcond=None)
        steps = encoded[np.array(candidates, dtype=np.int64)] - encoded[current]
        return np.asarray(steps @ gradient)

    def expand(self, start: Iterable[int]) -> None:
        """Evaluate every step neighbour of every feasible configuration reachable from ``start``."""
        queue = deque(start)
        while queue:
            index = queue.popleft()
            for neighbour in self.space.step_neighbours(index):
                if neighbour in self.assessed:
                    continue
                if self.assess(neighbour).feasible:
                    queue.append(neighbour)

    def predict_unevaluated(self) -> tuple[IntArray, FloatArray, FloatArray]:
        """The configurations never evaluated, and the model's mean and sd of their accuracy."""
        remaining = np.setdiff1d(
            np.arange(self.space.size), np.fromiter(self.assessed, dtype=np.int64)
        )
        mean, sd = self.surrogate(remaining)
        return remaining, mean, sd

    @cached_property
    def exploration_z(self) -> float:
        """The normal quantile of the search's per-configuration rejection level."""
        return float(norm.ppf(1 - self.rule.alpha_reject))

    def surrogate(self, targets: IntArray) -> tuple[FloatArray, FloatArray]:
        """Posterior mean and sd of accuracy at ``targets`` under a Bayesian regression.

        Accuracy = intercept + one effect per parameter value + one per pair of values of two
        parameters; effects have Gaussian priors, interactions a tighter one (they are rarer
        and smaller). Each observation's noise is its sampling variance (finite-population
        corrected) plus the model's misfit, estimated from the leverage-corrected residuals;
        the predictive sd includes the misfit, so a poor fit widens every bound.
        """
        records = list(self.assessed.values())
        features = self.design(np.array([r.index for r in records], dtype=np.int64))
        y = np.array([r.accuracy for r in records])
        n = np.array([r.samples for r in records], dtype=np.float64)
        population = self.rule.population
        fpc = np.clip((population - n) / max(population - 1, 1), 0.0, 1.0)
        sampling = np.maximum(y * (1 - y), 0.05) / n * fpc
        intercept = float(np.average(y, weights=n))
        misfit = MIN_RESIDUAL_SD**2
        for _ in range(3):
            weights = 1 / (sampling + misfit)
            precision = features.T @ (features * weights[:, None]) + np.diag(self.prior_precision)
            covariance = np.linalg.inv(precision)
            effects = covariance @ (features.T @ (weights * (y - intercept)))
            residual = y - intercept - features @ effects
            leverage = _quadratic_forms(features, covariance) * weights
            dof = max(len(y) - float(leverage.sum()), 1.0)
            misfit = _misfit(residual**2, sampling, dof)
        target_features = self.design(targets)
        mean = intercept + target_features @ effects
        variance = _quadratic_forms(target_features, covariance)
        return mean, np.sqrt(variance + misfit)

    def design(self, indices: IntArray) -> FloatArray:
        """One-hot columns per parameter value, then per pair of values of two parameters."""
        rows = self.space.rows[indices]
        mains = [
            (rows[:, j, None] == np.arange(len(p.values))).astype(np.float64)
            for j, p in enumerate(self.space.parameters)
        ]
        pairs = [
            (mains[a][:, :, None] * mains[b][:, None, :]).reshape(len(rows), -1)
            for a, b in itertools.combinations(range(len(mains)), 2)
        ]
        return np.concatenate(mains + pairs, axis=1)

    @cached_property
    def prior_precision(self) -> FloatArray:
        """Prior precision of each design column, in the order ``design`` builds them."""
        sizes = [len(p.values) for p in self.space.parameters]
        mains = [np.full(k, EFFECT_PRIOR_SD**-2) for k in sizes]
        pairs = [
            np.full(sizes[a] * sizes[b], INTERACTION_PRIOR_SD**-2)
            for a, b in itertools.combinations(range(len(sizes)), 2)
        ]
        return np.concatenate(mains + pairs)


def _misfit(squares: FloatArray, sampling: FloatArray, dof: float) -> float:
    """The model's misfit variance m at which sum(r^2 / (sampling + m)) equals the dof.

    Paule-Mandel's estimator: each residual counts by its own precision, so a configuration
    judged on a few samples (whose early-stopped mean is biased as well as noisy) cannot
    inflate the misfit of every prediction, as the plain mean of r^2 - sampling let it.
    """
    floor = MIN_RESIDUAL_SD**2

    def excess(misfit: float) -> float:
        return float((squares / (sampling + misfit)).sum()) - dof

    if excess(floor) <= 0:
        return floor
    low, high = floor, max(2 * floor, float(squares.max()))
    while excess(high) > 0:
        high *= 2
    return float(brentq(excess, low, high, xtol=1e-9))


def _quadratic_forms(rows: FloatArray, matrix: FloatArray) -> FloatArray:
    """x_i^T M x_i for every row x_i (einsum's three-operand form is far slower)."""
    return np.asarray(((rows @ matrix) * rows).sum(axis=1))


def complete_feasible(outcome: SearchOutcome, evaluator: Evaluator) -> SearchOutcome:
    """The outcome with every feasible configuration scored on the whole dataset.

    The search accepts a configuration once its bound clears tau, often after a quarter of the
    samples, so its point estimate can be several points off; the Pareto front is ordered by
    accuracy, so the planner needs the real one. Verdicts do not change. Pass a checkpointed
    evaluator: the samples the search already scored are then not evaluated again.
    """
    every = list(range(outcome.population))
    completed = tuple(
        replace(a, scores=list(evaluator.evaluate(outcome.space.config(a.index), every)))
        if a.feasible and a.samples < outcome.population
        else a
        for a in outcome.assessments
    )
    return replace(outcome, assessments=completed)


def search(
    space: Space,
    evaluator: Evaluator,
    population: int,
    settings: SearchSettings,
    progress: Callable[[Progress], None] | None = None,
) -> SearchOutcome:
    """Run a search over ``space``; ``population`` is the number of samples in the dataset."""
    run = _Search(space, evaluator, population, settings, progress)
    if settings.method is SearchMethod.GRID:
        return run.grid()
    return run.compass_v()
