"""Replay the paper's two grids: COMPASS-V versus the grid baseline, recall and sample savings.

Run as ``python bench/search_paper.py [--seeds 10] [--first-seed 0] [--jobs 2] [--plot PATH]
[--only rag|vision]``. Every grid row's recorded accuracy is replayed as per-sample scores whose
full mean equals it (``compass.examples.build_replay_ledger``), so ground truth is exact: a
configuration is feasible when its recorded accuracy is >= tau.

Three schedules side by side: the CLI's defaults (betting, looks wherever a verdict has become
possible), the reference's four budgets (10,25,50,100, then the dataset size) under betting, and
the same under Wilson (the defaults before betting). Beside them, the reference COMPASS-V's own
recall and savings from the paper's data (the vision grid; the paper publishes none per threshold
for RAG). The script always exits 0; the floors are printed as PASS/FAIL lines.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from compass.domain.evaluation import Config
from compass.domain.search import (
    Progress,
    SearchMethod,
    SearchSettings,
    search,
)
from compass.domain.space import Space, config_key
from compass.domain.statistics import IntervalMethod, describe_schedule, reference_budgets
from compass.examples import build_replay_ledger

REPO_ROOT = Path(__file__).resolve().parents[1]

# (ground-truth feasible count, per method the (sample_evals, feasible) points of seed 0)
Trace = tuple[int, dict[SearchMethod, list[tuple[int, int]]]]

DEFAULT_DATA = REPO_ROOT / "bench" / "data" / "compass-paper"
CONFIDENCE = 0.95
# Ground truth uses the same float tolerance as the search's exact checks.
TOLERANCE = 1e-9
FLOOR_MEAN_RECALL = 0.995
FLOOR_SEED_RECALL = 0.95
FLOOR_SAVINGS = 0.50
# COMPASS-V's mean savings on the reference's schedule before the adaptive looks (issue 17).
FLOOR_REFERENCE_SAVINGS = 0.389
REFERENCE_FILE = "search_vision_multi_slo_summary.json"
LABELS = {SearchMethod.COMPASS_V: "COMPASS-V", SearchMethod.GRID: "grid"}


@dataclass(frozen=True)
class Variant:
    """One schedule and test, with the methods run under it."""

    name: str
    interval: IntervalMethod
    reference_schedule: bool
    methods: tuple[SearchMethod, ...]


DEFAULTS = Variant(
    "defaults", IntervalMethod.BETTING, False, (SearchMethod.COMPASS_V, SearchMethod.GRID)
)
REFERENCE = Variant("reference", IntervalMethod.BETTING, True, (SearchMethod.COMPASS_V,))
REFERENCE_WILSON = Variant("ref-wilson", IntervalMethod.WILSON, True, (SearchMethod.COMPASS_V,))
VARIANTS = (DEFAULTS, REFERENCE, REFERENCE_WILSON)


@dataclass(frozen=True)
class Workflow:
    """One of the paper's grids: its file, its space and its thresholds."""

    name: str
    file: str
    rows_key: str
    population: int
    size: int
    space: Mapping[str, Any]
    taus: tuple[float, ...]
    plot_tau: float


