"""COMPASS-V and grid search on synthetic spaces whose true accuracies are known exactly."""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compass.domain.evaluation import Config, EvaluationError
from compass.domain.search import (
    Progress,
    SearchMethod,
    SearchOutcome,
    SearchSettings,
    _Search,
    complete_feasible,
    search,
)
from compass.domain.space import Space, config_key
from compass.domain.statistics import FeasibilityVerdict, IntervalMethod, StoppingRule
from compass.evaluators.concurrency import VirtualRunner, jittered_service
from compass.evaluators.ledger import CheckpointedEvaluator, CheckpointLedger

IntArray = npt.NDArray[np.int64]
N = 40
BUDGETS = (10, 20, 40)


class Replay:
    """Binary per-sample scores with exactly ``ones[i]`` ones for configuration i, so the full
    mean is ones[i] / N exactly; records every (configuration, sample) it is asked for."""

    def __init__(self, space: Space, ones: IntArray, population: int, seed: int) -> None:
        rng = np.random.default_rng([seed, 99])
        self.space = space
        self.scores = np.zeros((space.size, population))
        for i, count in enumerate(ones):
            self.scores[i, rng.permutation(population)[: int(count)]] = 1.0
        self.asked: Counter[tuple[int, int]] = Counter()
        self.sequences: dict[int, list[int]] = {}

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """The recorded scores of ``config`` at these samples."""
        index = self.space.index(config)
        self.sequences.setdefault(index, []).extend(sample_indices)
        self.asked.update((index, int(s)) for s in sample_indices)
        return [float(self.scores[index, s]) for s in sample_indices]


# -- synthetic landscapes: (space, ones per configuration) ----------------------------------


def _ones(accuracy: npt.NDArray[np.float64]) -> IntArray:
    return np.rint(np.clip(accuracy, 0, 1) * N).astype(np.int64)


def additive_with_interactions(rng: np.random.Generator) -> tuple[Space, IntArray]:
    """Four parameters of every kind, random main effects plus smaller pairwise interactions."""
    space = Space.from_spec(
        {
            "parameters": [
                {"name": "a", "type": "integer", "values": [1, 2, 3, 4, 5]},
                {"name": "b", "type": "integer", "values": [1, 2, 4, 8], "scale": "log"},
                {"name": "c", "values": ["x", "y", "z"]},
                {"name": "d", "type": "float", "values": [0.1, 0.2, 0.4]},
            ]
        }
    )
    rows = space.rows
    accuracy = np.full(space.size, 0.55)
    for j, p in enumerate(space.parameters):
        accuracy += rng.normal(0, 0.08, len(p.values))[rows[:, j]]
    for a, b in itertools.combinations(range(4), 2):
        table = rng.normal(
            0, 0.03, (len(space.parameters[a].values), len(space.parameters[b].values))
        )
        accuracy += table[rows[:, a], rows[:, b]]
    return space, _ones(accuracy)


def two_regions(rng: np.random.Generator) -> tuple[Space, IntArray]:
    """Two feasible regions far apart: one around x = y = 0 for every w, one around x = y = 5
    that exists only at w = 3 (a three-way effect the surrogate cannot represent exactly)."""
    space = Space.from_spec(
        {
            "parameters": [
                {"name": "x", "type": "integer", "values": list(range(6))},
                {"name": "y", "type": "integer", "values": list(range(6))},
                {"name": "w", "type": "integer", "values": [1, 2, 3, 4]},
            ]
        }
    )
    x, y, w = (space.rows[:, j] for j in range(3))
    near_origin = 0.9 - 0.1 * (x + y)
    far_corner = np.where(w == 2, 0.9 - 0.1 * ((5 - x) + (5 - y)), 0.2)  # w == 3: index 2
    accuracy = np.maximum(near_origin, far_corner) + rng.normal(0, 0.01, space.size)
    return space, _ones(accuracy)


def rare(rng: np.random.Generator) -> tuple[Space, IntArray]:
    """A feasible set of about 2% of the space: a narrow corner of two main effects."""
    space = Space.from_spec(
        {
            "parameters": [
                {"name": "a", "type": "integer", "values": [0, 1, 2, 3, 4]},
                {"name": "b", "values": ["p", "q", "r", "s"]},
                {"name": "c", "type": "float", "values": [0.5, 2.0], "scale": "log"},
                {"name": "d", "type": "integer", "values": [0, 1, 2, 3]},
            ]
        }
    )
    a, b, c, d = (space.rows[:, j] for j in range(4))
    accuracy = 0.3 + 0.07 * a + 0.06 * d + rng.normal(0, 0.04, 4)[b] + 0.02 * c
    accuracy += rng.normal(0, 0.015, space.size)
    return space, _ones(accuracy)


