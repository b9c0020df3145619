"""Early stopping: exact bounds, Wilson and betting tests, and the false-reject guarantee."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import hypergeom, norm

from compass.domain import statistics
from compass.domain.search import SearchSettings
from compass.domain.statistics import (
    FeasibilityVerdict,
    IntervalMethod,
    StoppingRule,
    betting_log_capital,
    lower_tail_bound,
    reference_budgets,
    wilson_interval,
)

METHODS = list(IntervalMethod)
# The default schedule, ending at the dataset size so the last look is exact.
N = 100
BUDGETS = (10, 25, 50, 100)


def _first_verdict(
    rule: StoppingRule, scores: npt.NDArray[np.float64]
) -> tuple[int, FeasibilityVerdict]:
    """Walk the budget schedule as the search does; the budget that decided and the verdict."""
    for budget in rule.budgets:
        verdict = rule.look(scores[:budget])[0]
        if verdict is not FeasibilityVerdict.UNDECIDED:
            return budget, verdict
    raise AssertionError("the last budget must always yield a verdict")


def _binary(ones: int, n: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    scores = np.zeros(n)
    scores[:ones] = 1.0
    return rng.permutation(scores)


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tau": 0.0}, "tau must be in"),
        ({"tau": 1.5}, "tau must be in"),
        ({"confidence": 1.0}, "confidence must be in"),
        ({"budgets": ()}, "strictly increasing"),
        ({"budgets": (10, 10, 20)}, "strictly increasing"),
        ({"budgets": (0, 10)}, "budgets must lie in 1..100"),
        ({"budgets": (10, 101)}, "budgets must lie in 1..100"),
    ],
)
def test_rule_rejects_impossible_settings(kwargs: dict[str, object], message: str) -> None:
    """Each impossible setting is refused with a message that names it."""
    arguments: dict[str, object] = {"tau": 0.8, "population": N, "budgets": BUDGETS}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        StoppingRule(**arguments)  # type: ignore[arg-type]


# -- layer 1: exact bounds -------------------------------------------------------------------


@st.composite
def _prefixes(draw: st.DrawFn) -> tuple[StoppingRule, list[float]]:
    population = draw(st.integers(2, 60))
    cuts = draw(st.sets(st.integers(1, population), min_size=1, max_size=4))
    budgets = tuple(sorted(cuts))
    seen = draw(st.sampled_from(budgets))
    grid = st.sampled_from([0.0, 0.25, 0.5, 1.0]) | st.floats(0, 1)
    scores = draw(st.lists(grid, min_size=seen, max_size=seen))
    rule = StoppingRule(
        tau=draw(st.floats(0.01, 1.0)),
        population=population,
        budgets=budgets,
        space_size=draw(st.integers(1, 500)),
        method=draw(st.sampled_from(METHODS)),
    )
    return rule, scores


@settings(max_examples=100, deadline=None, derandomize=True)
@given(_prefixes())
def test_certain_verdicts_are_given_and_never_contradicted(
    case: tuple[StoppingRule, list[float]],
) -> None:
    """The full mean lies in [S/N, (S+N-b)/N]: a verdict certain from that range is given, and no
    verdict ever contradicts it (nothing is accepted that cannot reach tau, or the reverse)."""
    rule, scores = case
    total, seen, n = math.fsum(scores), len(scores), rule.population
    lowest, highest = total / n, (total + n - seen) / n
    verdict = rule.look(scores)[0]
    if lowest >= rule.tau:
        assert verdict is FeasibilityVerdict.FEASIBLE
    if highest < rule.tau - 2e-9:
        assert verdict is FeasibilityVerdict.INFEASIBLE
    if verdict is FeasibilityVerdict.FEASIBLE:
        assert highest >= rule.tau - 2e-9
    if verdict is FeasibilityVerdict.INFEASIBLE:
        assert lowest < rule.tau
    if seen == rule.budgets[-1]:
        assert verdict is not FeasibilityVerdict.UNDECIDED


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    population=st.integers(1, 80),
    data=st.data(),
    method=st.sampled_from(METHODS),
    space_size=st.integers(1, 1000),
)
def test_full_dataset_verdict_is_the_mean_against_tau(
    population: int, data: st.DataObject, method: IntervalMethod, space_size: int
) -> None:
    """At b = N nothing is estimated: the verdict is exactly (mean >= tau), whatever the method,
    including a mean at tau itself."""
    ones = data.draw(st.integers(0, population))
    fraction = data.draw(st.sampled_from([0.0, 0.5, 0.1]))
    scores = [1.0] * ones + [0.0] * (population - ones)
    if fraction and ones < population:
        scores[-1] = fraction
    order = data.draw(st.permutations(scores))
    mean = math.fsum(scores) / population
    # tau exactly at the mean, or one grid step either side.
    tau = data.draw(st.sampled_from([mean, mean + 1 / population, mean - 1 / population]))
    if not 0 < tau <= 1:
        return
    rule = StoppingRule(
        tau=tau,
        population=population,
        budgets=(population,),
        space_size=space_size,
        method=method,
    )
    expected = FeasibilityVerdict.FEASIBLE if mean >= tau else FeasibilityVerdict.INFEASIBLE
    assert rule.look(order)[0] is expected


def test_mean_at_tau_survives_float_summation() -> None:
    """Six scores of 0.1 sum to a hair below 0.6 in floats; a mean at tau is still feasible."""
    scores = [0.1] * 6
    tau = 0.1
    assert np.sum(scores) / len(scores) < tau  # the float sum really is off
    for method in METHODS:
        rule = StoppingRule(tau=tau, population=6, budgets=(3, 6), method=method)
        assert rule.look(scores)[0] is FeasibilityVerdict.FEASIBLE


def test_last_budget_below_population_falls_back_to_the_point_estimate() -> None:
    """Layer 3: when the schedule stops short of N, an undecided prefix is judged by its mean."""
    rule = StoppingRule(tau=0.8, population=1000, budgets=(10, 20), space_size=100)
    above = [1.0] * 17 + [0.0] * 3  # 0.85: too close to tau for any test at b = 20
    below = [1.0] * 15 + [0.0] * 5  # 0.75
    for scores, expected in (
        (above, FeasibilityVerdict.FEASIBLE),
        (below, FeasibilityVerdict.INFEASIBLE),
    ):
        assert rule.look(scores[:10])[0] is FeasibilityVerdict.UNDECIDED
        assert rule.look(scores)[0] is expected


# -- layer 2: Wilson -------------------------------------------------------------------------


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    mean=st.floats(0, 1),
    seen=st.integers(1, 200),
    extra=st.integers(0, 500),
    z=st.floats(0.5, 5),
)
def test_wilson_interval_contains_the_mean_and_narrows_to_it(
    mean: float, seen: int, extra: int, z: float
) -> None:
    """The interval lies in [0, 1] around the mean; the finite-population correction makes it
    narrower than the infinite-population one, and at b = N it is the point itself."""
    population = seen + extra
    lower, upper = wilson_interval(mean, seen, z, population)
    assert -1e-12 <= lower <= mean + 1e-12
    assert mean - 1e-12 <= upper <= 1 + 1e-12
    wide_lower, wide_upper = wilson_interval(mean, seen, z, 10**12)
    assert upper - lower <= wide_upper - wide_lower + 1e-12
    point = wilson_interval(mean, population, z, population)
    assert point == pytest.approx((mean, mean), abs=1e-12)


def test_wilson_interval_narrows_as_the_prefix_grows() -> None:
    """For a fixed mean, every extra sample (and the correction) narrows the interval."""
    widths = [np.subtract(*wilson_interval(0.7, b, 1.96, 100)[::-1]) for b in range(1, 101)]
    assert all(a > b for a, b in itertools.pairwise(widths))
    assert widths[-1] == pytest.approx(0.0, abs=1e-12)


def test_bonferroni_counts_statistical_looks_only() -> None:
    """A look at the whole dataset is exact and spends no error; every other look does."""
    assert StoppingRule(tau=0.8, population=100, budgets=(10, 25, 50, 100)).statistical_looks == 3
    assert StoppingRule(tau=0.8, population=200, budgets=(10, 25, 50, 100)).statistical_looks == 4
    assert StoppingRule(tau=0.8, population=100, budgets=(100,)).statistical_looks == 1


def test_more_looks_and_larger_spaces_make_verdicts_harder() -> None:
    """Bonferroni over looks and over the space: a prefix accepted (or rejected) by a rule with
    one statistical look is undecided once it is one of ten looks; a large space makes only
    rejection harder, since rejection is controlled for the whole search."""
    high = [1.0] * 80 + [0.0] * 20  # 0.80 at b = 100 of N = 1000, tau = 0.72
    low = [1.0] * 62 + [0.0] * 38  # 0.62
    ten = (*range(100, 1000, 100), 1000)
    for method in METHODS:
        one_look = StoppingRule(tau=0.72, population=1000, budgets=(100, 1000), method=method)
        ten_looks = StoppingRule(tau=0.72, population=1000, budgets=ten, method=method)
        big = StoppingRule(
            tau=0.72, population=1000, budgets=(100, 1000), space_size=10**6, method=method
        )
        if method is IntervalMethod.WILSON:
            assert one_look.look(high)[0] is FeasibilityVerdict.FEASIBLE
            assert ten_looks.look(high)[0] is FeasibilityVerdict.UNDECIDED
            assert big.look(high)[0] is FeasibilityVerdict.FEASIBLE
            assert one_look.look(low)[0] is FeasibilityVerdict.INFEASIBLE
            assert ten_looks.look(low)[0] is FeasibilityVerdict.UNDECIDED
        assert big.look(low)[0] is FeasibilityVerdict.UNDECIDED
        # Betting needs no correction for looks: more looks change nothing.
        if method is IntervalMethod.BETTING:
            assert ten_looks.look(high)[0] is one_look.look(high)[0]
            assert ten_looks.look(low)[0] is one_look.look(low)[0]
    one, many = (
        StoppingRule(tau=0.72, population=1000, budgets=(100, 1000)),
        StoppingRule(tau=0.72, population=1000, budgets=ten, space_size=10**6),
    )
    assert many._wilson_z[0] > one._wilson_z[0]
    assert many._wilson_z[1] > one._wilson_z[1]


# -- the tail bound behind every rejection ---------------------------------------------------


@settings(max_examples=50, deadline=None, derandomize=True)
@given(
    values=st.lists(
        st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]) | st.floats(0, 1), min_size=2, max_size=9
    ),
    data=st.data(),
)
def test_lower_tail_bound_holds_for_any_population_in_unit_interval(
    values: list[float], data: st.DataObject
) -> None:
    """Enumerate every prefix of a small population (continuous scores allowed): the exact
    probability that the prefix sums to <= s never exceeds the bound computed from tau = the
    population's mean (or a lower tau, which only loosens the null)."""
    population = len(values)
    seen = data.draw(st.integers(1, population - 1))
    mean = math.fsum(values) / population
    if mean <= 0:
        return
    tau = data.draw(st.sampled_from([mean, mean * 0.9]))
    sums = np.array([math.fsum(c) for c in itertools.combinations(values, seen)])
    for threshold in np.unique(sums):
        exact = float(np.mean(sums <= threshold + 1e-12))
        assert exact <= lower_tail_bound(float(threshold), seen, tau, population) + 1e-9


