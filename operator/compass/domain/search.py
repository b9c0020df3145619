"""COMPASS-V: find every configuration whose accuracy is >= tau, with few sample evaluations.
What it changes of the paper's method and what it guarantees: docs/method.md, "Search"."""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from typing import Any, Protocol

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm

from compass.domain.arrays import FloatArray, IntArray
from compass.domain.evaluation import Config, EvaluationError, Evaluator
from compass.domain.space import Space
from compass.domain.statistics import TOLERANCE, FeasibilityVerdict, IntervalMethod, StoppingRule

# Prior sd of one parameter value's effect on accuracy: wide, so an unseen value stays uncertain.
EFFECT_PRIOR_SD = 0.5
# A second, disconnected feasible region is an interaction as large as a main effect: at 0.1
# the model was sure an unseen pair of values could not reach tau and stopped without it.
INTERACTION_PRIOR_SD = 0.3
# Floor on the model's residual standard deviation: a perfect fit on few points is luck.
MIN_RESIDUAL_SD = 0.01
# The search holds one permutation of the dataset's indices (8 bytes each): 80 MB at most.
MAX_DATASET_SIZE = 10_000_000
# A completion round's size: never derived from the concurrency, which cannot change the answer.
DEFAULT_BATCH = 1
# How far past its next look a likely verdict is sought (ChunkRunner.expect).
EXPECT_HORIZON = 256
# The most evaluations one search keeps in flight (a thread each).
MAX_CONCURRENCY = 1024
# A round larger than this is a grid in all but name.
MAX_BATCH = 1024


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
    batch: int = DEFAULT_BATCH

    def __post_init__(self) -> None:
        if not 1 <= self.batch <= MAX_BATCH:
            raise ValueError(f"batch must be between 1 and {MAX_BATCH}, got {self.batch}")


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


class ChunkRunner(Protocol):
    """Evaluates chunks (one configuration, some samples), any number at once, in any order: how
    it runs them cannot change the answer (docs/method.md, "Concurrent evaluation")."""

    def submit(self, ticket: int, config: Config, indices: Sequence[int]) -> None:
        """Start evaluating these samples of this configuration."""
        ...

    def finished(self) -> list[tuple[int, list[float]]]:
        """Block until at least one submitted chunk is done; every done chunk's scores."""
        ...

    def expect(self, config: Config, indices: Sequence[int]) -> None:
        """The samples the search will probably ask for next (the runner may evaluate ahead)."""
        ...

    def forget(self, config: Config) -> None:
        """This configuration has its verdict: nothing more of it will be asked for."""
        ...