def constrained(rng: np.random.Generator) -> tuple[Space, IntArray]:
    """A RAG-like space with reranker_k <= retriever_k."""
    space = Space.from_spec(
        {
            "parameters": [
                {
                    "name": "retriever_k",
                    "type": "integer",
                    "values": [1, 2, 4, 8, 16],
                    "scale": "log",
                },
                {
                    "name": "reranker_k",
                    "type": "integer",
                    "values": [1, 2, 4, 8, 16],
                    "scale": "log",
                },
                {"name": "model", "values": ["small", "medium", "large"]},
                {"name": "temperature", "type": "float", "values": [0.0, 0.5, 1.0]},
            ],
            "constraints": ["reranker_k <= retriever_k"],
        }
    )
    r, k, m, t = (space.rows[:, j] for j in range(4))
    accuracy = 0.4 + 0.06 * r + 0.04 * k + np.array([0.0, 0.08, 0.15])[m] - 0.05 * t
    accuracy += rng.normal(0, 0.02, space.size)
    return space, _ones(accuracy)


Landscape = Callable[[np.random.Generator], tuple[Space, IntArray]]
# Each landscape with the fraction of the space that is feasible.
LANDSCAPES: list[tuple[Landscape, float]] = [
    (additive_with_interactions, 0.08),
    (two_regions, 0.08),
    (rare, 0.02),
    (constrained, 0.06),
]


def _threshold(ones: IntArray, fraction: float) -> int:
    """The count of ones that makes about ``fraction`` of the space feasible (ties included)."""
    top = max(1, round(fraction * len(ones)))
    return int(np.sort(ones)[::-1][top - 1])


def _run(
    landscape: Landscape,
    fraction: float,
    seed: int,
    method: SearchMethod = SearchMethod.COMPASS_V,
    interval: IntervalMethod = IntervalMethod.WILSON,
) -> tuple[SearchOutcome, Replay, set[int]]:
    space, ones = landscape(np.random.default_rng(seed))
    needed = _threshold(ones, fraction)
    replay = Replay(space, ones, N, seed)
    settings_ = SearchSettings(
        tau=needed / N, budgets=BUDGETS, seed=seed, method=method, interval=interval
    )
    outcome = search(space, replay, N, settings_)
    truth = {i for i in range(space.size) if ones[i] >= needed}
    return outcome, replay, truth


def _components(space: Space, members: set[int]) -> int:
    """Connected components of ``members`` under step-neighbour moves."""
    left, count = set(members), 0
    while left:
        count += 1
        queue = deque([left.pop()])
        while queue:
            for other in space.step_neighbours(queue.popleft()):
                if other in left:
                    left.remove(other)
                    queue.append(other)
    return count


# -- (a) completeness and (b) cost ----------------------------------------------------------