def test_lower_tail_bound_is_close_to_the_exact_binary_tail() -> None:
    """For binary scores the bound sits above the exact hypergeometric tail, and within a small
    factor of it where it matters (small tails), so rejections are not needlessly late."""
    population, tau = 100, 0.9
    ones = round(population * tau)
    for seen in (10, 25, 50):
        for successes in range(seen + 1):
            exact = float(hypergeom.cdf(successes, population, ones, seen))
            bound = lower_tail_bound(float(successes), seen, tau, population)
            assert exact <= bound + 1e-12
            if exact < 1e-3:
                assert bound <= 1.1 * exact


# -- the guarantee: feasible configurations are rarely rejected ------------------------------


def _exact_reject_probability(
    population: int,
    ones: int,
    budgets: tuple[int, ...],
    decide: Callable[[int, int], FeasibilityVerdict],
) -> float:
    """P(a binary configuration with this many ones is rejected) walking the schedule, exactly:
    the count of ones in each prefix is a hypergeometric chain."""
    alive = {0: 1.0}
    seen = 0
    rejected = 0.0
    for budget in budgets:
        draws = budget - seen
        nxt: dict[int, float] = {}
        for count, p in alive.items():
            left_ones, left = ones - count, population - seen
            ks = np.arange(max(0, draws - (left - left_ones)), min(draws, left_ones) + 1)
            for k, q in zip(ks, hypergeom.pmf(ks, left, left_ones, draws), strict=True):
                nxt[count + int(k)] = nxt.get(count + int(k), 0.0) + p * float(q)
        seen = budget
        alive = {}
        for count, p in nxt.items():
            verdict = decide(count, budget)
            if verdict is FeasibilityVerdict.INFEASIBLE:
                rejected += p
            elif verdict is FeasibilityVerdict.UNDECIDED:
                alive[count] = p
    return rejected


