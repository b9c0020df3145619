"""What `compass search` and `compass demo` share: the search options and the closing report."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from compass.commands.common import check_output
from compass.console import UsageError, fail, parse_int, parse_seed, shown
from compass.domain.search import (
    DEFAULT_BATCH,
    MAX_BATCH,
    SearchMethod,
    SearchOutcome,
    SearchSettings,
)
from compass.domain.statistics import IntervalMethod, describe_schedule
from compass.evaluators.files import write_replacing

SHOWN_FEASIBLE = 10


# ---------------------------------------------------------------------------- options


def add_settings(parser: argparse.ArgumentParser, tau_default: str | None) -> None:
    """Options shared by `search` and `demo`: what the search looks for and how."""
    if tau_default is None:
        parser.add_argument(
            "--tau", required=True, help="accuracy target in (0, 1]: find every config >= it"
        )
    else:
        parser.add_argument(
            "--tau", default=tau_default, help=f"accuracy target in (0, 1] (default {tau_default})"
        )
    parser.add_argument(
        "--budgets",
        help="comma-separated, strictly increasing sample counts at which a configuration may "
        "be judged (default: betting looks wherever a verdict has become possible; wilson uses "
        "10,25,50,100 below the dataset size, then the dataset size)",
    )
    parser.add_argument(
        "--confidence", default="0.95", help="confidence of each verdict (default 0.95)"
    )
    parser.add_argument("--seed", default="0", help="seed of the sample order and the search")
    parser.add_argument(
        "--method",
        choices=[m.value for m in SearchMethod],
        default=SearchMethod.COMPASS_V.value,
        help="compass-v (default) or grid (every configuration, with early stopping)",
    )
    parser.add_argument(
        "--interval",
        choices=[m.value for m in IntervalMethod],
        default=IntervalMethod.BETTING.value,
        help="early-stopping test: betting (default; anytime-valid) or wilson",
    )
    parser.add_argument(
        "--batch",
        default=str(DEFAULT_BATCH),
        help=f"configurations a round evaluates side by side (default {DEFAULT_BATCH}: the "
        "one-at-a-time search): what --concurrency can overlap beyond one configuration's "
        "samples, e.g. 16; a larger batch evaluates a few %% more samples",
    )
    parser.add_argument("--output", metavar="RESULT.json", help="write the result JSON here")


def parse_settings(args: argparse.Namespace) -> tuple[SearchSettings, Path | None]:
    """The options add_settings declared, checked (the budgets against the dataset size later:
    check_budgets), and --output; UsageError names the first bad one."""
    tau = _parse_float("--tau", str(args.tau))
    if not 0 < tau <= 1:
        fail(
            "--tau",
            f"{tau:g} is outside (0, 1]",
            "pass the target accuracy as a fraction, e.g. --tau 0.8",
        )
    confidence = _parse_float("--confidence", str(args.confidence))
    if not 0 < confidence < 1:
        fail("--confidence", f"{confidence:g} is outside (0, 1)", "pass e.g. --confidence 0.95")
    output = None if args.output is None else Path(str(args.output))
    if output is not None:
        check_output("--output", output, {})  # search checks its own inputs first; demo has none
    settings = SearchSettings(
        tau=tau,
        budgets=None if args.budgets is None else parse_budgets(str(args.budgets)),
        confidence=confidence,
        seed=parse_seed(str(args.seed)),
        method=SearchMethod(args.method),
        interval=IntervalMethod(args.interval),
        batch=parse_int("--batch", str(args.batch), "1", low=1, high=MAX_BATCH),
    )
    return settings, output


def _parse_float(field: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        fail(field, f"{shown(text)} is not a number", f"pass a number, e.g. {field} 0.8")
    return value


def parse_budgets(text: str) -> tuple[int, ...]:
    """Comma-separated budgets, checked for shape; the dataset size is checked later."""
    fix = "pass comma-separated sample counts, smallest first, e.g. --budgets 10,25,50,100"
    budgets = []
    for part in text.split(","):
        try:
            budgets.append(parse_int("--budgets", part.strip(), "10,25,50,100"))
        except UsageError:
            fail("--budgets", f"{shown(part.strip())} is not a sample count", fix)
    if budgets[0] < 1:
        fail("--budgets", f"{budgets[0]} is below 1", fix)
    for before, after in itertools.pairwise(budgets):
        if after <= before:
            fail("--budgets", f"{text} is not strictly increasing ({before} then {after})", fix)
    return tuple(budgets)


def check_budgets(given: tuple[int, ...] | None, population: int, source: str) -> None:
    """Fail unless the budgets given fit the dataset (none given: the test's own schedule)."""
    if given is not None and given[-1] > population:
        fail(
            "--budgets",
            f"{given[-1]} is above the dataset size {population} ({source})",
            f"keep every budget <= {population}",
        )


# ---------------------------------------------------------------------------- report


def summary(
    outcome: SearchOutcome, settings: SearchSettings, result: Path | None, ledger: str
) -> str:
    """The one-screen report printed at the end of a search."""
    space_size = outcome.space.size
    population = outcome.population
    feasible = outcome.feasible
    lines = [
        f"tau {settings.tau:g}, method {settings.method.value}, interval "
        f"{settings.interval.value} (confidence {settings.confidence:g}), budgets "
        f"{describe_schedule(settings.budgets, settings.interval, outcome.population)}, seed {settings.seed}",
        f"space: {space_size:,} configurations, {population:,} samples each",
        f"feasible: {len(feasible)} found (accuracy >= {settings.tau:g}); accuracy below is the "
        "mean over the samples evaluated",
    ]
    if feasible:
        lines.append(f"  {'accuracy':>8}  {'samples':>7}  configuration")
        for a in feasible[:SHOWN_FEASIBLE]:
            config = outcome.space.config(a.index)
            described = " ".join(f"{name}={value}" for name, value in config.items())
            lines.append(f"  {a.accuracy:>8.3f}  {a.samples:>7}  {described}")
        if len(feasible) > SHOWN_FEASIBLE:
            where = "with --output RESULT.json" if result is None else f"in {result}"
            lines.append(f"  ... and {len(feasible) - SHOWN_FEASIBLE} more, listed {where}")
    exhaustive = space_size * population
    savings = 1 - outcome.sample_evals / exhaustive
    lines += [
        f"evaluated: {outcome.configs_evaluated:,} of {space_size:,} configurations, "
        f"{outcome.sample_evals:,} sample evaluations",
        f"savings: {savings:.1%} fewer sample evaluations than exhaustive "
        f"({exhaustive:,} = {space_size:,} configurations x {population:,} samples)",
        f"stopped: {outcome.stop_reason}",
        f"result: {result or 'not written (pass --output RESULT.json to keep it)'}",
        f"ledger: {ledger}",
    ]
    return "\n".join(lines)


def write_result(outcome: SearchOutcome, output: Path | None) -> None:
    """Write the result file if asked (``output``)."""
    if output is not None:
        write_replacing(output, json.dumps(outcome.result_document(), indent=2) + "\n")