@pytest.mark.parametrize(
    ("landscape", "fraction"), LANDSCAPES, ids=lambda v: getattr(v, "__name__", str(v))
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compass_v_finds_every_feasible_configuration_for_less_than_grid(
    landscape: Landscape, fraction: float, seed: int
) -> None:
    """Every configuration whose full-dataset accuracy is >= tau is reported feasible, and the
    search scores fewer samples than the grid with the same early stopping."""
    outcome, replay, truth = _run(landscape, fraction, seed)
    found = {a.index for a in outcome.feasible}
    assert truth, "the landscape must have a feasible set"
    assert truth <= found, f"missed {sorted(truth - found)} ({outcome.stop_reason})"
    grid, _, _ = _run(landscape, fraction, seed, method=SearchMethod.GRID)
    assert outcome.sample_evals < grid.sample_evals
    assert outcome.configs_evaluated < outcome.space.size
    # Reported counts are what the evaluator was really asked for, once each (c).
    assert sum(replay.asked.values()) == outcome.sample_evals
    assert max(replay.asked.values()) == 1


def test_landscapes_are_what_they_claim() -> None:
    """The test spaces really are hard: two disconnected feasible regions, a 2% feasible set,
    a constrained space, and interactions that are not additive."""
    for seed in (0, 1, 2):
        space, ones = two_regions(np.random.default_rng(seed))
        feasible = {i for i in range(space.size) if ones[i] >= _threshold(ones, 0.08)}
        assert _components(space, feasible) >= 2
        space, ones = rare(np.random.default_rng(seed))
        share = np.mean(ones >= _threshold(ones, 0.02))
        assert 0.01 <= share <= 0.04
    space, _ = constrained(np.random.default_rng(0))
    assert space.size < 5 * 5 * 3 * 3
    space, ones = additive_with_interactions(np.random.default_rng(0))
    accuracy = ones / N
    design = np.concatenate(
        [
            (space.rows[:, j, None] == np.arange(len(p.values)))
            for j, p in enumerate(space.parameters)
        ],
        axis=1,
    ).astype(float)
    coef, *_ = np.linalg.lstsq(design, accuracy, rcond=None)
    assert np.abs(design @ coef - accuracy).max() > 2 / N  # main effects alone do not fit


def test_betting_interval_is_complete_too() -> None:
    """The betting test keeps the same guarantee on a hard landscape."""
    for seed in (0, 1):
        outcome, _, truth = _run(two_regions, 0.08, seed, interval=IntervalMethod.BETTING)
        assert truth <= {a.index for a in outcome.feasible}


@pytest.mark.parametrize(("landscape", "fraction"), LANDSCAPES[:2])
def test_default_schedule_is_every_sample_in_fewer_calls(
    landscape: Landscape, fraction: float
) -> None:
    """The default (betting, no budgets) stops each configuration at the first sample where a
    look after every sample would have stopped it, in a fraction of the evaluator calls, and
    finds every feasible configuration."""
    space, ones = landscape(np.random.default_rng(4))
    needed = _threshold(ones, fraction)
    truth = {i for i in range(space.size) if ones[i] >= needed}
    replay = Replay(space, ones, N, 4)
    calls = 0
    record = replay.evaluate

    def counted(config: Config, samples: Sequence[int]) -> list[float]:
        nonlocal calls
        calls += 1
        return list(record(config, samples))

    replay.evaluate = counted  # type: ignore[method-assign]
    settings_ = SearchSettings(tau=needed / N, seed=4)
    assert settings_.budgets is None
    assert settings_.interval is IntervalMethod.BETTING
    outcome = search(space, replay, N, settings_)
    rule = StoppingRule(tau=settings_.tau, population=N, space_size=space.size)
    for assessment in outcome.assessments:
        first = next(
            seen
            for seen in range(1, N + 1)
            if rule.look(assessment.scores[:seen])[0] is not FeasibilityVerdict.UNDECIDED
        )
        assert assessment.samples == first
    assert truth <= {a.index for a in outcome.feasible}
    assert calls * 2 < outcome.sample_evals


# -- (c) (d) (e) evaluation order ------------------------------------------------------------


def test_samples_are_prefixes_of_one_seeded_permutation() -> None:
    """Every configuration is scored on a prefix of the same permutation of the dataset, in
    batches ending at the budgets; the permutation is shuffled, not 0..N-1, and depends on the
    seed."""
    orders = []
    for seed in (0, 1):
        outcome, replay, _ = _run(constrained, 0.06, seed)
        longest = max(replay.sequences.values(), key=len)
        assert len(longest) == N
        assert sorted(longest) == list(range(N))
        assert longest != list(range(N))
        for index, sequence in replay.sequences.items():
            assert sequence == longest[: len(sequence)], index
            assert len(sequence) in BUDGETS
        assert set(replay.sequences) == {a.index for a in outcome.assessments}
        orders.append(longest)
    assert orders[0] != orders[1]


def test_same_seed_same_search_different_seed_different_order() -> None:
    """A search is a function of its seed: identical assessments for one seed; another seed
    changes which configurations are evaluated first and on which samples."""

    def fingerprint(
        outcome: SearchOutcome,
    ) -> list[tuple[int, tuple[float, ...], FeasibilityVerdict]]:
        return [(a.index, tuple(a.scores), a.verdict) for a in outcome.assessments]

    first, first_replay, _ = _run(constrained, 0.06, 4)
    again, again_replay, _ = _run(constrained, 0.06, 4)
    assert fingerprint(first) == fingerprint(again)
    assert first_replay.sequences == again_replay.sequences
    assert first.stop_reason == again.stop_reason
    space, ones = constrained(np.random.default_rng(4))
    other_seed = search(
        space,
        Replay(space, ones, N, 4),
        N,
        SearchSettings(tau=_threshold(ones, 0.06) / N, budgets=BUDGETS, seed=5),
    )
    assert [a.index for a in other_seed.assessments] != [a.index for a in first.assessments]
    assert {config_key(space.config(a.index)) for a in other_seed.feasible} >= {
        config_key(space.config(i)) for i in range(space.size) if ones[i] >= _threshold(ones, 0.06)
    }


def test_evaluator_returning_the_wrong_number_of_scores_is_an_error() -> None:
    """A broken evaluator is reported, not silently padded or truncated."""

    class Short:
        def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
            return [1.0] * (len(sample_indices) - 1)

    space, _ = constrained(np.random.default_rng(0))
    with pytest.raises(EvaluationError, match="returned 9 scores for 10 samples"):
        search(space, Short(), N, SearchSettings(tau=0.5, budgets=BUDGETS))


# -- (f) grid -------------------------------------------------------------------------------


@st.composite
def _small_landscapes(draw: st.DrawFn) -> tuple[Space, IntArray, int, int]:
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    space = Space.from_spec(
        {
            "parameters": [
                {"name": f"p{j}", "type": "integer", "values": list(range(size))}
                for j, size in enumerate(sizes)
            ]
        }
    )
    population = draw(st.integers(1, 30))
    ones = np.array(
        draw(st.lists(st.integers(0, population), min_size=space.size, max_size=space.size)),
        dtype=np.int64,
    )
    needed = draw(st.integers(1, population))
    return space, ones, population, needed


@settings(max_examples=40, deadline=None, derandomize=True)
@given(_small_landscapes(), st.sampled_from(list(IntervalMethod)), st.integers(0, 3))
def test_grid_with_a_full_budget_is_the_brute_force_set(
    case: tuple[Space, IntArray, int, int], interval: IntervalMethod, seed: int
) -> None:
    """With the budgets ending at N and no earlier look that could err (a single budget N),
    the grid's feasible set is exactly {configurations with full mean >= tau}, and it scores
    every configuration on every sample once."""
    space, ones, population, needed = case
    replay = Replay(space, ones, population, seed)
    outcome = search(
        space,
        replay,
        population,
        SearchSettings(
            tau=needed / population,
            budgets=(population,),
            seed=seed,
            method=SearchMethod.GRID,
            interval=interval,
        ),
    )
    assert {a.index for a in outcome.feasible} == {
        i for i in range(space.size) if ones[i] >= needed
    }
    assert [a.index for a in outcome.assessments] == list(range(space.size))
    assert outcome.sample_evals == space.size * population
    assert max(replay.asked.values()) == 1


@pytest.mark.parametrize("interval", list(IntervalMethod))
def test_grid_with_early_stopping_keeps_every_feasible_configuration(
    interval: IntervalMethod,
) -> None:
    """With looks at 10 and 20 before N, the grid still reports every feasible configuration
    (rejection is controlled for the whole search) and accepts few infeasible ones (acceptance
    is controlled per configuration), for fewer samples than scoring everything."""
    space, ones = additive_with_interactions(np.random.default_rng(8))
    needed = _threshold(ones, 0.1)
    replay = Replay(space, ones, N, 0)
    outcome = search(
        space,
        replay,
        N,
        SearchSettings(
            tau=needed / N, budgets=BUDGETS, method=SearchMethod.GRID, interval=interval
        ),
    )
    truth = {i for i in range(space.size) if ones[i] >= needed}
    found = {a.index for a in outcome.feasible}
    assert truth <= found
    assert len(found - truth) <= 0.05 * (space.size - len(truth))
    assert outcome.sample_evals < space.size * N


# -- (g) climbing ----------------------------------------------------------------------------


def test_climb_walks_through_a_neighbour_evaluated_before() -> None:
    """Every neighbour of the start was evaluated before the climb (by seeding or an earlier
    climb). The paper's climber stops there; this one moves to the best of them and goes on to
    the feasible configuration, which is not a neighbour of the start."""
    space = Space.from_spec(
        {
            "parameters": [
                {"name": "x", "type": "integer", "values": [0, 1, 2, 3]},
                {"name": "y", "type": "integer", "values": [0, 1, 2, 3]},
            ]
        }
    )
    x, y = space.rows[:, 0], space.rows[:, 1]
    ones = (2 + 2 * x + y).astype(np.int64)  # accuracy (2 + 2x + y) / 20, best at (3, 3)
    population = 20
    target = space.index({"x": 3, "y": 3})
    replay = Replay(space, ones, population, 0)
    run = _Search(
        space,
        replay,
        population,
        SearchSettings(tau=int(ones[target]) / population, budgets=(population,)),
        None,
    )
    start = space.index({"x": 0, "y": 0})
    assert target not in space.neighbours(start)
    for index in (start, *space.neighbours(start)):
        run.assess_round([index])
    before = set(run.assessed)
    run.climb([start])
    assert target in run.assessed
    assert run.assessed[target].feasible
    assert set(run.assessed) - before, "the climb evaluated nothing new"


def test_feasible_configurations_beyond_a_valley_are_found() -> None:
    """A local peak below tau on one side (where a climb from there ends) and the only feasible
    configurations on the far side of a valley: the search still reports them."""
    space = Space.from_spec(
        {
            "parameters": [
                {"name": "x", "type": "integer", "values": list(range(9))},
                {"name": "m", "values": ["a", "b"]},
            ]
        }
    )
    x, m = space.rows[:, 0], space.rows[:, 1]
    # A local peak at x = 1 (below tau) and the only feasible configurations at x = 8.
    accuracy = np.where(x <= 4, 0.6 - 0.05 * np.abs(x - 1), 0.3 + 0.075 * (x - 4)) + 0.01 * m
    ones = _ones(accuracy)
    replay = Replay(space, ones, N, 1)
    needed = int(ones.max())
    outcome = search(space, replay, N, SearchSettings(tau=needed / N, budgets=BUDGETS, seed=1))
    truth = {i for i in range(space.size) if ones[i] >= needed}
    assert truth <= {a.index for a in outcome.feasible}


# -- reporting -------------------------------------------------------------------------------


def test_progress_reports_every_batch_and_outcome_orders_feasible_by_accuracy() -> None:
    """Progress snapshots are monotone and end at the outcome's totals; feasible configurations
    come most accurate first; phases are the documented ones."""
    space, ones = constrained(np.random.default_rng(2))
    seen: list[Progress] = []
    outcome = search(
        space,
        Replay(space, ones, N, 2),
        N,
        SearchSettings(tau=_threshold(ones, 0.06) / N, budgets=BUDGETS, seed=2),
        progress=seen.append,
    )
    assert seen
    assert all(a.sample_evals <= b.sample_evals for a, b in itertools.pairwise(seen))
    assert seen[-1].sample_evals == outcome.sample_evals
    assert seen[-1].configs_evaluated == outcome.configs_evaluated
    assert seen[-1].feasible == len(outcome.feasible)
    assert {p.phase for p in seen} <= {"seeding", "climbing", "expanding", "completing"}
    assert seen[0].phase == "seeding"
    accuracies = [a.accuracy for a in outcome.feasible]
    assert accuracies == sorted(accuracies, reverse=True)
    assert all(a.verdict is not FeasibilityVerdict.UNDECIDED for a in outcome.assessments)


@pytest.mark.parametrize("concurrency", [None, 8])
def test_complete_feasible_scores_the_feasible_set_on_every_sample_once(
    tmp_path: Path, concurrency: int | None
) -> None:
    """Exact accuracies for the front; verdicts and the rest untouched; no sample twice; the
    same through a runner that scores every configuration's chunk at once."""
    outcome, replay, _ = _run(additive_with_interactions, 0.3, seed=3)
    early = [a for a in outcome.feasible if a.samples < N]
    assert early, "the landscape must accept some configuration before the last budget"
    # The search's checkpoint: every score it recorded.
    checkpoint = CheckpointLedger(tmp_path / "ledger.jsonl")
    for index, samples in replay.sequences.items():
        recorded = list(dict.fromkeys(samples))
        checkpoint.append(replay.space.config(index), recorded, replay.scores[index, recorded])
    before = Counter(replay.asked)
    checkpointed = CheckpointedEvaluator(replay, checkpoint)
    runner = (
        None
        if concurrency is None
        else VirtualRunner(checkpointed, concurrency, jittered_service(1.0))
    )
    completed = complete_feasible(outcome, checkpointed, runner)
    for old, new in zip(outcome.assessments, completed.assessments, strict=True):
        assert (new.index, new.verdict) == (old.index, old.verdict)
        if old.feasible:
            assert new.samples == N
            assert new.accuracy == pytest.approx(float(replay.scores[old.index].mean()))
        else:
            assert new.scores == old.scores
    # Only the feasible configurations' missing samples were asked for, each once.
    extra = replay.asked - before
    assert set(extra.values()) == {1}
    assert {i for i, _ in extra} == {a.index for a in early}
    assert completed.sample_evals - outcome.sample_evals == sum(N - a.samples for a in early)