class SequentialRunner:
    """One chunk at a time, in submission order, through a plain evaluator."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator
        self.queue: deque[tuple[int, Config, list[int]]] = deque()

    def submit(self, ticket: int, config: Config, indices: Sequence[int]) -> None:
        """Queue the chunk; it is evaluated when the search asks for a finished one."""
        self.queue.append((ticket, config, list(indices)))

    def finished(self) -> list[tuple[int, list[float]]]:
        """Evaluate the oldest queued chunk."""
        ticket, config, indices = self.queue.popleft()
        return [(ticket, list(self.evaluator.evaluate(config, indices)))]

    def expect(self, config: Config, indices: Sequence[int]) -> None:
        """One server is never idle while the search waits: nothing is evaluated ahead."""

    def forget(self, config: Config) -> None:
        """Nothing is held for any configuration."""


class _Search:
    """One run: the space, the stopping rule, the evaluator and what has been assessed."""

    def __init__(
        self,
        space: Space,
        evaluator: Evaluator,
        population: int,
        settings: SearchSettings,
        progress: Callable[[Progress], None] | None,
        runner: ChunkRunner | None = None,
    ) -> None:
        self.space = space
        self.runner = runner if runner is not None else SequentialRunner(evaluator)
        self.settings = settings
        self.rule = StoppingRule(
            tau=settings.tau,
            population=population,
            budgets=settings.budgets,
            confidence=settings.confidence,
            space_size=space.size,
            method=settings.interval,
        )
        # One permutation for all: prefixes are random samples, scored on the same questions.
        self.order = np.random.default_rng(settings.seed).permutation(population)
        self.rng = np.random.default_rng([settings.seed, 1])
        self.assessed: dict[int, Assessment] = {}
        self.progress = progress
        self.phase = "seeding"
        self.samples = 0
        self.feasible_count = 0

    # -- evaluation --------------------------------------------------------------------------

    def assess_round(
        self,
        indices: Iterable[int],
        follow: Callable[[Assessment], Iterable[int]] | None = None,
    ) -> list[Assessment]:
        """Evaluate these configurations side by side until each has a verdict (``follow``: more
        for the round); the verdicts do not depend on the order chunks finish in."""
        started: list[Assessment] = []
        in_flight: dict[int, tuple[Assessment, int]] = {}
        tickets = itertools.count()

        def submit(record: Assessment, budget: int | None) -> None:
            assert budget is not None, "the last budget always yields a verdict"
            chunk = [int(i) for i in self.order[record.samples : budget]]
            ticket = next(tickets)
            in_flight[ticket] = (record, len(chunk))
            config = self.space.config(record.index)
            self.runner.submit(ticket, config, chunk)
            likely = self.rule.likely_verdict(record.scores, EXPECT_HORIZON)
            if likely is not None and likely > budget:
                self.runner.expect(config, [int(i) for i in self.order[budget:likely]])

        def start(index: int) -> None:
            if index in self.assessed:
                return
            record = Assessment(index)
            self.assessed[index] = record
            started.append(record)
            submit(record, self.rule.next_look(record.scores))

        for index in indices:
            start(index)
        while in_flight:
            for ticket, scores in self.runner.finished():
                record, expected = in_flight.pop(ticket)
                if len(scores) != expected:
                    raise EvaluationError(
                        f"evaluator returned {len(scores)} scores for {expected} samples"
                    )
                record.scores.extend(float(s) for s in scores)
                self.samples += expected
                record.verdict, budget = self.rule.look(record.scores)
                if record.feasible:
                    self.feasible_count += 1
                if record.verdict is FeasibilityVerdict.UNDECIDED:
                    submit(record, budget)
                else:
                    self.runner.forget(self.space.config(record.index))
                    if follow is not None:
                        for index in follow(record):
                            start(index)
                self._report()
        for record in started:
            del self.assessed[record.index]
        started.sort(key=lambda r: r.index)
        for record in started:
            self.assessed[record.index] = record
        return started

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
        self.assess_round(range(self.space.size))
        return self.outcome("evaluated every configuration")

    # -- COMPASS-V ---------------------------------------------------------------------------

    def compass_v(self) -> SearchOutcome:
        """Seed, climb, expand, then complete until no unevaluated configuration can reach tau."""
        seeds = self.latin_hypercube_seeds()
        self.assess_round(seeds)
        self.phase = "climbing"
        # From the best seeds, a batch of climbs at a time, until one finds feasibility.
        starts = sorted(seeds, key=lambda i: -self.assessed[i].accuracy)
        for first in range(0, len(starts), self.settings.batch):
            if self.feasible_count:
                break
            self.climb(starts[first : first + self.settings.batch])
        self.phase = "expanding"
        self.expand(a.index for a in list(self.assessed.values()) if a.feasible)
        self.phase = "completing"
        while len(self.assessed) < self.space.size:
            evaluated = np.fromiter(self.assessed, dtype=np.int64)
            candidates = np.setdiff1d(np.arange(self.space.size), evaluated)
            mean, sd = self.surrogate(candidates)
            expected = float(norm.sf((self.rule.tau - TOLERANCE - mean) / sd).sum())
            if expected < self.rule.alpha_accept:
                return self.outcome(
                    f"the model expects {expected:.3f} feasible configurations among the "
                    f"{len(candidates)} never evaluated (below {self.rule.alpha_accept:g})"
                )
            # By the upper bound, not the chance of feasibility: a region the model knows little
            # about is looked at before it is written off (chance alone missed a second region).
            upper = mean + self.exploration_z * sd
            ranked = np.argsort(-upper, kind="stable")[: self.settings.batch]
            self.assess_round((int(candidates[i]) for i in ranked), follow=self._feasible_steps)
        return self.outcome("evaluated every configuration")

    def _feasible_steps(self, record: Assessment) -> list[int]:
        """The expansion's rule: a feasible configuration's step neighbours are evaluated."""
        return self.space.step_neighbours(record.index) if record.feasible else []

    def latin_hypercube_seeds(self) -> list[int]:
        """Distinct configurations nearest to a Latin-hypercube design over the value indices."""
        space = self.space
        wanted = max(len(space.names) + 1, min(20, math.ceil(math.sqrt(space.size))))
        wanted = min(wanted, space.size)
        dims = len(space.parameters)
        strata = np.stack([self.rng.permutation(wanted) for _ in range(dims)], axis=1)
        points = (strata + self.rng.random((wanted, dims))) / wanted
        chosen: list[int] = []
        taken = np.zeros(space.size, dtype=bool)
        sizes = np.array([len(p.values) for p in space.parameters])
        for point in points:
            # Stratify over value indices, then snap to the nearest valid configuration.
            target = np.minimum((point * sizes).astype(np.int64), sizes - 1)
            mismatch = (space.rows != target).astype(np.float64)
            spread = np.abs(space.rows - target) / np.maximum(sizes - 1, 1)
            distance = np.where(space.categorical, mismatch, spread).sum(axis=1)
            distance[taken] = np.inf
            index = int(np.argmin(distance))
            taken[index] = True
            chosen.append(index)
        return chosen

    def climb(self, starts: list[int]) -> None:
        """Hill-climb from each start towards feasibility, the climbs in lock step."""
        current = list(starts)
        visited = [{c} for c in current]
        live = [not self.assessed[c].feasible for c in current]
        while any(live):
            wanted: list[int] = []
            for k, position in enumerate(current):
                if not live[k]:
                    continue
                neighbours = self.space.neighbours(position)
                gain = self.predicted_gain(position, neighbours)
                untried = [
                    n for n, g in zip(neighbours, gain, strict=True) if n not in self.assessed
                ]
                if untried:
                    # The neighbour the gradient favours, in whichever direction it points.
                    wanted.append(max(untried, key=lambda n: gain[neighbours.index(n)]))
            self.assess_round(dict.fromkeys(wanted))
            for k, position in enumerate(current):
                if not live[k]:
                    continue
                neighbours = self.space.neighbours(position)
                moves = [n for n in neighbours if n in self.assessed and n not in visited[k]]
                # The best neighbour seen, even by another climb (where the paper's climber stops).
                best = max(moves, key=lambda n: self.assessed[n].accuracy) if moves else None
                if best is None or self.assessed[best].accuracy <= self.assessed[position].accuracy:
                    live[k] = False
                    continue
                current[k] = best
                visited[k].add(best)
                live[k] = not self.assessed[best].feasible
            if self.feasible_count:
                # As the sequential climber: the first feasible one hands over to expansion.
                return

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
        """Evaluate the step neighbours of every feasible configuration reachable from ``start``."""
        steps = [n for index in start for n in self.space.step_neighbours(index)]
        self.assess_round(dict.fromkeys(steps), follow=self._feasible_steps)

    @cached_property
    def exploration_z(self) -> float:
        """The normal quantile of the search's per-configuration rejection level."""
        return float(norm.ppf(1 - self.rule.alpha_reject))

    def surrogate(self, targets: IntArray) -> tuple[FloatArray, FloatArray]:
        """Posterior mean and sd of accuracy at ``targets``; a poor fit widens every bound."""
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
    """The misfit variance m at which sum(r^2 / (sampling + m)) equals the dof (Paule-Mandel: a
    configuration judged on few samples cannot inflate every prediction's misfit)."""
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