def _uncorrected(tau: float, population: int) -> Callable[[int, int], FeasibilityVerdict]:
    """What a plain one-sided 95% Wilson test at every look would do (no Bonferroni)."""
    z = float(norm.ppf(0.95))

    def decide(count: int, seen: int) -> FeasibilityVerdict:
        if seen == population:
            return (
                FeasibilityVerdict.FEASIBLE
                if count / seen >= tau
                else FeasibilityVerdict.INFEASIBLE
            )
        lower, upper = wilson_interval(count / seen, seen, z, population)
        if upper < tau:
            return FeasibilityVerdict.INFEASIBLE
        return FeasibilityVerdict.FEASIBLE if lower >= tau else FeasibilityVerdict.UNDECIDED

    return decide


@pytest.mark.parametrize("tau", [0.5, 0.7, 0.8, 0.9, 0.95])
@pytest.mark.parametrize("space_size", [1, 20, 234])
def test_wilson_false_reject_probability_is_within_its_share(tau: float, space_size: int) -> None:
    """Binary scores with full mean exactly tau (the hardest feasible case): the exact probability
    of rejection over the whole schedule is <= (1 - confidence) / space_size. A per-look 95% test
    without correction exceeds the search-wide 5% on its own."""
    ones = math.ceil(N * tau - 1e-9)
    rule = StoppingRule(tau=tau, population=N, budgets=BUDGETS, space_size=space_size)

    def ours(count: int, seen: int) -> FeasibilityVerdict:
        return rule.look(np.array([1.0] * count + [0.0] * (seen - count)))[0]

    assert _exact_reject_probability(N, ones, BUDGETS, ours) <= rule.alpha_reject
    if space_size == 1:
        assert _exact_reject_probability(N, ones, BUDGETS, _uncorrected(tau, N)) > 0.05