WORKFLOWS: dict[str, Workflow] = {
    "rag": Workflow(
        name="rag",
        file="search_rag_grid_100.json",
        rows_key="all_evaluated",
        population=100,
        size=234,
        space={
            "parameters": [
                {
                    "name": "generator_model",
                    "type": "categorical",
                    "values": [
                        "gemma3:12b",
                        "llama3.1:8b",
                        "gemma3:4b",
                        "llama3.2:3b",
                        "gemma3:1b",
                        "llama3.2:1b",
                    ],
                },
                {"name": "retriever_k", "type": "integer", "values": [3, 5, 10, 20]},
                {"name": "reranker_k", "type": "integer", "values": [1, 3, 5, 10]},
                {
                    "name": "reranker_model",
                    "type": "categorical",
                    "values": ["bge-v2", "bge-base", "ms-marco"],
                },
            ],
            "constraints": ["reranker_k <= retriever_k"],
        },
        taus=(0.3, 0.4, 0.5, 0.6, 0.75, 0.8, 0.85, 0.9),
        plot_tau=0.8,
    ),
    "vision": Workflow(
        name="vision",
        file="search_vision_grid_search.json",
        rows_key="all_results",
        population=200,
        size=385,
        space={
            "parameters": [
                {
                    "name": "detector_model",
                    "type": "categorical",
                    "values": ["yolov8n", "yolov8s", "yolov8m"],
                },
                {
                    "name": "conf_threshold",
                    "type": "float",
                    "values": [0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5],
                },
                {
                    "name": "verifier_model",
                    "type": "categorical",
                    "values": ["yolov8m", "yolov8l", "yolov8x", "none"],
                },
                {
                    "name": "nms_threshold",
                    "type": "float",
                    "values": [0.3, 0.45, 0.5, 0.6, 0.7],
                },
            ],
            "constraints": ["verifier_model != detector_model"],
        },
        taus=(0.55, 0.6, 0.65, 0.7, 0.73, 0.75, 0.77, 0.78),
        plot_tau=0.77,
    ),
}


class ReplayEvaluator:
    """In-memory evaluator: each configuration's replayed per-sample scores."""

    def __init__(self, table: Mapping[str, npt.NDArray[np.float64]]) -> None:
        self.table = table
        self.calls = 0

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """Scores of this configuration at these sample indices."""
        self.calls += 1
        scores = self.table[config_key(config)][np.asarray(sample_indices, dtype=np.int64)]
        return [float(s) for s in scores]


@lru_cache(maxsize=4)
def load_grid(
    data_dir: str, name: str
) -> tuple[Space, tuple[dict[str, Any], ...], tuple[float, ...]]:
    """The space, the recorded rows and each space index's recorded accuracy; checked."""
    workflow = WORKFLOWS[name]
    path = Path(data_dir) / workflow.file
    rows = tuple(json.loads(path.read_text(encoding="utf-8"))[workflow.rows_key])
    space = Space.from_spec(workflow.space)
    assert space.size == workflow.size, f"{name}: space has {space.size}, expected {workflow.size}"
    accuracy = [math.nan] * space.size
    for row in rows:
        assert row["config"] in space, f"{name}: grid row {row['config']} is not in the space"
        accuracy[space.index(row["config"])] = float(row["accuracy"])
    missing = sum(math.isnan(a) for a in accuracy)
    assert not missing, f"{name}: {missing} configurations have no grid row"
    assert len(rows) == space.size, f"{name}: {len(rows)} rows for {space.size} configurations"
    return space, rows, tuple(accuracy)


@lru_cache(maxsize=4)
def replay_table(data_dir: str, name: str, seed: int) -> dict[str, npt.NDArray[np.float64]]:
    """config_key -> replayed scores for one ledger seed."""
    space, rows, _ = load_grid(data_dir, name)
    ledger = build_replay_ledger(list(rows), WORKFLOWS[name].population, seed)
    return {
        config_key(space.config(space.index(entry["config"]))): np.asarray(
            entry["scores"], dtype=np.float64
        )
        for entry in ledger
    }


@dataclass(frozen=True)
class Job:
    """One (grid, tau, seed) replay under one variant, each of its methods."""

    data_dir: str
    name: str
    tau: float
    seed: int
    variant: Variant
    budgets: tuple[int, ...] | None
    trace: bool


@dataclass
class MethodResult:
    """One method's outcome on one job."""

    found: int
    hits: int
    configs: int
    samples: int
    calls: int
    trajectory: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class JobResult:
    """Both methods' outcomes on one job."""

    job: Job
    truth: int
    methods: dict[SearchMethod, MethodResult]