def complete_feasible(
    outcome: SearchOutcome, evaluator: Evaluator, runner: ChunkRunner | None = None
) -> SearchOutcome:
    """The outcome with every feasible configuration scored on the whole dataset (an early
    accept's estimate can be points off, and the front is ordered by it); verdicts never change."""
    runner = runner if runner is not None else SequentialRunner(evaluator)
    every = list(range(outcome.population))
    wanted = {
        ticket: a
        for ticket, a in enumerate(outcome.assessments)
        if a.feasible and a.samples < outcome.population
    }
    for ticket, record in wanted.items():
        runner.submit(ticket, outcome.space.config(record.index), every)
    scores: dict[int, list[float]] = {}
    while len(scores) < len(wanted):
        scores.update(runner.finished())
    completed = tuple(
        replace(a, scores=[float(s) for s in scores[ticket]]) if ticket in scores else a
        for ticket, a in enumerate(outcome.assessments)
    )
    return replace(outcome, assessments=completed)


def search(
    space: Space,
    evaluator: Evaluator,
    population: int,
    settings: SearchSettings,
    progress: Callable[[Progress], None] | None = None,
    runner: ChunkRunner | None = None,
) -> SearchOutcome:
    """Run a search; whichever ``runner`` evaluates the chunks, the outcome is the same."""
    run = _Search(space, evaluator, population, settings, progress, runner)
    if settings.method is SearchMethod.GRID:
        return run.grid()
    return run.compass_v()