def test_false_reject_rate_monte_carlo_both_methods() -> None:
    """Thousands of simulated feasible configurations through the default schedule, at tau 0.95
    where the normal approximation is worst: binary scores exactly at tau, one sample above it,
    and F1-like scores with full mean exactly tau. Each method's false-reject rate in each group
    is below the nominal 5% (plus three standard errors); an uncorrected per-look 95% test on
    the same prefixes rejects well above it."""
    rng = np.random.default_rng(20240611)
    tau, bound = 0.95, 0.05
    groups: dict[str, list[npt.NDArray[np.float64]]] = {
        "binary at tau": [_binary(95, N, rng) for _ in range(1000)],
        "binary above tau": [_binary(96, N, rng) for _ in range(500)],
        "F1-like at tau": [],
    }
    while len(groups["F1-like at tau"]) < 500:
        # Mostly near 1 with a tail of partial credit, scaled down so the full mean is tau.
        scores = rng.beta(30, 1, N)
        if scores.mean() > tau:
            groups["F1-like at tau"].append(scores * (tau / scores.mean()))
    for name, populations in groups.items():
        assert all(p.mean() >= tau - 1e-9 for p in populations), name
        margin = 3 * math.sqrt(bound * (1 - bound) / len(populations))
        for method in METHODS:
            rule = StoppingRule(tau=tau, population=N, budgets=BUDGETS, method=method)
            rejects = sum(
                _first_verdict(rule, p)[1] is FeasibilityVerdict.INFEASIBLE for p in populations
            )
            assert rejects / len(populations) <= bound + margin, (name, method, rejects)
    at_tau = groups["binary at tau"]
    uncorrected = _uncorrected(tau, N)
    plain = 0
    for p in at_tau:
        for budget in BUDGETS:
            verdict = uncorrected(int(p[:budget].sum()), budget)
            if verdict is not FeasibilityVerdict.UNDECIDED:
                plain += verdict is FeasibilityVerdict.INFEASIBLE
                break
    assert plain / len(at_tau) > bound + 3 * math.sqrt(bound * (1 - bound) / len(at_tau))