def run_job(job: Job) -> JobResult:
    """Replay one threshold and seed with the variant's methods."""
    space, _, accuracy = load_grid(job.data_dir, job.name)
    truth = {i for i, a in enumerate(accuracy) if a >= job.tau - TOLERANCE}
    results: dict[SearchMethod, MethodResult] = {}
    for method in job.variant.methods:
        evaluator = ReplayEvaluator(replay_table(job.data_dir, job.name, 1000 + job.seed))
        trajectory: list[tuple[int, int]] = [(0, 0)]

        def record(progress: Progress, points: list[tuple[int, int]] = trajectory) -> None:
            points.append((progress.sample_evals, progress.feasible))

        settings = SearchSettings(
            tau=job.tau,
            budgets=job.budgets,
            confidence=CONFIDENCE,
            seed=job.seed,
            method=method,
            interval=job.variant.interval,
        )
        outcome = search(
            space,
            evaluator,
            WORKFLOWS[job.name].population,
            settings,
            progress=record if job.trace else None,
        )
        found = {a.index for a in outcome.feasible}
        results[method] = MethodResult(
            found=len(found),
            hits=len(found & truth),
            configs=outcome.configs_evaluated,
            samples=outcome.sample_evals,
            calls=evaluator.calls,
            trajectory=trajectory if job.trace else [],
        )
    return JobResult(job=job, truth=len(truth), methods=results)


@dataclass(frozen=True)
class Row:
    """One threshold's figures for one method, over seeds."""

    recall_mean: float
    recall_worst: float
    precision_mean: float
    configs_mean: float
    samples_mean: float
    savings: float
    looks_per_config: float


def summarise(results: Sequence[JobResult], method: SearchMethod, exhaustive: int) -> Row:
    """Recall, precision, cost and savings of one method at one threshold."""
    recalls = []
    precisions = []
    for result in results:
        outcome = result.methods[method]
        recalls.append(outcome.hits / result.truth if result.truth else 1.0)
        if outcome.found:
            precisions.append(outcome.hits / outcome.found)
    samples = float(np.mean([r.methods[method].samples for r in results]))
    return Row(
        recall_mean=float(np.mean(recalls)),
        recall_worst=min(recalls),
        precision_mean=float(np.mean(precisions)) if precisions else math.nan,
        configs_mean=float(np.mean([r.methods[method].configs for r in results])),
        samples_mean=samples,
        savings=1 - samples / exhaustive,
        looks_per_config=float(
            np.mean([r.methods[method].calls / max(1, r.methods[method].configs) for r in results])
        ),
    )


def parse_budgets(text: str | None, population: int, name: str) -> tuple[int, ...] | None:
    """A comma-separated schedule, checked against the dataset size; None for the default."""
    if text is None:
        return None
    try:
        budgets = tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError:
        raise SystemExit(f"--budgets-{name}: {text!r} is not a list of integers") from None
    if not budgets or any(b <= a for a, b in itertools.pairwise(budgets)):
        raise SystemExit(f"--budgets-{name}: {text!r} must be strictly increasing")
    if budgets[0] < 1 or budgets[-1] > population:
        raise SystemExit(f"--budgets-{name}: budgets must lie in 1..{population}")
    return budgets


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=10, help="seeds per threshold (default 10)")
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="first search seed (default 0); e.g. 10 for held-out seeds 10..19",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="compass-paper data dir")
    parser.add_argument("--only", choices=sorted(WORKFLOWS), help="replay one workflow only")
    parser.add_argument(
        "--taus", help="comma-separated thresholds to run (default: the paper's for each grid)"
    )
    parser.add_argument(
        "--plot", type=Path, default=REPO_ROOT / "bench" / "out" / "search_paper.png"
    )
    parser.add_argument(
        "--budgets-rag", help="the defaults' schedule on RAG (default: the CLI's, adaptive)"
    )
    parser.add_argument(
        "--budgets-vision", help="the defaults' schedule on vision (default: the CLI's, adaptive)"
    )
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be >= 1")
    if args.first_seed < 0:
        parser.error("--first-seed must be >= 0")
    return args


