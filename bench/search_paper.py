"""Replay the paper's two grids: COMPASS-V versus the grid baseline, recall and sample savings.

Run as ``python bench/search_paper.py [--seeds 10] [--jobs 2] [--plot PATH] [--only rag|vision]``.
Every grid row's recorded accuracy is replayed as per-sample scores whose full mean equals it
(``compass.examples.build_replay_ledger``), so ground truth is exact: a configuration is
feasible when its recorded accuracy is >= tau. The script always exits 0; the floors are printed
as PASS/FAIL lines.
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
FLOOR_SAVINGS = 0.45
METHODS = (SearchMethod.COMPASS_V, SearchMethod.GRID)
LABELS = {SearchMethod.COMPASS_V: "COMPASS-V", SearchMethod.GRID: "grid"}


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
    budgets: str


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
        budgets="10,15,20,30,40,50,60,70,85,100",
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
        budgets="10,15,20,30,40,50,70,100,120,140,160,180,200",
    ),
}


class ReplayEvaluator:
    """In-memory evaluator: each configuration's replayed per-sample scores."""

    def __init__(self, table: Mapping[str, npt.NDArray[np.float64]]) -> None:
        self.table = table

    def evaluate(self, config: Config, sample_indices: Sequence[int]) -> list[float]:
        """Scores of this configuration at these sample indices."""
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
    """One (grid, tau, seed) replay, both methods."""

    data_dir: str
    name: str
    tau: float
    seed: int
    budgets: tuple[int, ...]
    trace: bool


@dataclass
class MethodResult:
    """One method's outcome on one job."""

    found: int
    hits: int
    configs: int
    samples: int
    trajectory: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class JobResult:
    """Both methods' outcomes on one job."""

    job: Job
    truth: int
    methods: dict[SearchMethod, MethodResult]


def run_job(job: Job) -> JobResult:
    """Replay one threshold and seed with COMPASS-V and the grid baseline."""
    space, _, accuracy = load_grid(job.data_dir, job.name)
    truth = {i for i, a in enumerate(accuracy) if a >= job.tau - TOLERANCE}
    evaluator = ReplayEvaluator(replay_table(job.data_dir, job.name, 1000 + job.seed))
    results: dict[SearchMethod, MethodResult] = {}
    for method in METHODS:
        trajectory: list[tuple[int, int]] = [(0, 0)]

        def record(progress: Progress, points: list[tuple[int, int]] = trajectory) -> None:
            points.append((progress.sample_evals, progress.feasible))

        settings = SearchSettings(
            tau=job.tau,
            budgets=job.budgets,
            confidence=CONFIDENCE,
            seed=job.seed,
            method=method,
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
    )


def parse_budgets(text: str, population: int, name: str) -> tuple[int, ...]:
    """A comma-separated schedule, checked against the dataset size."""
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
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="compass-paper data dir")
    parser.add_argument("--only", choices=sorted(WORKFLOWS), help="replay one workflow only")
    parser.add_argument(
        "--taus", help="comma-separated thresholds to run (default: the paper's for each grid)"
    )
    parser.add_argument(
        "--plot", type=Path, default=REPO_ROOT / "bench" / "out" / "search_paper.png"
    )
    parser.add_argument("--budgets-rag", default=WORKFLOWS["rag"].budgets)
    parser.add_argument("--budgets-vision", default=WORKFLOWS["vision"].budgets)
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be >= 1")
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
        return "Plot skipped: matplotlib is not installed (pip install 'compass-operator[bench]')."
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table, the floors and the wall time; always 0."""
    started = time.perf_counter()
    args = parse_args(argv)
    data_dir = str(args.data.resolve())
    names = [args.only] if args.only else list(WORKFLOWS)
    print(f"Data: {data_dir}")
    print("Replay ledger: compass.examples.build_replay_ledger, ledger seed = 1000 + search seed")
    print(f"Seeds: {args.seeds}, jobs: {args.jobs}, confidence: {CONFIDENCE}")
    schedules = {
        "rag": parse_budgets(args.budgets_rag, WORKFLOWS["rag"].population, "rag"),
        "vision": parse_budgets(args.budgets_vision, WORKFLOWS["vision"].population, "vision"),
    }
    jobs: list[Job] = []
    for name in names:
        workflow = WORKFLOWS[name]
        space, rows, _ = load_grid(data_dir, name)
        taus = selected_taus(workflow, args.taus, args.only is not None)
        print(
            f"{name}: {space.size} configurations (all {len(rows)} grid rows in the space), "
            f"N = {workflow.population}, exhaustive = {space.size * workflow.population:,} "
            f"samples; budgets {','.join(map(str, schedules[name]))}; "
            f"taus {' '.join(f'{t:g}' for t in taus)}"
        )
        plot_tau = workflow.plot_tau if workflow.plot_tau in taus else (taus[-1] if taus else None)
        for tau in taus:
            for seed in range(args.seeds):
                jobs.append(
                    Job(data_dir, name, tau, seed, schedules[name], seed == 0 and tau == plot_tau)
                )
    if not jobs:
        print("No thresholds selected: nothing to run.")
        return 0

    if args.jobs == 1:
        results = [run_job(job) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(run_job, jobs, chunksize=1))

    grouped: dict[tuple[str, float], list[JobResult]] = {}
    for result in results:
        grouped.setdefault((result.job.name, result.job.tau), []).append(result)

    print()
    cols = f"{'recall':>6} {'worst':>5} {'prec':>5} {'configs':>7} {'samples':>8} {'savings':>7}"
    print(f"{'':<20}| {'COMPASS-V':<44}| {'grid'}")
    print(f"{'workflow':<8} {'tau':>4} {'truth':>5} | {cols} | {cols}")
    rows_by_method: dict[SearchMethod, list[Row]] = {m: [] for m in METHODS}
    for (name, tau), group in grouped.items():
        workflow = WORKFLOWS[name]
        exhaustive = workflow.size * workflow.population
        cells = []
        for method in METHODS:
            row = summarise(group, method, exhaustive)
            rows_by_method[method].append(row)
            precision = "    -" if math.isnan(row.precision_mean) else f"{row.precision_mean:5.3f}"
            cells.append(
                f"{row.recall_mean:6.3f} {row.recall_worst:5.3f} {precision} "
                f"{row.configs_mean:7.1f} {row.samples_mean:8.0f} {row.savings:7.1%}"
            )
        print(f"{name:<8} {tau:4g} {group[0].truth:>5} | {cells[0]} | {cells[1]}")
    print(
        "(recall = mean over seeds, worst = lowest seed; recall is 1 when no configuration is "
        "feasible; prec '-' = nothing found)"
    )

    count = len(grouped)
    print()
    for method in METHODS:
        method_rows = rows_by_method[method]
        print(
            f"{LABELS[method]:<9}: mean savings over the {count} thresholds "
            f"{np.mean([r.savings for r in method_rows]):.1%}; min mean recall "
            f"{min(r.recall_mean for r in method_rows):.4f}; worst single-seed recall "
            f"{min(r.recall_worst for r in method_rows):.4f}"
        )
    compass_rows = rows_by_method[SearchMethod.COMPASS_V]
    min_mean = min(r.recall_mean for r in compass_rows)
    worst = min(r.recall_worst for r in compass_rows)
    savings = float(np.mean([r.savings for r in compass_rows]))
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
    for text, passed, value in floors:
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