def test_infeasible_configurations_are_still_rejected_early() -> None:
    """The guarantee is not bought by never stopping: configurations at half of tau are all
    rejected before the last look, most of them by the second, by both methods."""
    rng = np.random.default_rng(3)
    for method in METHODS:
        rule = StoppingRule(tau=0.8, population=N, budgets=BUDGETS, space_size=50, method=method)
        decided = [_first_verdict(rule, _binary(40, N, rng)) for _ in range(40)]
        assert all(v is FeasibilityVerdict.INFEASIBLE for _, v in decided)
        spent = [b for b, _ in decided]
        assert max(spent) < N
        assert np.mean(spent) <= 35, (method, spent)


# -- betting ---------------------------------------------------------------------------------


def test_betting_decides_earlier_on_low_variance_scores() -> None:
    """F1-like scores concentrated near their mean: Wilson must assume Bernoulli variance, the
    betting test learns the small variance and stops at least twice as early, both ways, with
    the right verdict."""
    rng = np.random.default_rng(11)
    population, budgets = 200, (10, 25, 50, 100, 200)
    for centre, expected in (
        (0.9, FeasibilityVerdict.FEASIBLE),
        (0.7, FeasibilityVerdict.INFEASIBLE),
    ):
        spent: dict[IntervalMethod, list[int]] = {m: [] for m in METHODS}
        for _ in range(30):
            scores = np.clip(rng.normal(centre, 0.03, population), 0, 1)
            for method in METHODS:
                rule = StoppingRule(
                    tau=0.8, population=population, budgets=budgets, space_size=20, method=method
                )
                budget, verdict = _first_verdict(rule, scores)
                assert verdict is expected
                spent[method].append(budget)
        wilson = np.mean(spent[IntervalMethod.WILSON])
        betting = np.mean(spent[IntervalMethod.BETTING])
        assert betting * 1.5 <= wilson, (centre, betting, wilson)


def test_betting_capital_grows_only_against_the_truth() -> None:
    """Scores above tau grow the 'up' bet and never the 'down' bet, and the reverse."""
    rng = np.random.default_rng(5)
    high = np.clip(rng.normal(0.9, 0.05, 60), 0, 1)
    low = np.clip(rng.normal(0.6, 0.05, 60), 0, 1)
    up, down = betting_log_capital(high, 0.75, 1000)
    assert up > math.log(20) > 0 >= down
    up, down = betting_log_capital(low, 0.75, 1000)
    assert down > math.log(20) > 0 >= up


def test_betting_stakes_are_predictable() -> None:
    """The stake on draw t is fixed before draw t is seen: as the last score varies, the last
    factor exp(delta) - 1 = stake * (x - c) is affine in it, on both bets."""
    rng = np.random.default_rng(9)
    prefix = list(rng.random(29))
    base = betting_log_capital(np.array(prefix), 0.4, 100)
    for side in (0, 1):
        last = np.array([0.0, 0.3, 0.7, 1.0])
        factor = np.array(
            [
                math.expm1(betting_log_capital(np.array([*prefix, x]), 0.4, 100)[side] - base[side])
                for x in last
            ]
        )
        slope, intercept = np.polyfit(last, factor, 1)
        np.testing.assert_allclose(factor, slope * last + intercept, atol=1e-12)
    # The stake on the first draw is the prior's: a 0.5 mean prior against tau 0.4 bets up.
    up, down = betting_log_capital(np.array([1.0]), 0.4, 100)
    assert up > 0
    assert down == 0