def selected_taus(workflow: Workflow, taus: str | None, only: bool) -> tuple[float, ...]:
    """The paper's thresholds; with --taus, those listed (any value if --only names this grid)."""
    if taus is None:
        return workflow.taus
    wanted = [float(t) for t in taus.split(",") if t.strip()]
    if only:
        return tuple(wanted)
    unknown = [
        t for t in wanted if not any(abs(t - p) < 1e-12 for w in WORKFLOWS.values() for p in w.taus)
    ]
    if unknown:
        raise SystemExit(f"--taus: {unknown} are not paper thresholds; name the grid with --only")
    return tuple(t for t in wanted if any(abs(t - p) < 1e-12 for p in workflow.taus))


def trajectory_at(points: Sequence[tuple[int, int]], samples: float) -> int:
    """Feasible configurations found once ``samples`` sample evaluations were spent."""
    found = 0
    for spent, feasible in points:
        if spent > samples + 1e-9:
            break
        found = feasible
    return found


def ascii_trajectories(traces: Mapping[tuple[str, float], Trace]) -> list[str]:
    """Feasible found at 10%..100% of each method's final sample count, as text."""
    lines = [
        "",
        "Samples spent vs feasible found (seed 0; columns = % of the method's final samples)",
    ]
    header = " ".join(f"{p:>5d}%" for p in range(10, 101, 10))
    for (name, tau), (truth, by_method) in traces.items():
        lines.append(f"  {name} tau={tau:g} (ground truth {truth} feasible)")
        lines.append(f"    {'method':<10} {'final samples':>13}  {header}")
        for method, points in by_method.items():
            final = points[-1][0]
            cells = " ".join(
                f"{trajectory_at(points, final * p / 100):>6d}" for p in range(10, 101, 10)
            )
            lines.append(f"    {LABELS[method]:<10} {final:>13,d}  {cells}")
    return lines


def save_plot(
    path: Path,
    traces: Mapping[tuple[str, float], Trace],
) -> str:
    """Write the samples-versus-feasible figure; a line saying where, or why it was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "Plot skipped: matplotlib is not installed (pip install 'compass-operator[plot]')."
    figure, axes = plt.subplots(1, len(traces), figsize=(6 * len(traces), 4.2), squeeze=False)
    for axis, ((name, tau), (truth, by_method)) in zip(axes[0], traces.items(), strict=True):
        workflow = WORKFLOWS[name]
        for method, points in by_method.items():
            xs = [p[0] for p in points]
            ys = [p[1] for p in points]
            axis.step(xs, ys, where="post", label=LABELS[method])
        axis.axhline(truth, color="grey", linestyle=":", label=f"ground truth ({truth})")
        axis.axvline(
            workflow.size * workflow.population,
            color="black",
            linestyle="--",
            lw=0.8,
            label="exhaustive",
        )
        axis.set_title(f"{name}, tau = {tau:g}, seed 0")
        axis.set_xlabel("sample evaluations")
        axis.set_ylabel("feasible configurations found")
        axis.legend(loc="lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return f"Plot written to {path}"


def paper_reference(data_dir: str) -> dict[float, tuple[float, float]]:
    """tau -> (recall, savings) of the reference COMPASS-V on the paper's own vision data."""
    path = Path(data_dir) / REFERENCE_FILE
    if not path.exists():
        return {}
    results = json.loads(path.read_text(encoding="utf-8"))["results"]
    return {float(r["slo"]): (float(r["recall"]), float(r["savings"])) for r in results}