# -- defaults --------------------------------------------------------------------------------


def test_default_method_is_the_one_the_docstring_names() -> None:
    """SearchSettings, StoppingRule and the module docstring agree on the default test."""
    doc = statistics.__doc__ or ""
    named = re.search(r"(\w+) \(the default of SearchSettings\.interval\b", doc)
    assert named is not None, "the statistics docstring should name the default test"
    default = SearchSettings(tau=0.8).interval
    assert named.group(1).lower() == default.value
    assert StoppingRule(tau=0.8, population=10, budgets=(10,)).method is default


# -- where to look -----------------------------------------------------------------------------


def _first_decisive(rule: StoppingRule, scores: npt.NDArray[np.float64]) -> int:
    """The sample count at which looking after every sample first reaches a verdict."""
    for seen in range(1, len(scores) + 1):
        if rule.look(scores[:seen])[0] is not FeasibilityVerdict.UNDECIDED:
            return seen
    raise AssertionError("the full dataset always decides")


def _looks(rule: StoppingRule, scores: npt.NDArray[np.float64]) -> list[int]:
    """The sample counts the search looks at, following next_look until a verdict."""
    seen, looks = 0, []
    while True:
        look = rule.next_look(scores[:seen])
        assert look is not None
        assert look > seen
        looks.append(look)
        seen = look
        if rule.look(scores[:seen])[0] is not FeasibilityVerdict.UNDECIDED:
            return looks


@settings(max_examples=60, deadline=None)
@given(
    mean=st.floats(0.05, 0.95),
    tau=st.floats(0.1, 0.95),
    binary=st.booleans(),
    space_size=st.sampled_from([1, 50, 5000]),
    seed=st.integers(0, 2**31),
)
def test_next_look_skips_only_looks_that_could_not_decide(
    mean: float, tau: float, binary: bool, space_size: int, seed: int
) -> None:
    """Following next_look stops at exactly the sample a look after every sample stops at."""
    rng = np.random.default_rng(seed)
    population = 150
    scores = (
        (rng.random(population) < mean).astype(np.float64)
        if binary
        else np.clip(rng.normal(mean, 0.15, population), 0, 1)
    )
    rule = StoppingRule(tau=tau, population=population, space_size=space_size)
    assert rule._points is None  # a look after any sample
    looks = _looks(rule, scores)
    assert looks[-1] == _first_decisive(rule, scores)


def test_next_look_saves_evaluator_calls() -> None:
    """Far from any threshold the first looks jump ahead; the verdict needs few calls."""
    rng = np.random.default_rng(3)
    scores = (rng.random(400) < 0.6).astype(np.float64)
    rule = StoppingRule(tau=0.8, population=400, space_size=300)
    first = rule.next_look(scores[:0])
    assert first is not None
    # Nothing is known yet, and no score alone can decide: the first look waits until one can.
    assert first > 5
    assert rule.look(scores[: first - 1])[0] is FeasibilityVerdict.UNDECIDED
    looks = _looks(rule, scores)
    assert len(looks) <= looks[-1] / 4, looks


def test_next_look_keeps_wilson_on_its_budgets() -> None:
    """Wilson's looks are fixed in advance (its Bonferroni split counts them)."""
    rule = StoppingRule(tau=0.8, population=200, method=IntervalMethod.WILSON)
    assert rule._points == (10, 25, 50, 100, 200)
    assert rule.next_look(np.ones(10)) == 25
    assert rule.next_look([]) == 10


@pytest.mark.parametrize(
    ("population", "expected"),
    [
        (5, (5,)),
        (10, (10,)),
        (40, (10, 25, 40)),
        (100, (10, 25, 50, 100)),
        (1000, (10, 25, 50, 100, 1000)),
    ],
)
def test_reference_budgets_end_at_the_dataset_size(
    population: int, expected: tuple[int, ...]
) -> None:
    """Every default schedule ends at N, so no verdict falls back to a point estimate."""
    assert reference_budgets(population) == expected
    for method in IntervalMethod:
        assert StoppingRule(tau=0.5, population=population, method=method).last_look == population
    assert StoppingRule(tau=0.5, population=1000, budgets=(10, 100)).last_look == 100


def test_betting_past_a_short_schedule_looks_at_its_end() -> None:
    """With budgets ending below N, an undecided configuration goes to the last budget."""
    rule = StoppingRule(tau=0.62, population=1000, budgets=(10, 20, 40), space_size=10**4)
    scores = np.array([1.0, 0.0] * 20)
    # Ten scores could decide neither way (acceptance needs about 12 ones in a row), so 10 is
    # skipped; 20 can accept but not reject (which needs about 21 zeros), and does neither here.
    assert _looks(rule, scores) == [20, 40]
    assert rule.next_look(scores) is None
    assert rule.look(scores)[0] is FeasibilityVerdict.INFEASIBLE  # the point estimate 0.5 < 0.62


def _even_path(scores: list[float], steps: int) -> list[float]:
    """The scores, then 0s and 1s spread as evenly as their mean allows (likely_verdict's
    guess at what comes next)."""
    mean = sum(scores) / len(scores)
    ones = [math.floor(j * mean + 0.5) for j in range(steps + 1)]
    return scores + [float(b - a) for a, b in itertools.pairwise(ones)]


@pytest.mark.parametrize(
    ("method", "tau", "scores"),
    [
        (IntervalMethod.BETTING, 0.8, [1.0, 1.0, 0.0, 1.0, 1.0]),
        (IntervalMethod.BETTING, 0.8, [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]),
        (IntervalMethod.BETTING, 0.5, [0.0, 0.0, 1.0]),
        (IntervalMethod.BETTING, 0.6, [0.7, 0.4, 0.9, 0.5]),
        (IntervalMethod.WILSON, 0.8, [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
    ],
)
def test_likely_verdict_is_where_scores_going_on_alike_are_judged(
    method: IntervalMethod, tau: float, scores: list[float]
) -> None:
    rule = StoppingRule(tau=tau, population=200, space_size=100, method=method)
    assert rule.look(scores)[0] is FeasibilityVerdict.UNDECIDED
    likely = rule.likely_verdict(scores, horizon=500)
    assert likely is not None
    assert likely > len(scores)
    path = _even_path(scores, likely - len(scores))
    assert rule.look(path[:likely])[0] is not FeasibilityVerdict.UNDECIDED
    # No earlier look along that path decides: the guess is the first verdict, not a later one.
    earlier = [t for t in rule._points or range(1, 201) if len(scores) < t < likely]
    assert all(rule.look(path[:t])[0] is FeasibilityVerdict.UNDECIDED for t in earlier)
    # It is never before the first look at which any scores could decide.
    next_look = rule.next_look(scores)
    assert next_look is not None
    assert likely >= next_look


def test_likely_verdict_is_capped_and_absent_where_no_look_is_left() -> None:
    rule = StoppingRule(tau=0.8, population=200, space_size=100)
    near_tau = [1.0, 1.0, 1.0, 1.0, 0.0] * 4  # mean 0.8: the verdict is far away
    assert rule.likely_verdict(near_tau, horizon=10) == len(near_tau) + 10
    assert rule.likely_verdict([], horizon=10) is None
    assert rule.likely_verdict([1.0] * 200, horizon=10) is None
    # Far from tau, the verdict comes sooner than near it.
    far = rule.likely_verdict([0.0, 0.0, 1.0, 0.0, 0.0], horizon=500)
    near = rule.likely_verdict([1.0, 1.0, 1.0, 1.0, 0.0], horizon=500)
    assert far is not None
    assert near is not None
    assert far < near