def floor_lines(rows: Sequence[Row], reference_rows: Sequence[Row]) -> list[tuple[str, bool, str]]:
    """The issue's floors: recall and savings at the defaults, savings on the reference's schedule."""
    count = len(rows)
    min_mean = min(r.recall_mean for r in rows)
    worst = min(r.recall_worst for r in rows)
    savings = float(np.mean([r.savings for r in rows]))
    floors = [
        (
            f"(a) COMPASS-V mean recall >= {FLOOR_MEAN_RECALL} at every threshold",
            min_mean >= FLOOR_MEAN_RECALL,
            f"min {min_mean:.4f}",
        ),
        (
            f"(b) COMPASS-V no seed below recall {FLOOR_SEED_RECALL} anywhere",
            worst >= FLOOR_SEED_RECALL,
            f"worst {worst:.4f}",
        ),
        (
            f"(c) COMPASS-V mean savings over the {count} thresholds >= {FLOOR_SAVINGS:.0%}",
            savings >= FLOOR_SAVINGS,
            f"{savings:.1%}",
        ),
    ]
    if reference_rows:
        reference = float(np.mean([r.savings for r in reference_rows]))
        floors.append(
            (
                f"(d) COMPASS-V on the reference's schedule saves more than "
                f"{FLOOR_REFERENCE_SAVINGS:.1%}",
                reference > FLOOR_REFERENCE_SAVINGS,
                f"{reference:.1%}, min mean recall "
                f"{min(r.recall_mean for r in reference_rows):.4f}",
            )
        )
    return floors


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table, the floors and the wall time; always 0."""
    started = time.perf_counter()
    args = parse_args(argv)
    data_dir = str(args.data.resolve())
    names = [args.only] if args.only else list(WORKFLOWS)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(f"Data: {data_dir}")
    print("Replay ledger: compass.examples.build_replay_ledger, ledger seed = 1000 + search seed")
    print(f"Seeds: {seeds.start}..{seeds.stop - 1}, jobs: {args.jobs}, confidence: {CONFIDENCE}")
    schedules = {
        "rag": parse_budgets(args.budgets_rag, WORKFLOWS["rag"].population, "rag"),
        "vision": parse_budgets(args.budgets_vision, WORKFLOWS["vision"].population, "vision"),
    }
    jobs: list[Job] = []
    for name in names:
        workflow = WORKFLOWS[name]
        space, rows, _ = load_grid(data_dir, name)
        taus = selected_taus(workflow, args.taus, args.only is not None)
        budgets = {
            v.name: reference_budgets(workflow.population)
            if v.reference_schedule
            else schedules[name]
            for v in VARIANTS
        }
        looks = "; ".join(
            f"{v.name} {v.interval.value} "
            f"{describe_schedule(budgets[v.name], v.interval, workflow.population)}"
            for v in VARIANTS
        )
        print(
            f"{name}: {space.size} configurations (all {len(rows)} grid rows in the space), "
            f"N = {workflow.population}, exhaustive = {space.size * workflow.population:,} "
            f"samples; taus {' '.join(f'{t:g}' for t in taus)}"
        )
        print(f"  schedules: {looks}")
        plot_tau = workflow.plot_tau if workflow.plot_tau in taus else (taus[-1] if taus else None)
        for variant in VARIANTS:
            for tau in taus:
                for seed in seeds:
                    trace = variant is DEFAULTS and seed == seeds.start and tau == plot_tau
                    jobs.append(
                        Job(data_dir, name, tau, seed, variant, budgets[variant.name], trace)
                    )
    if not jobs:
        print("No thresholds selected: nothing to run.")
        return 0

    if args.jobs == 1:
        results = [run_job(job) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(run_job, jobs, chunksize=1))

    grouped: dict[tuple[str, float, str], list[JobResult]] = {}
    for result in results:
        key = (result.job.name, result.job.tau, result.job.variant.name)
        grouped.setdefault(key, []).append(result)
    thresholds = list(dict.fromkeys((name, tau) for name, tau, _ in grouped))
    paper = paper_reference(data_dir)

    print()
    full = f"{'recall':>6} {'worst':>5} {'prec':>5} {'configs':>7} {'samples':>8} {'savings':>7} {'looks':>5}"
    short = f"{'recall':>6} {'worst':>5} {'savings':>7}"
    wide, narrow = len(full) + 1, len(short) + 1
    print(
        f"{'':<19} | {'COMPASS-V, defaults':<{wide}}| {'grid, defaults':<{narrow}}| "
        f"{'COMPASS-V, reference':<{narrow}}| {'ref-wilson':<{narrow}}| paper's own"
    )
    print(
        f"{'workflow':<8} {'tau':>4} {'truth':>5} | {full} | {short} | {short} | {short} | {'recall':>6} {'savings':>7}"
    )
    by_variant: dict[tuple[str, SearchMethod], list[Row]] = {}
    for name, tau in thresholds:
        exhaustive = WORKFLOWS[name].size * WORKFLOWS[name].population
        cells = []
        truth = 0
        for variant in VARIANTS:
            group = grouped.get((name, tau, variant.name), [])
            truth = group[0].truth if group else truth
            for method in variant.methods:
                row = summarise(group, method, exhaustive)
                by_variant.setdefault((variant.name, method), []).append(row)
                if variant is DEFAULTS and method is SearchMethod.COMPASS_V:
                    precision = (
                        "    -" if math.isnan(row.precision_mean) else f"{row.precision_mean:5.3f}"
                    )
                    cells.append(
                        f"{row.recall_mean:6.3f} {row.recall_worst:5.3f} {precision} "
                        f"{row.configs_mean:7.1f} {row.samples_mean:8.0f} {row.savings:7.1%} "
                        f"{row.looks_per_config:5.1f}"
                    )
                else:
                    cells.append(
                        f"{row.recall_mean:6.3f} {row.recall_worst:5.3f} {row.savings:7.1%}"
                    )
        reference = paper.get(tau) if name == "vision" else None
        cells.append(
            f"{reference[0]:6.3f} {reference[1]:7.1%}" if reference else f"{'-':>6} {'-':>7}"
        )
        print(f"{name:<8} {tau:4g} {truth:>5} | " + " | ".join(cells))
    print(
        "(recall = mean over seeds, worst = lowest seed; recall is 1 when no configuration is "
        "feasible; prec '-' = nothing found; looks = evaluator calls per configuration evaluated;"
        " paper's own = the reference COMPASS-V's single run on the authors' data, vision only)"
    )

    print()
    for (variant_name, method), method_rows in by_variant.items():
        print(
            f"{LABELS[method] + ', ' + variant_name:<22}: mean savings over the "
            f"{len(method_rows)} thresholds {np.mean([r.savings for r in method_rows]):.1%}; "
            f"min mean recall {min(r.recall_mean for r in method_rows):.4f}; worst single-seed "
            f"recall {min(r.recall_worst for r in method_rows):.4f}"
        )
    papers = [paper[tau] for name, tau in thresholds if name == "vision" and tau in paper]
    if papers:
        print(
            f"{'paper reference, vision':<22}: mean savings over {len(papers)} thresholds "
            f"{np.mean([p[1] for p in papers]):.1%}; min recall {min(p[0] for p in papers):.4f} "
            "(one run each, on the authors' per-image scores)"
        )
    for text, passed, value in floor_lines(
        by_variant[(DEFAULTS.name, SearchMethod.COMPASS_V)],
        by_variant.get((REFERENCE.name, SearchMethod.COMPASS_V), []),
    ):
        print(f"FLOOR {'PASS' if passed else 'FAIL'}: {text} ({value})")

    traces: dict[tuple[str, float], Trace] = {}
    for result in results:
        if result.job.trace:
            traces[(result.job.name, result.job.tau)] = (
                result.truth,
                {m: r.trajectory for m, r in result.methods.items()},
            )
    if traces:
        for line in ascii_trajectories(traces):
            print(line)
        print(save_plot(args.plot, traces))
    print(f"Wall time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
